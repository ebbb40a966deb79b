//! Loading the object, its programs, and attaching them to a cgroup.
use std::{
    os::fd::AsFd as _,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::ProgramArray,
    programs::{CgroupSockAddr, CgroupSockopt, ProgramError, SkLookup, SockOps},
};
use interceptor_common::{NetnsCookie, PodSlot, names};
use serde::{Deserialize, Serialize};

use interceptor_sys::bpf_attach_type;

use super::{
    EbpfError, LoadOptions, OBJECT,
    kernel_log::{self, KernelLog},
    links::{self, LinkProblem, PinError, PinnedLink, Target},
    maps::PodMaps,
    pod_lookup::PodLookupLoader,
};

/// One loaded program, as `status` reports it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProgramState {
    pub name: String,
    pub id: u32,
    pub attach_type: String,
}

/// The node-wide programs. The sk_lookup one is attached to no hook: each pod's own program
/// tail-calls it (see `pod_lookup`).
const PROGRAMS: [(&str, &str); 7] = [
    (names::PROG_CONNECT4, "cgroup/connect4"),
    (names::PROG_CONNECT6, "cgroup/connect6"),
    (names::PROG_SOCKOPS, "sock_ops"),
    (names::PROG_GETSOCKOPT, "cgroup/getsockopt"),
    (names::PROG_PEERNAME4, "cgroup/getpeername4"),
    (names::PROG_PEERNAME6, "cgroup/getpeername6"),
    (names::PROG_SK_LOOKUP, "sk_lookup, tail-called"),
];

/// The node's links: each program and the cgroup hook it attaches to.
const CGROUP_LINKS: [(&str, bpf_attach_type); 6] = [
    (
        names::PROG_CONNECT4,
        bpf_attach_type::BPF_CGROUP_INET4_CONNECT,
    ),
    (
        names::PROG_CONNECT6,
        bpf_attach_type::BPF_CGROUP_INET6_CONNECT,
    ),
    (names::PROG_SOCKOPS, bpf_attach_type::BPF_CGROUP_SOCK_OPS),
    (
        names::PROG_GETSOCKOPT,
        bpf_attach_type::BPF_CGROUP_GETSOCKOPT,
    ),
    (
        names::PROG_PEERNAME4,
        bpf_attach_type::BPF_CGROUP_INET4_GETPEERNAME,
    ),
    (
        names::PROG_PEERNAME6,
        bpf_attach_type::BPF_CGROUP_INET6_GETPEERNAME,
    ),
];

/// Where the node's link for `program` is pinned.
fn link_path(links_dir: &Path, program: &str) -> PathBuf {
    links_dir.join(format!("link_{program}"))
}

pub(super) struct Attached {
    links_dir: PathBuf,
    /// Dropped first, detaching them, unless they are persistent.
    links: Vec<PinnedLink>,
    persistent: bool,
    // Dropping `Ebpf` unloads the programs (those still in a link stay until it goes).
    ebpf: Ebpf,
    /// Reads the programs' log, when it was asked for.
    _kernel_log: Option<KernelLog>,
}

impl Attached {
    pub(super) fn load(options: &LoadOptions) -> Result<(Self, PodMaps), EbpfError> {
        check_pinned_maps(&options.pin_dir)?;
        let log_wanted = kernel_log::wanted();
        let mut loader = loader(&options.pin_dir);
        kernel_log::set_level(&mut loader, log_wanted);
        let mut ebpf = loader
            .map_max_entries(names::MAP_CONNECTING, options.orig_dst_capacity)
            .map_max_entries(names::MAP_PENDING, options.orig_dst_capacity)
            .load(OBJECT)?;
        let kernel_log = log_wanted.then(|| KernelLog::start(&mut ebpf)).flatten();
        let program_error = |name| move |source| EbpfError::Program { name, source };

        for name in [
            names::PROG_CONNECT4,
            names::PROG_CONNECT6,
            names::PROG_PEERNAME4,
            names::PROG_PEERNAME6,
        ] {
            let connect: &mut CgroupSockAddr = program(&mut ebpf, name)?;
            connect.load().map_err(program_error(name))?;
        }
        let sockops: &mut SockOps = program(&mut ebpf, names::PROG_SOCKOPS)?;
        sockops.load().map_err(program_error(names::PROG_SOCKOPS))?;
        let getsockopt: &mut CgroupSockopt = program(&mut ebpf, names::PROG_GETSOCKOPT)?;
        getsockopt
            .load()
            .map_err(program_error(names::PROG_GETSOCKOPT))?;
        // Loaded and verified once, for every pod; swapping it in replaces it for all pods at
        // once (a restarted or upgraded agent).
        let sk_lookup: &mut SkLookup = program(&mut ebpf, names::PROG_SK_LOOKUP)?;
        sk_lookup
            .load()
            .map_err(program_error(names::PROG_SK_LOOKUP))?;
        let sk_lookup_fd = sk_lookup
            .fd()
            .map_err(program_error(names::PROG_SK_LOOKUP))?
            .try_clone()
            .map_err(|e| program_error(names::PROG_SK_LOOKUP)(ProgramError::IOError(e)))?;
        let map_error = |source| EbpfError::Map {
            map: names::MAP_SK_LOOKUP_PROG,
            source,
        };
        let mut sk_lookup_prog = ProgramArray::try_from(
            ebpf.map_mut(names::MAP_SK_LOOKUP_PROG)
                .ok_or(EbpfError::Missing {
                    kind: "map",
                    name: names::MAP_SK_LOOKUP_PROG,
                })?,
        )
        .map_err(map_error)?;
        sk_lookup_prog.set(0, &sk_lookup_fd, 0).map_err(map_error)?;

        let maps = PodMaps::take(&mut ebpf)?;
        Ok((
            Self {
                links_dir: options.links_dir.clone(),
                links: Vec::new(),
                persistent: options.persistent,
                ebpf,
                _kernel_log: kernel_log,
            },
            maps,
        ))
    }

    /// Attaches every program to the cgroup with a pinned link: the one attach path of `run`,
    /// the agent and the tests. Link-based attachments coexist with other programs on the same
    /// hook (tested with a foreign program attached before and after).
    pub(super) fn attach(&mut self, cgroup_path: &Path) -> Result<(), EbpfError> {
        let cgroup = crate::cgroup::open_cgroup2(cgroup_path)?;
        let attach_error = |name| {
            let cgroup = PathBuf::from(cgroup_path);
            move |source| EbpfError::Attach {
                name,
                cgroup,
                source,
            }
        };
        for (name, attach_type) in CGROUP_LINKS {
            let program = self.ebpf.program(name).ok_or(EbpfError::Missing {
                kind: "program",
                name,
            })?;
            let fd = program.fd().map_err(attach_error(name))?;
            let path = link_path(&self.links_dir, name);
            let link = if self.persistent {
                let target = Target::cgroup(cgroup.as_fd(), cgroup_path)
                    .map_err(|e| attach_error(name)(ProgramError::IOError(e)))?;
                PinnedLink::attach_or_update(fd.as_fd(), target, attach_type, &path)?
            } else {
                PinnedLink::attach(fd.as_fd(), cgroup.as_fd(), attach_type, &path)
                    .map_err(|e| attach_error(name)(ProgramError::IOError(e)))?
            };
            self.links.push(link);
        }
        Ok(())
    }

    /// What is wrong with the node's pinned links for `cgroup_path`: missing, defunct, attached
    /// to another cgroup, or running another program than this node's. Changes nothing.
    pub(super) fn link_problems(&self, cgroup_path: &Path) -> Vec<LinkProblem> {
        let cgroup = match crate::cgroup::open_cgroup2(cgroup_path) {
            Ok(cgroup) => cgroup,
            Err(e) => {
                return vec![LinkProblem::Unreadable {
                    path: cgroup_path.to_owned(),
                    error: e.to_string(),
                }];
            }
        };
        let target = match Target::cgroup(cgroup.as_fd(), cgroup_path) {
            Ok(target) => target,
            Err(e) => {
                return vec![LinkProblem::Unreadable {
                    path: cgroup_path.to_owned(),
                    error: e.to_string(),
                }];
            }
        };
        CGROUP_LINKS
            .iter()
            .filter_map(|&(name, attach_type)| {
                let path = link_path(&self.links_dir, name);
                let program_id = self.ebpf.program(name)?.info().ok()?.id();
                links::check(&path, attach_type, target.id, program_id)
            })
            .collect()
    }

    /// The node's links whose pins were removed while this process held them.
    pub(super) fn links(&self) -> &[PinnedLink] {
        &self.links
    }

    pub(super) fn programs(&self) -> Vec<ProgramState> {
        PROGRAMS
            .iter()
            .filter_map(|(name, attach_type)| {
                let info = self.ebpf.program(name)?.info().ok()?;
                Some(ProgramState {
                    name: (*name).to_owned(),
                    id: info.id(),
                    attach_type: (*attach_type).to_owned(),
                })
            })
            .collect()
    }
}

/// A loader that creates the shared maps pinned in `pin_dir`, or opens them there when they
/// already exist (so every process of the node, and `status`, uses the same maps).
pub(super) fn loader(pin_dir: &Path) -> EbpfLoader<'static> {
    let mut loader = EbpfLoader::new();
    for name in names::SHARED_MAPS {
        loader.map_pin_path(name, pin_dir.join(name));
    }
    loader
}

/// Loads (and so verifies) every program without attaching anything: the `auto` mode's probe of
/// whether this kernel and these privileges support all of them.
pub(super) fn probe(pin_dir: &Path) -> Result<(), EbpfError> {
    let (attached, maps) = Attached::load(&LoadOptions {
        orig_dst_capacity: 1,
        pin_dir: pin_dir.to_owned(),
        links_dir: pin_dir.to_owned(),
        persistent: false,
        max_pods: interceptor_common::MAX_PODS,
    })?;
    let pod_lookup = PodLookupLoader::new(pin_dir)
        .and_then(|loader| loader.load(NetnsCookie(0), PodSlot(0)))
        .map_err(EbpfError::PodLookup)?;
    drop((pod_lookup, maps, attached));
    Ok(())
}

/// Refuses maps pinned in `pin_dir` that are not the maps the object declares (another type,
/// key size or value size): aya would use whatever is pinned at a map's path. Kernel >= 4.13.
fn check_pinned_maps(pin_dir: &Path) -> Result<(), EbpfError> {
    let mut declared = None;
    for name in names::SHARED_MAPS {
        let path = pin_dir.join(name);
        let Some(fd) = interceptor_sys::obj_get(&path).map_err(|source| PinError::Io {
            call: "opening the pin",
            path: path.clone(),
            source,
        })?
        else {
            continue;
        };
        let object = match &declared {
            Some(object) => object,
            None => declared.insert(
                aya_obj::Object::parse(OBJECT)
                    .map_err(|e| EbpfError::Load(aya::EbpfError::ParseError(e)))?,
            ),
        };
        let map = object
            .maps
            .get(name)
            .ok_or(EbpfError::Missing { kind: "map", name })?;
        let expected = format!(
            "map {name}: a map of type {} with {}-byte keys and {}-byte values",
            map.map_type(),
            map.key_size(),
            map.value_size()
        );
        let not_ours = |found: String| PinError::NotOurs {
            path: path.clone(),
            found,
            expected: expected.clone(),
        };
        let kind = interceptor_sys::object_kind(fd.as_fd()).map_err(|source| PinError::Io {
            call: "reading the kind of",
            path: path.clone(),
            source,
        })?;
        if kind != interceptor_sys::ObjectKind::Map {
            return Err(not_ours(kind.to_string()).into());
        }
        let info = interceptor_sys::map_info(fd.as_fd()).map_err(|source| PinError::Io {
            call: "reading the map info of",
            path: path.clone(),
            source,
        })?;
        if (info.map_type, info.key_size, info.value_size)
            != (map.map_type(), map.key_size(), map.value_size())
        {
            return Err(not_ours(format!(
                "map {}: a map of type {} with {}-byte keys and {}-byte values",
                info.name, info.map_type, info.key_size, info.value_size
            ))
            .into());
        }
    }
    Ok(())
}

fn program<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut T, EbpfError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program>,
{
    ebpf.program_mut(name)
        .ok_or(EbpfError::Missing {
            kind: "program",
            name,
        })?
        .try_into()
        .map_err(|_| EbpfError::Missing {
            kind: "program of the expected type",
            name,
        })
}
