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
    features::{Feature, KernelFeatures},
    kernel_log::{self, KernelLog},
    links::{self, LinkProblem, PinError, PinnedLink, Target},
    maps::PodMaps,
    pod_lookup::PodLookupLoader,
    variants::{self, Chosen, Hook, Variant},
};

/// One loaded program, as `status` reports it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProgramState {
    pub name: String,
    pub id: u32,
    pub attach_type: String,
    /// Which of the hook's variants runs (`slots`, `ifindex`, `address`, ...; see `variants`). Absent in the
    /// state of an older run.
    #[serde(default)]
    pub variant: String,
    /// Why not a better one: what this kernel lacks. Empty for the hook's first choice.
    #[serde(default)]
    pub reason: String,
}

/// Where the node's link for `hook` is pinned.
fn link_path(links_dir: &Path, hook: Hook) -> PathBuf {
    links_dir.join(format!("link_{}", hook.link_name()))
}

pub(super) struct Attached {
    links_dir: PathBuf,
    /// Dropped first, detaching them, unless they are persistent.
    links: Vec<PinnedLink>,
    persistent: bool,
    // Dropping `Ebpf` unloads the programs (those still in a link stay until it goes).
    ebpf: Ebpf,
    /// The program loaded for each hook, in `Hook::ALL` order.
    chosen: Vec<(Hook, Variant, Chosen)>,
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
        let chosen = variants::choose(KernelFeatures::get()).map_err(EbpfError::Unsupported)?;
        variants::log(&chosen);
        let program_error = |name| move |source| EbpfError::Program { name, source };
        for (hook, variant, _) in &chosen {
            let name = variant.program;
            load_variant(&mut ebpf, *hook, name)?.map_err(program_error(name))?;
        }
        // Loaded and verified once, for every pod; swapping it in replaces it for all pods at
        // once (a restarted or upgraded agent).
        let sk_lookup_name = chosen
            .iter()
            .find(|(hook, _, _)| *hook == Hook::SkLookup)
            .map(|(_, variant, _)| variant.program)
            .expect("choose gives every hook a program");
        let sk_lookup: &mut SkLookup = program(&mut ebpf, sk_lookup_name)?;
        let sk_lookup_fd = sk_lookup
            .fd()
            .map_err(program_error(sk_lookup_name))?
            .try_clone()
            .map_err(|e| program_error(sk_lookup_name)(ProgramError::IOError(e)))?;
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
                chosen,
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
        let links: Vec<_> = self.cgroup_links().collect();
        for (hook, attach_type, name) in links {
            let program = self.ebpf.program(name).ok_or(EbpfError::Missing {
                kind: "program",
                name,
            })?;
            let fd = program.fd().map_err(attach_error(name))?;
            let path = link_path(&self.links_dir, hook);
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
        self.cgroup_links()
            .filter_map(|(hook, attach_type, name)| {
                let path = link_path(&self.links_dir, hook);
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
        self.chosen
            .iter()
            .filter_map(|(hook, variant, chosen)| {
                let info = self.ebpf.program(variant.program)?.info().ok()?;
                Some(ProgramState {
                    name: variant.program.to_owned(),
                    id: info.id(),
                    attach_type: hook.describe().to_owned(),
                    variant: chosen.variant.clone(),
                    reason: chosen.reason.clone(),
                })
            })
            .collect()
    }

    /// The cgroup hooks, their attach types and the programs loaded for them.
    fn cgroup_links(&self) -> impl Iterator<Item = (Hook, bpf_attach_type, &'static str)> + '_ {
        self.chosen
            .iter()
            .filter_map(|(hook, variant, _)| Some((*hook, hook.attach_type()?, variant.program)))
    }

    /// Whether each pod's own sk_lookup program may tell loopback by the interface.
    pub(super) fn loopback_by_ifindex(&self) -> bool {
        self.chosen
            .iter()
            .any(|(_, variant, _)| variant.needs.contains(&Feature::IngressIfindex))
    }
}

/// The programs an agent's pinned links under `links_dir` run, read from the kernel (the
/// program's name says its variant), with why that variant where this kernel explains it.
/// Hooks with no link pinned are left out.
pub fn pinned_programs(links_dir: &Path) -> Vec<ProgramState> {
    let now = variants::choose(KernelFeatures::get()).unwrap_or_default();
    variants::VARIANTS
        .iter()
        .filter_map(|variant| {
            let attach_type = variant.hook.attach_type()?;
            let link = interceptor_sys::obj_get(&link_path(links_dir, variant.hook)).ok()??;
            let link = interceptor_sys::link_info(link.as_fd()).ok()?;
            // Only a link on this variant's hook running this variant's program.
            if link.attach_type != attach_type as u32 {
                return None;
            }
            let prog = interceptor_sys::prog_fd_by_id(link.prog_id).ok()?;
            let info = interceptor_sys::prog_info(prog.as_fd()).ok()?;
            if info.name != variant.program {
                return None;
            }
            let reason = now
                .iter()
                .find(|(_, v, _)| v.program == variant.program)
                .map(|(_, _, chosen)| chosen.reason.clone())
                .unwrap_or_default();
            Some(ProgramState {
                name: info.name,
                id: info.id,
                attach_type: variant.hook.describe().to_owned(),
                variant: variant.name.to_owned(),
                reason,
            })
        })
        .collect()
}

/// A loader that creates the shared maps pinned in `pin_dir`, or opens them there when they
/// already exist (so every process of the node, and `status`, uses the same maps).
pub(super) fn loader(pin_dir: &Path) -> EbpfLoader<'static> {
    let mut loader = EbpfLoader::new();
    for name in names::SHARED_MAPS {
        loader.map_pin_path(name, pin_dir.join(name));
    }
    // Left UNSET where the kernel has no BTF: the `creator IDs` connect programs are then not
    // chosen (`Feature::SocketCreator`), and refused where every variant is loaded.
    if let Some(offsets) = super::creds::offsets() {
        loader.override_global(names::GLOBAL_CRED_OFFSETS, offsets, true);
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
    let pod_lookup = PodLookupLoader::new(pin_dir, attached.loopback_by_ifindex())
        .and_then(|loader| loader.load(NetnsCookie(0), PodSlot(0)))
        .map_err(EbpfError::PodLookup)?;
    drop((pod_lookup, maps, attached));
    Ok(())
}

/// Whether one program variant loads (verifies) on this kernel.
#[derive(Clone, Debug, Serialize)]
pub struct VariantLoad {
    pub hook: &'static str,
    pub program: &'static str,
    pub variant: &'static str,
    /// The verifier's (or the kernel's) reason, when it refused it: the last lines of its log.
    pub refused: Option<String>,
}

/// Loads every variant of every program, whatever this kernel's features, on throwaway maps in
/// `pin_dir`: what `interceptor kernel` and the kernel matrix report.
pub(super) fn load_every_variant(pin_dir: &Path) -> Result<Vec<VariantLoad>, EbpfError> {
    let mut ebpf = loader(pin_dir)
        .map_max_entries(names::MAP_CONNECTING, 1)
        .map_max_entries(names::MAP_PENDING, 1)
        .load(OBJECT)?;
    Ok(variants::VARIANTS
        .iter()
        .map(|variant| {
            let name = variant.program;
            let refused = match load_variant(&mut ebpf, variant.hook, name) {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(verifier_reason(&EbpfError::Program { name, source: e })),
                Err(e) => Some(e.to_string()),
            };
            VariantLoad {
                hook: variant.hook.describe(),
                program: name,
                variant: variant.name,
                refused,
            }
        })
        .collect())
}

/// Loads (and so verifies) the object's program `name`, as the program type of `hook`. The outer
/// error: the object has no such program; the inner one: the kernel refused it.
fn load_variant(
    ebpf: &mut Ebpf,
    hook: Hook,
    name: &'static str,
) -> Result<Result<(), ProgramError>, EbpfError> {
    Ok(match hook {
        Hook::Connect4 | Hook::Connect6 | Hook::PeerName4 | Hook::PeerName6 => {
            program::<CgroupSockAddr>(ebpf, name)?.load()
        }
        Hook::SockOps => program::<SockOps>(ebpf, name)?.load(),
        Hook::GetSockopt => program::<CgroupSockopt>(ebpf, name)?.load(),
        Hook::SkLookup => program::<SkLookup>(ebpf, name)?.load(),
    })
}

/// The end of a refusal's message, where the verifier says what it refused.
fn verifier_reason(error: &EbpfError) -> String {
    let text = format!("{error:#}");
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| {
            !l.is_empty() && !l.starts_with("processed ") && !l.starts_with("verification time")
        })
        .collect();
    lines[lines.len().saturating_sub(3)..].join(" | ")
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
