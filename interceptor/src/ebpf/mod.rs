//! The eBPF backend: one attachment per node (a cgroup v2 directory), pods as map entries keyed
//! by their network namespace cookie. Meshing one pod (`interceptor run`) and many (the node
//! agent) both go through the node's pod table with [`EbpfNode`] as its backend ([`EbpfPods`]).
use interceptor_common::NetnsCookie;
mod creds;
mod encode;
pub mod features;
mod inbound;
mod kernel_log;
mod links;
mod loader;
mod maps;
mod pod_lookup;
mod pod_table;
mod pods;
pub mod variants;

use std::path::{Path, PathBuf};

use aya::{maps::MapError, programs::ProgramError};
use interceptor_common::counters::{COUNTERS_PER_POD, Decision};
pub use links::{LinkProblem, PinError, remove_ours};
pub use loader::{ProgramState, VariantLoad, pinned_programs};
pub use pod_table::EbpfPods;
pub use pods::{EbpfWritten, FillLevels, InMaps, PodWriter, read_counters};

/// The object built from `interceptor-ebpf`, embedded at compile time.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/interceptor-ebpf"));

#[derive(Debug, thiserror::Error)]
pub enum EbpfError {
    #[error("loading the eBPF object: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("loading program {name} into the kernel (the verifier log follows):\n{source}")]
    Program {
        name: &'static str,
        source: ProgramError,
    },
    #[error("attaching {name} to cgroup {cgroup}: {source}")]
    Attach {
        name: &'static str,
        cgroup: PathBuf,
        source: ProgramError,
    },
    #[error(transparent)]
    Cgroup(#[from] crate::cgroup::CgroupError),
    #[error(
        "the eBPF object has no {kind} named {name}: the build is out of date (cargo clean -p interceptor)"
    )]
    Missing {
        kind: &'static str,
        name: &'static str,
    },
    #[error("map {map}: {source}{}", kernel_error(source))]
    Map { map: &'static str, source: MapError },
    #[error("all {0} pod slots are in use: remove a pod first (or raise --max-pods, up to 1024)")]
    NoFreeSlot(u32),
    #[error("creating the pin directory {path}: {source}")]
    PinDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("attaching {name} to network namespace {netns}: {source}")]
    AttachNetns {
        name: &'static str,
        netns: PathBuf,
        source: ProgramError,
    },
    #[error(transparent)]
    Netns(#[from] crate::netns::NetnsError),
    #[error(transparent)]
    Pin(#[from] links::PinError),
    #[error(
        "the eBPF programs cannot run on this kernel: {0}. Use --mode iptables (or auto, which falls back to it)"
    )]
    Unsupported(String),
    #[error("a pod's sk_lookup program: {0}")]
    PodLookup(std::io::Error),
    #[error("pod with netns cookie {0} is already registered")]
    AlreadyRegistered(NetnsCookie),
    #[error(
        "{table} table full: {capacity} {unit}, {free} free, and this change needs {needed} more (while a change is made, the old and new entries are both in force)",
        capacity = thousands(*capacity),
        free = thousands(*free),
        needed = thousands(*needed)
    )]
    TableFull {
        table: &'static str,
        unit: &'static str,
        capacity: usize,
        free: usize,
        needed: usize,
    },
    #[error("pod {netns} has {count} addresses, more than the {max} supported")]
    TooManyAddresses {
        netns: PathBuf,
        count: usize,
        max: u32,
    },
}

impl EbpfError {
    /// Whether the request asked for more than the maps can hold (nothing was changed).
    pub fn is_capacity(&self) -> bool {
        matches!(self, Self::TableFull { .. } | Self::TooManyAddresses { .. })
    }

    /// The kernel's error when it refused a map update for want of room (`E2BIG`, `ENOSPC`: the
    /// map is full) or of memory (`ENOMEM`): nothing of the pod was wrong, and the same write
    /// may pass later.
    pub fn map_out_of_room(&self) -> Option<i32> {
        let Self::Map {
            source: MapError::SyscallError(e),
            ..
        } = self
        else {
            return None;
        };
        e.io_error
            .raw_os_error()
            .filter(|errno| [libc::E2BIG, libc::ENOSPC, libc::ENOMEM].contains(errno))
    }
}

/// `: ` and the kernel's error, when a map's error is a failed system call: aya's message names
/// the call alone.
fn kernel_error(source: &MapError) -> String {
    match source {
        MapError::SyscallError(e) => format!(": {}", e.io_error),
        _ => String::new(),
    }
}

/// `16384` as `16,384`.
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Counters of one pod, summed over CPUs, in `Decision` order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counters(pub [u64; COUNTERS_PER_POD]);

impl Counters {
    pub fn get(&self, decision: Decision) -> u64 {
        self.0[decision as usize]
    }

    pub fn named(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        Decision::ALL.iter().map(|d| (d.name(), self.get(*d)))
    }
}

/// How to load the node's programs.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Capacity of the map of original destinations not yet read by the proxy.
    pub orig_dst_capacity: u32,
    /// Directory on a bpffs where the shared maps are pinned: each pod's sk_lookup program
    /// opens them there, and so does `interceptor status`. Removed when the node is dropped.
    pub pin_dir: PathBuf,
    /// Where the links are pinned: `pin_dir` unless the maps have a directory of their own (the
    /// agent keeps one per map layout, see `MAP_LAYOUT_VERSION`). Links are always pinned, so
    /// the programs stay attached if the process dies without detaching (fail closed);
    /// dropping the node detaches them unless `persistent`.
    pub links_dir: PathBuf,
    /// The node agent: links (pinned) and maps stay when the node is dropped, and attaching
    /// replaces the programs of links already pinned in `pin_dir` instead of adding links, so a
    /// restarted or upgraded agent takes over without a moment without interception.
    pub persistent: bool,
    /// Pods this node serves at most (up to `MAX_PODS`, the size of the counter array).
    pub max_pods: u32,
}

impl LoadOptions {
    pub fn new(pin_dir: impl Into<PathBuf>) -> Self {
        let pin_dir = pin_dir.into();
        Self {
            orig_dst_capacity: interceptor_common::DEFAULT_PENDING_ORIG_DST_CAPACITY,
            links_dir: pin_dir.clone(),
            pin_dir,
            persistent: false,
            max_pods: interceptor_common::MAX_PODS,
        }
    }
}

/// Whether the eBPF backend can work here: each hook has a program variant this kernel offers
/// what it needs (`variants`), which loads and verifies, the shared maps can be created and
/// pinned, and namespace cookies can be read (Linux 5.14). Nothing is attached.
pub fn probe() -> Result<(), String> {
    with_throwaway_pins("probe", |pin_dir| {
        loader::probe(pin_dir).map_err(|e| e.to_string())
    })
}

/// Loads every program variant on throwaway maps and says which the kernel refuses, and why.
pub fn load_every_variant() -> Result<Vec<VariantLoad>, String> {
    with_throwaway_pins("variants", |pin_dir| {
        loader::load_every_variant(pin_dir).map_err(|e| e.to_string())
    })
}

/// Runs `load` with a pin directory of this process's own on the machine's bpffs, and removes
/// whatever it pinned there afterwards.
fn with_throwaway_pins<T>(
    tag: &str,
    load: impl FnOnce(&Path) -> Result<T, String>,
) -> Result<T, String> {
    let bpffs = Path::new(crate::bpffs::BPFFS_ROOT);
    crate::bpffs::ensure_bpffs(bpffs).map_err(|e| e.to_string())?;
    let pin_dir = bpffs
        .join("interceptor-probe")
        .join(format!("{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&pin_dir)
        .map_err(|e| format!("creating {}: {e}", pin_dir.display()))?;
    let result = load(&pin_dir);
    crate::bpffs::remove_pins(&pin_dir);
    result
}

/// The programs loaded and attached once for a node, and what writes pods into their maps: the
/// eBPF backend of the node's pod table. Dropping it detaches everything (fields drop in
/// order: links first, then the maps' pins; the pods' own links went with the table's entries).
pub struct EbpfNode {
    attached: loader::Attached,
    /// Writes, reads back and removes the pods' entries in the shared maps.
    pod_writer: PodWriter,
}

impl EbpfNode {
    /// Loads the programs (verifying them) and creates the shared maps, pinned under
    /// `options.pin_dir`, without attaching anything.
    pub fn load(options: LoadOptions) -> Result<Self, EbpfError> {
        let fresh = !options.pin_dir.exists();
        std::fs::create_dir_all(&options.pin_dir).map_err(|source| EbpfError::PinDir {
            path: options.pin_dir.clone(),
            source,
        })?;
        let loaded = loader::Attached::load(&options).and_then(|(attached, maps)| {
            let pod_writer = PodWriter::new(maps, &options, attached.loopback_by_ifindex())?;
            Ok(Self {
                attached,
                pod_writer,
            })
        });
        // The maps are pinned as they are created, before a program the verifier refuses: a
        // process that pinned them for itself alone takes them away again, as dropping the
        // writer would have.
        if loaded.is_err() && fresh && !options.persistent {
            crate::bpffs::remove_pins(&options.pin_dir);
        }
        loaded
    }

    /// Attaches every program to `cgroup`. Kernel >= 5.7 (link-based cgroup attachment).
    pub fn attach(&mut self, cgroup: &Path) -> Result<(), EbpfError> {
        self.attached.attach(cgroup)
    }

    /// What is wrong with the node's pinned cgroup links, for `cgroup` (the configured one):
    /// a link missing, defunct, attached to another cgroup, or running another program than this
    /// node's. Reads only. Kernel >= 5.8.
    pub fn link_problems(&self, cgroup: &Path) -> Vec<LinkProblem> {
        self.attached.link_problems(cgroup)
    }

    pub fn programs(&self) -> Vec<ProgramState> {
        self.attached.programs()
    }

    /// The pods' entries in the maps, and the maps' fill levels.
    pub fn pod_writer(&self) -> &PodWriter {
        &self.pod_writer
    }

    pub fn pod_writer_mut(&mut self) -> &mut PodWriter {
        &mut self.pod_writer
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn thousands_are_separated() {
        assert_eq!(super::thousands(0), "0");
        assert_eq!(super::thousands(120), "120");
        assert_eq!(super::thousands(16384), "16,384");
        assert_eq!(super::thousands(1234567), "1,234,567");
    }
}
