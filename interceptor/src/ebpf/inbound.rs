//! Each pod's sk_lookup link: its own small program (`pod_lookup`) attached to the pod's network
//! namespace with a pinned link, checked before use as every pin is (`links`).
use interceptor_common::{NetnsCookie, PodSlot};
use std::{
    os::fd::AsFd as _,
    path::{Path, PathBuf},
};

use aya::programs::ProgramError;
use interceptor_common::names;
use interceptor_sys::bpf_attach_type;

use super::{
    EbpfError,
    links::{self, LinkProblem, PinnedLink, Target},
    pod_lookup::{PodLookupLoader, program_id},
};

/// One pod's sk_lookup program, attached to the pod's network namespace with a pinned link;
/// dropping it detaches it, unless the link is persistent. The link holds the program.
pub(super) struct Inbound {
    _link: PinnedLink,
    pub(super) program: super::ProgramState,
    /// The pod's namespace, as the kernel names a link's target.
    netns: links::TargetId,
}

impl Inbound {
    pub(super) fn link(&self) -> &PinnedLink {
        &self._link
    }

    /// What is wrong with the link pinned at `path` for this program: missing, defunct,
    /// attached to another namespace, or running another program. Changes nothing.
    pub(super) fn pin_problem(&self, path: &Path) -> Option<LinkProblem> {
        links::check(
            path,
            bpf_attach_type::BPF_SK_LOOKUP,
            self.netns,
            self.program.id,
        )
    }
}

/// Where a pod's sk_lookup link is pinned.
pub(super) fn inbound_link_path(links_dir: &Path, netns_cookie: NetnsCookie) -> PathBuf {
    links_dir.join(format!("link_{}_{netns_cookie}", names::PROG_SK_LOOKUP))
}

/// Loads one pod's sk_lookup program (its netns cookie and counter slot baked in) and attaches it to the pod's
/// network namespace with a link pinned in `links_dir`; a `persistent` one replaces the program
/// of a link already pinned there for the pod (the agent).
pub(super) fn load_inbound(
    loader: &PodLookupLoader,
    links_dir: &Path,
    persistent: bool,
    netns_cookie: NetnsCookie,
    slot: PodSlot,
    netns: &crate::netns::PodNetns,
) -> Result<Inbound, EbpfError> {
    let program = loader
        .load(netns_cookie, slot)
        .map_err(EbpfError::PodLookup)?;
    let attach_error = |source| EbpfError::AttachNetns {
        name: names::PROG_POD_LOOKUP,
        netns: netns.path().to_owned(),
        source: ProgramError::IOError(source),
    };
    let program_state = super::ProgramState {
        name: names::PROG_POD_LOOKUP.into(),
        id: program_id(program.as_fd()).map_err(attach_error)?,
        attach_type: "sk_lookup".into(),
        variant: loader.variant().into(),
        reason: String::new(),
    };
    let path = inbound_link_path(links_dir, netns_cookie);
    let attach_type = bpf_attach_type::BPF_SK_LOOKUP;
    let target = Target::netns(netns.file().as_fd(), netns.path()).map_err(attach_error)?;
    let target_id = target.id;
    let link = if persistent {
        PinnedLink::attach_or_update(program.as_fd(), target, attach_type, &path)?
    } else {
        PinnedLink::attach(program.as_fd(), netns.file().as_fd(), attach_type, &path)
            .map_err(attach_error)?
    };
    Ok(Inbound {
        _link: link,
        program: program_state,
        netns: target_id,
    })
}
