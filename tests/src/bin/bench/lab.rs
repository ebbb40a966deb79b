//! The bench's pods: one per (mode, ignored ports), each set up once for its mode and never
//! switched, so no mode inherits another's state (iptables leaves conntrack behind in a
//! namespace).
use std::{any::Any, collections::BTreeMap, path::PathBuf, process::Stdio};

use anyhow::Context as _;
use interceptor::{config::InterceptionConfig, iptables::IptablesMode};
use interceptor_tests::{
    Cgroup, PodFixture,
    agent_home::PROXY_FLAGS,
    iptables_backend::Iptables,
    meshed::{self, Meshed},
    probe::sibling_binary,
    scenario::Backend as _,
};

use super::load::{self, Case, MODES, Mode};

/// A mode's pod and what intercepts its connections.
pub struct ModePod {
    /// Detached before the pod is removed.
    pub interception: Interception,
    pub pod: PodFixture,
}

pub enum Interception {
    None,
    Ebpf(Meshed),
    Iptables {
        /// Only held: the chains are removed when it is dropped.
        _chains: Box<dyn Any>,
    },
}

/// The pods of one run, one per (mode, ignored ports), created when first needed and removed
/// when the run ends.
pub struct Lab {
    /// The release `interceptor` binary.
    pub interceptor: PathBuf,
    pub connload: PathBuf,
    /// Where inbound clients' sockets are made: a cgroup nothing is attached to.
    pub client_cgroup: Cgroup,
    pods: BTreeMap<(usize, usize), ModePod>,
}

impl Lab {
    pub fn new() -> Self {
        Self {
            interceptor: sibling_binary("interceptor"),
            connload: sibling_binary("connload"),
            client_cgroup: Cgroup::new("bench-clients"),
            pods: BTreeMap::new(),
        }
    }

    /// The key of a mode's pod: the limit ignores nothing whatever the case, one pod serves
    /// every case.
    fn key(mode: Mode, ignored_ports: usize) -> (usize, usize) {
        let index = MODES.iter().position(|&m| m == mode).expect("a mode");
        (
            index,
            if mode == Mode::Limit {
                0
            } else {
                ignored_ports
            },
        )
    }

    /// A pod [`Self::pod`] already created.
    pub fn existing_pod(&self, mode: Mode, ignored_ports: usize) -> &ModePod {
        &self.pods[&Self::key(mode, ignored_ports)]
    }

    pub fn pod(&mut self, mode: Mode, ignored_ports: usize) -> anyhow::Result<&ModePod> {
        let key = Self::key(mode, ignored_ports);
        if !self.pods.contains_key(&key) {
            let pod = self.create_pod(mode, key.1)?;
            self.pods.insert(key, pod);
        }
        Ok(&self.pods[&key])
    }

    fn create_pod(&self, mode: Mode, ignored_ports: usize) -> anyhow::Result<ModePod> {
        let slug = match mode {
            Mode::Limit => "limit",
            Mode::Ebpf => "ebpf",
            Mode::IptablesLegacy => "legacy",
            Mode::IptablesNft => "nft",
        };
        let pod = PodFixture::new(&format!("bench-{slug}-{ignored_ports}"));
        let mut flags: Vec<String> = PROXY_FLAGS.map(String::from).to_vec();
        flags.extend(ignore_flags(ignored_ports));
        let iptables = |mode| -> anyhow::Result<Interception> {
            let config = InterceptionConfig::from_proxy_init_args(&flags)
                .context("the bench's proxy flags")?;
            Ok(Interception::Iptables {
                _chains: Iptables(mode).attach(&pod, &config),
            })
        };
        let interception = match mode {
            Mode::Limit => Interception::None,
            Mode::Ebpf => {
                let instance = pod.pod.name.clone();
                let mut args = meshed::run_args(&pod, &instance);
                args.extend(["--mode", "ebpf", "--log-level", "warn"].map(String::from));
                args.extend(flags.iter().cloned());
                Interception::Ebpf(Meshed::start(
                    &self.interceptor,
                    &instance,
                    &args,
                    Stdio::inherit(),
                ))
            }
            Mode::IptablesLegacy => iptables(IptablesMode::Legacy)?,
            Mode::IptablesNft => iptables(IptablesMode::Nft)?,
        };
        Ok(ModePod { interception, pod })
    }

    pub fn measure(
        &mut self,
        case: &Case,
        mode: Mode,
        seconds: f64,
    ) -> anyhow::Result<load::Sample> {
        self.pod(mode, case.ignored_ports)?;
        let pod = &self.existing_pod(mode, case.ignored_ports).pod;
        load::measure(
            &self.connload,
            pod,
            &self.client_cgroup.path,
            case,
            mode,
            seconds,
        )
    }
}

/// `n` ports in both ignore lists: even ports from 10000, so none can merge into a range (one
/// iptables rule per 15 of them, as proxy-init writes).
fn ignore_flags(n: usize) -> Vec<String> {
    if n == 0 {
        return Vec::new();
    }
    let ports = (0..n)
        .map(|i| (10_000 + 2 * i).to_string())
        .collect::<Vec<_>>()
        .join(",");
    vec![
        "--outbound-ports-to-ignore".into(),
        ports.clone(),
        "--inbound-ports-to-ignore".into(),
        ports,
    ]
}
