//! The bench's pods: one per (mode, ignored ports), each set up once for its mode and never
//! switched, so no mode inherits another's state (iptables leaves conntrack behind in a
//! namespace).
use std::{
    any::Any,
    collections::BTreeMap,
    net::{Ipv6Addr, SocketAddr},
    path::PathBuf,
    process::Stdio,
};

use anyhow::Context as _;
use interceptor::{
    config::InterceptionConfig, ebpf::features::FEATURES_ENV, iptables::IptablesMode,
    netns::PodNetns,
};
use interceptor_tests::{
    Cgroup, PodFixture,
    agent_home::PROXY_FLAGS,
    iptables_backend::Iptables,
    meshed::{self, Meshed},
    probe::sibling_binary,
    scenario::Backend as _,
};
use socket2::{Domain, Protocol, Socket, Type};

use super::{
    idle_hooks::{IdleHooks, Watch},
    load::{self, Case, Mode, Without},
};

/// A mode's pod and what intercepts its connections.
pub struct ModePod {
    /// Detached before the pod is removed.
    pub interception: Interception,
    /// Only held: the pod's app port, bound (see [`bind_app_port`]); closed before the pod is
    /// removed.
    _app_port: Socket,
    pub pod: PodFixture,
    /// With eBPF, the variants the loader chose where a hook has several (see [`variants`]).
    pub variants: Option<String>,
}

pub enum Interception {
    None,
    /// Only held: the programs are detached when it is dropped.
    IdleHooks(#[allow(dead_code, reason = "held for its Drop")] IdleHooks),
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
    pods: BTreeMap<(Mode, usize), ModePod>,
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

    /// The key of a mode's pod: the limit and the floor ignore nothing whatever the case, one
    /// pod each serves every case.
    fn key(mode: Mode, ignored_ports: usize) -> (Mode, usize) {
        (mode, if mode.redirects() { ignored_ports } else { 0 })
    }

    /// A pod [`Self::pod`] already created.
    pub fn existing_pod(&self, mode: Mode, ignored_ports: usize) -> &ModePod {
        &self.pods[&Self::key(mode, ignored_ports)]
    }

    /// The variants mode's pod (without ignored ports) runs, if it was created and is eBPF.
    pub fn variants(&self, mode: Mode) -> Option<&str> {
        self.pods.get(&Self::key(mode, 0))?.variants.as_deref()
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
            Mode::IdleHooks(Watch::Nothing) => "idle",
            Mode::IdleHooks(Watch::Close) => "idle-watch",
            Mode::Ebpf => "ebpf",
            Mode::EbpfWithout(Without::IngressIfindex) => "ebpf-noifindex",
            Mode::EbpfWithout(Without::SocketCreator) => "ebpf-taskids",
            Mode::IptablesLegacy => "legacy",
            Mode::IptablesNft => "nft",
        };
        let pod = PodFixture::new(&format!("bench-{slug}-{ignored_ports}"));
        let app_port = bind_app_port(&pod)?;
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
            Mode::IdleHooks(watch) => Interception::IdleHooks(IdleHooks::attach(&pod, watch)?),
            Mode::Ebpf | Mode::EbpfWithout(_) => {
                let instance = pod.pod.name.clone();
                let mut args = meshed::run_args(&pod, &instance);
                args.extend(["--mode", "ebpf", "--log-level", "warn"].map(String::from));
                args.extend(flags.iter().cloned());
                let env: &[(&str, &str)] = match mode {
                    Mode::EbpfWithout(without) => &[(FEATURES_ENV, without.features_taken_away())],
                    _ => &[],
                };
                Interception::Ebpf(Meshed::start_with_env(
                    &self.interceptor,
                    &instance,
                    &args,
                    env,
                    Stdio::inherit(),
                ))
            }
            Mode::IptablesLegacy => iptables(IptablesMode::Legacy)?,
            Mode::IptablesNft => iptables(IptablesMode::Nft)?,
        };
        let variants = match &interception {
            Interception::Ebpf(meshed) => Some(variants(&meshed.status())),
            _ => None,
        };
        Ok(ModePod {
            interception,
            _app_port: app_port,
            pod,
            variants,
        })
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

/// Binds the port inbound clients connect to, [`load::APP_PORT`], on every address of the
/// pod, as the app a meshed pod runs has it bound: the kernel keeps one bind bucket per port
/// and namespace, which a connection steered from that port to the proxy's listener joins.
/// With the port unbound, sk_lookup's steering made and freed a bucket for each connection
/// (`__inet_inherit_port`), a cost no pod serving the port has. The socket does not listen,
/// so a connection that steering missed is still refused, never answered.
fn bind_app_port(pod: &PodFixture) -> anyhow::Result<Socket> {
    let netns = PodNetns::open(&pod.pod.path())?;
    let bound = netns.run_inside(|| {
        Ok((|| {
            let socket = Socket::new(Domain::IPV6, Type::STREAM, Some(Protocol::TCP))?;
            socket.set_only_v6(false)?;
            let any = SocketAddr::from((Ipv6Addr::UNSPECIFIED, load::APP_PORT));
            socket.bind(&any.into())?;
            Ok::<_, std::io::Error>(socket)
        })())
    })?;
    bound.with_context(|| format!("binding port {} in {}", load::APP_PORT, pod.pod.name))
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

/// The variants an `interceptor run` chose, from its `status --json` report, e.g.
/// `connect4, connect6, sock_ops: slots; sk_lookup: ifindex` (hooks with one program left out).
fn variants(status: &serde_json::Value) -> String {
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for program in status["programs"].as_array().into_iter().flatten() {
        let variant = program["variant"].as_str().unwrap_or_default();
        if variant.is_empty() || variant == "main" {
            continue;
        }
        let hook = program["attach_type"].as_str().unwrap_or("?");
        let hook = hook.strip_prefix("cgroup/").unwrap_or(hook);
        let hook = hook.split(',').next().unwrap_or(hook).to_owned();
        match groups.iter_mut().find(|(v, _)| v == variant) {
            Some((_, hooks)) => hooks.push(hook),
            None => groups.push((variant.to_owned(), vec![hook])),
        }
    }
    groups
        .iter()
        .map(|(variant, hooks)| format!("{}: {variant}", hooks.join(", ")))
        .collect::<Vec<_>>()
        .join("; ")
}
