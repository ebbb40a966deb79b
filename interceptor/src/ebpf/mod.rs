//! The eBPF backend: one attachment per node (a cgroup v2 directory), pods as map entries keyed
//! by their network namespace cookie. Meshing one pod (`interceptor run`) and many (the node
//! agent) both go through [`EbpfNode`].
mod loader;
mod pods;

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use aya::{maps::MapError, programs::ProgramError};
use interceptor_common::counters::{COUNTERS_PER_POD, Decision};
pub use loader::{ProgramState, ebpf_object};
pub use pods::{PodRegistry, read_counters};

use crate::config::InterceptionConfig;

/// The object built from `interceptor-ebpf`, embedded at compile time.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/interceptor-ebpf"));

#[derive(Debug, thiserror::Error)]
pub enum EbpfError {
    #[error("loading the eBPF object: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("loading program {name} into the kernel (the verifier log follows):\n{source}")]
    Program { name: &'static str, source: ProgramError },
    #[error("attaching {name} to cgroup {cgroup}: {source}")]
    Attach { name: &'static str, cgroup: PathBuf, source: ProgramError },
    #[error(transparent)]
    Cgroup(#[from] crate::cgroup::CgroupError),
    #[error("the eBPF object has no {kind} named {name}: the build is out of date (cargo clean -p interceptor)")]
    Missing { kind: &'static str, name: &'static str },
    #[error("map {map}: {source}")]
    Map { map: &'static str, source: MapError },
    #[error("pinning map {map} at {path}: {source}")]
    Pin { map: &'static str, path: PathBuf, source: aya::pin::PinError },
    #[error("all {0} pod slots are in use: remove a pod first")]
    NoFreeSlot(u32),
    #[error("pod with netns cookie {0} is already registered")]
    AlreadyRegistered(u64),
    #[error("pod {netns} has {count} IPv4 addresses, more than the {max} supported")]
    TooManyAddresses { netns: PathBuf, count: usize, max: u32 },
}

/// What registering a pod needs: its identity, its addresses and its configuration.
#[derive(Clone, Debug)]
pub struct PodSpec {
    pub netns_path: PathBuf,
    pub netns_cookie: u64,
    pub addresses: Vec<Ipv4Addr>,
    pub config: InterceptionConfig,
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

/// Loader options that change the object before it is loaded.
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    /// Capacity of the map of original destinations not yet read by the proxy.
    pub orig_dst_capacity: u32,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self { orig_dst_capacity: interceptor_common::DEFAULT_PENDING_ORIG_DST_CAPACITY }
    }
}

/// The programs loaded and attached once for a node, and the pods they serve.
pub struct EbpfNode {
    attached: loader::Attached,
    pods: PodRegistry,
}

impl EbpfNode {
    /// Loads the programs (verifying them) without attaching anything.
    pub fn load(options: LoadOptions) -> Result<Self, EbpfError> {
        let (attached, maps) = loader::Attached::load(options)?;
        Ok(Self { attached, pods: PodRegistry::new(maps) })
    }

    /// Attaches every program to `cgroup`. Kernel >= 5.7 (link-based cgroup attachment).
    pub fn attach(&mut self, cgroup: &Path) -> Result<(), EbpfError> {
        self.attached.attach(cgroup)
    }

    pub fn programs(&self) -> Vec<ProgramState> {
        self.attached.programs()
    }

    pub fn pods(&mut self) -> &mut PodRegistry {
        &mut self.pods
    }

    /// Pins the maps `interceptor status` reads under `dir` (on a bpffs).
    pub fn pin_maps(&self, dir: &Path) -> Result<(), EbpfError> {
        self.pods.pin(dir)
    }
}
