//! The command line's shape: its commands and flags. proxy-init's flags, for a pod's
//! configuration, are the `interceptor-config` crate's table and value parser, as for every
//! other reader of them. Running the commands is `commands`' job.
use std::path::PathBuf;

use clap::{Arg, ArgAction, ArgMatches, Args, FromArgMatches, Parser, Subcommand, ValueEnum};

use crate::config::{ConfigError, FLAGS, Flag, InterceptionConfig, Setting, flags};
use crate::{iptables::IptablesMode, kubernetes::DaemonSetRef, logging::LogFormat};

#[derive(Debug, Parser)]
#[command(
    name = "interceptor",
    version,
    about = "eBPF traffic interception for service-mesh proxies"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,

    /// Log output format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Plain)]
    pub log_format: LogFormat,

    /// Log level or tracing filter (e.g. `debug`, `interceptor=trace`). The eBPF programs' own
    /// log lines, for rare failures, are written only when it enables `interceptor::ebpf` at
    /// `debug` (e.g. `info,interceptor::ebpf=debug`).
    #[arg(long, global = true, default_value = "info")]
    pub log_level: String,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Mesh one pod. eBPF: attach and stay in the foreground until SIGINT/SIGTERM, then detach;
    /// iptables: write proxy-init's chains and exit.
    Run(RunArgs),
    /// Show what is attached, which pods are served, and their decision counters.
    Status(StatusArgs),
    /// Remove the iptables chains and jumps `run --mode iptables` added, and nothing else.
    IptablesCleanup(IptablesCleanupArgs),
    /// The node agent: attach the programs once for the node (pinned, surviving the agent), and
    /// serve the pod API on a Unix socket until SIGINT/SIGTERM; interception stays in force.
    Daemon(DaemonArgs),
    /// Register, remove and show pods through the running agent.
    Pod(PodArgs),
    /// Detach and remove everything the agent pinned (stop the agent first), and nothing else.
    Uninstall(AgentLocationArgs),
    /// Check from inside a pod that its outbound traffic is redirected (exit 0), or not (95).
    Validate(ValidateArgs),
    /// Install or remove the CNI plugin on this node.
    Cni(CniArgs),
    /// What this kernel offers the eBPF programs: each probed feature, each program variant
    /// loaded (and so verified) with the verifier's reason when it refuses one, and which
    /// backend `--mode auto` picks. Attaches nothing.
    Kernel(KernelArgs),
    /// Mount a bpffs on a directory unless one is there already (the DaemonSet's init
    /// container runs it, privileged, so that the agent itself needs no privileged mode).
    MountBpffs(MountBpffsArgs),
    /// Check interceptor's health on the cluster, as `linkerd check` shows it (the same as
    /// `linkerd-interceptor check`): the DaemonSet, each node's agent and CNI plugin, pods Linkerd
    /// injected that are not meshed or whose interception drifted.
    Check(CheckArgs),
    /// Label and annotate interceptor's namespace for Linkerd (the chart's post-install and
    /// post-upgrade hook runs it): what keeps Linkerd's injector and webhooks away, and with
    /// `--linkerd-extension` `linkerd.io/extension: interceptor`, so that `linkerd check` runs
    /// `linkerd-interceptor check`.
    NamespaceMetadata(NamespaceMetadataArgs),
}

#[derive(Debug, Args)]
pub struct KernelArgs {
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct MountBpffsArgs {
    /// Where the bpffs goes.
    #[arg(default_value = crate::bpffs::BPFFS_ROOT)]
    pub path: PathBuf,
}

#[derive(Debug, Args)]
pub struct CniArgs {
    #[command(subcommand)]
    pub command: CniCommand,

    /// Where the runtime looks for CNI plugin binaries.
    #[arg(long, global = true, default_value = "/opt/cni/bin")]
    pub bin_dir: PathBuf,

    /// Where the node's CNI network configurations are.
    #[arg(long, global = true, default_value = "/etc/cni/net.d")]
    pub conf_dir: PathBuf,
}

#[derive(Debug, Subcommand)]
#[allow(
    clippy::large_enum_variant,
    reason = "parsed once per run: boxing `Install` would buy nothing"
)]
pub enum CniCommand {
    /// Copy the plugin into the bin directory and chain it into the primary network
    /// configuration (converting a lone .conf to a .conflist), atomically and never twice.
    /// Nothing is written while a plugin of the primary network is not in the bin directory.
    Install {
        /// The `interceptor-cni` binary [default: next to this one].
        #[arg(long)]
        plugin: Option<PathBuf>,
        /// The plugin's `linkerd` block, as JSON (Linkerd's keys; missing ones take Linkerd's
        /// defaults, and `ipv6` false as linkerd-cni writes it: add `"ipv6": true` where
        /// Linkerd's `disableIPv6` is false).
        #[arg(long, default_value = "{}")]
        linkerd: String,
        /// The agent's API socket, as the plugin reaches it. The watching installer reports there
        /// each time it chains the plugin again (`interceptor_cni_chain_restored_total`).
        #[arg(long, default_value = "/run/interceptor/agent.sock")]
        agent_socket: PathBuf,
        /// Where the plugin logs.
        #[arg(long, default_value = "/var/log/interceptor-cni.log")]
        log_file: PathBuf,
        /// Which pods the plugin meshes: those Linkerd injected, or all [default: injected
        /// when the runtime names a Kubernetes pod, else all].
        #[arg(long, value_parser = ["injected", "all"])]
        pods: Option<String>,
        /// Keep running, and chain the plugin again whenever the primary CNI rewrites its file
        /// (on inotify and every --check-ms), with a warning each time and an error naming the
        /// likely cause when it keeps happening; what cannot be chained yet (no primary network,
        /// its plugins not in the bin directory) is tried again as the directories change. On
        /// SIGTERM or SIGINT, remove the plugin (but see --daemonset).
        #[arg(long)]
        watch: bool,
        /// With --watch, how often the primary network configuration is checked for the plugin
        /// (and the plugin chained again if it is not), in milliseconds, beside inotify, which
        /// misses a configuration directory replaced. Each check reads the directory and one
        /// small file.
        #[arg(long, default_value_t = 5000, requires = "watch",
              value_parser = clap::value_parser!(u64).range(100..))]
        check_ms: u64,
        /// The DaemonSet this installer runs in, as NAMESPACE/NAME. On SIGTERM or SIGINT the
        /// plugin is then removed only if the Kubernetes API says the DaemonSet is gone or being
        /// deleted; while it remains (this pod replaced), or when the API cannot tell, the
        /// plugin stays chained and pods wait for the next agent (CNI error 11).
        #[arg(long, requires = "watch")]
        daemonset: Option<DaemonSetRef>,
        /// The kubeconfig for --daemonset [default: the pod's service account, else
        /// $KUBECONFIG or ~/.kube/config].
        #[arg(long, requires = "daemonset")]
        kubeconfig: Option<PathBuf>,
        /// Keep a report of whether the plugin is chained in this file (JSON: `chained`, the
        /// `conf` it is chained into or the `reason` it is not), rewritten whole whenever that
        /// changes and removed with the plugin: the agent's --cni-chain-report, which makes
        /// the agent ready only while it says chained (the chart passes
        /// /run/interceptor/cni-chain.json).
        #[arg(long, value_name = "FILE")]
        chain_report: Option<PathBuf>,
    },
    /// Remove exactly what install added.
    Uninstall,
}

#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Where the validator listens: the outbound proxy port, where redirected connects land.
    /// The default is what Linkerd's injector gives `linkerd-network-validator` (`[::]:4140`
    /// with IPv6, Linkerd's `disableIPv6=false`).
    #[arg(long, default_value = "0.0.0.0:4140")]
    pub listen_addr: std::net::SocketAddr,

    /// An address that is only reachable by being redirected. The default is the one Linkerd's
    /// injector gives `linkerd-network-validator` (`[fd00::1]:20001` with IPv6): run in a pod,
    /// the check is then the same connect the injected validator makes.
    #[arg(long, default_value = "1.1.1.1:20001")]
    pub connect_addr: std::net::SocketAddr,

    /// How long to wait for the connect and the token, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub timeout_ms: u64,

    /// Run in this network namespace [default: the current one].
    #[arg(long)]
    pub netns: Option<PathBuf>,
}

impl ValidateArgs {
    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.timeout_ms)
    }
}

/// Where the agent keeps its state.
#[derive(Debug, Clone, Args)]
pub struct AgentLocationArgs {
    /// The agent's API socket, lock and pod records live here.
    #[arg(long, global = true, default_value = crate::agent::DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,

    /// Where on a bpffs the agent pins its maps and links.
    #[arg(long, global = true, default_value = crate::agent::DEFAULT_BPFFS)]
    pub bpffs: PathBuf,
}

impl AgentLocationArgs {
    pub fn paths(&self) -> crate::agent::AgentPaths {
        crate::agent::AgentPaths {
            state_dir: self.state_dir.clone(),
            bpffs: self.bpffs.clone(),
        }
    }
}

#[derive(Debug, Args)]
pub struct DaemonArgs {
    #[command(flatten)]
    pub location: AgentLocationArgs,

    /// Interception backend: the eBPF programs; proxy-init's nat-table chains written in each
    /// registered pod's network namespace; or auto: eBPF when every program loads and verifies
    /// on this kernel, else iptables (one log line says which and why).
    #[arg(long, value_enum, default_value_t = Mode::Auto)]
    pub mode: Mode,

    /// How the iptables backend runs iptables.
    #[command(flatten)]
    pub iptables: IptablesArgs,

    /// The cgroup v2 directory the programs attach to (on Kubernetes typically the kubepods
    /// cgroup) [default: the root of the cgroup2 mount].
    #[arg(long)]
    pub cgroup: Option<PathBuf>,

    /// Attach to the kubelet's pod cgroup, found at start under this cgroup2 directory (on
    /// Kubernetes the host's cgroup2 mount): the shallowest `kubepods` or `*kubepods.slice`
    /// directory within 3 levels, whatever the cgroup driver; this directory itself when there
    /// is none, or several. On a hybrid host (cgroup v1 here), its `unified` directory.
    /// Instead of --cgroup.
    #[arg(long, value_name = "CGROUP2_DIR", conflicts_with = "cgroup")]
    pub kubepods_under: Option<PathBuf>,

    /// Capacity of each map of original destinations (connections not yet read by a proxy).
    #[arg(long, default_value_t = interceptor_common::DEFAULT_PENDING_ORIG_DST_CAPACITY,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub orig_dst_capacity: u32,

    /// The safety sweep's round, in milliseconds: every pod is checked once per round for a
    /// vanished or replaced network namespace and for address changes, one pod at a time spread
    /// over it, at most two a second (a round of 1,000 pods takes 500 s). Changes are seen at
    /// once through events (namespaces removed, address notifications, pins removed); the
    /// sweep catches what no event reported.
    #[arg(long, default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(10..))]
    pub reconcile_ms: u64,

    /// Serve Prometheus metrics (`/metrics`), readiness (`/ready`) and liveness (`/live`) here,
    /// e.g. 127.0.0.1:9990. An IPv6 address may come without brackets (`fd00::1:9990`, as
    /// `$(HOST_IP):9990` expands): the part after the last colon is the port.
    #[arg(long, value_parser = parse_listen_addr)]
    pub metrics_addr: Option<std::net::SocketAddr>,

    /// Pods this agent serves at most; a registration beyond is refused (pod_table_full).
    #[arg(long, default_value_t = interceptor_common::MAX_PODS,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(interceptor_common::MAX_PODS)))]
    pub max_pods: u32,

    /// The map layout version to pin under; only the tests of the migration between layouts
    /// set it.
    #[arg(long, hide = true, default_value_t = interceptor_common::MAP_LAYOUT_VERSION)]
    pub map_layout_version: u32,
    /// Read pods from the Kubernetes API for the CNI plugin when the container runtime passes
    /// no annotations: in-cluster service account, else $KUBECONFIG or ~/.kube/config.
    #[arg(long)]
    pub kubernetes: bool,
    /// Read pods from the Kubernetes API with this kubeconfig (implies --kubernetes).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// This node's name, for the watch of its pods (the DaemonSet sets NODE_NAME from
    /// spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// The CNI installer's report of the chain (its --chain-report, e.g.
    /// /run/interceptor/cni-chain.json): the agent is ready (`/ready`, the node's status) only
    /// while it says the plugin is chained, and not while it is missing. Without it the chain
    /// is not the agent's concern.
    #[arg(long, value_name = "FILE")]
    pub cni_chain_report: Option<PathBuf>,
    /// Remove every taint with this key from this node's Node once the agent can mesh pods (as
    /// `/ready` would answer 200), as Cilium removes `node.cilium.io/agent-not-ready`: nodes
    /// created with it run no pod that does not tolerate it before then. Needs --kubernetes and
    /// a node name.
    #[arg(long, value_name = "KEY")]
    pub startup_taint: Option<String>,
    /// Repair pods that started without the CNI plugin (its entry was not chained when their
    /// sandbox was created): with --kubernetes and a node name, each such pod Linkerd injected
    /// is registered in place as the plugin would have, at once when the API reports it, and
    /// every this many seconds for all of them (which also paces the retries of one that cannot
    /// be registered yet). A pass only compares the watch's pods with the registrations. 0:
    /// never.
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    pub repair_interval: u64,
    /// The CNI plugin's `linkerd` block, as JSON: the same value the installer's --linkerd
    /// gets, so that a repaired pod has the configuration its ADD would have given it.
    #[arg(long, default_value = "{}")]
    pub linkerd: String,
    /// The DaemonSet this agent runs in, as NAMESPACE/NAME (with --kubernetes). On SIGTERM or
    /// SIGINT the agent then asks the API for it: gone, being deleted or taken over by another
    /// chart (`helm uninstall`, or `helm upgrade` back to linkerd2-cni), and it detaches its
    /// programs and removes its pins, records and the iptables chains it wrote, as `interceptor
    /// uninstall` does; still ours (this pod replaced), or the API cannot tell, and everything
    /// stays for the next agent. Without it the agent always leaves interception in force.
    #[arg(long)]
    pub daemonset: Option<crate::kubernetes::DaemonSetRef>,
}

#[derive(Debug, Args)]
pub struct PodArgs {
    #[command(flatten)]
    pub location: AgentLocationArgs,

    #[command(subcommand)]
    pub command: PodCommand,
}

#[derive(Debug, Subcommand)]
#[allow(
    clippy::large_enum_variant,
    reason = "parsed once per command: boxing `Add` would buy nothing"
)]
pub enum PodCommand {
    /// Register a pod; returns once its interception is in force. The pod's configuration
    /// follows `--`, as `interceptor run` takes it: `pod add --netns P -- -p 4143 -o 4140 -u 2102`.
    Add {
        /// The pod's network namespace (`/run/netns/NAME`, `/proc/PID/ns/net`).
        #[arg(long)]
        netns: PathBuf,
        #[arg(long)]
        name: Option<String>,
        #[arg(long)]
        namespace: Option<String>,
        #[arg(long)]
        container_id: Option<String>,
        /// The Kubernetes pod's UID.
        #[arg(long)]
        uid: Option<String>,
        /// Apply a new configuration to a pod already registered, in place.
        #[arg(long)]
        update: bool,
        /// Once the pod is intercepted, remove the iptables chains proxy-init wrote in it: a pod
        /// meshed with iptables moves to eBPF without a restart and without a gap.
        #[arg(long)]
        takeover_iptables: bool,
        #[command(flatten)]
        config: PodConfigArgs,
    },
    /// Unregister a pod (not an error when it is not registered).
    Remove {
        #[arg(long)]
        netns: PathBuf,
    },
    /// The registered pods.
    List {
        #[arg(long)]
        json: bool,
    },
    /// One registered pod, with its counters.
    Get {
        #[arg(long)]
        netns: PathBuf,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// cgroup/connect4, cgroup/connect6, sock_ops, cgroup/getsockopt and sk_lookup programs.
    Ebpf,
    /// proxy-init's nat-table chains: `run` writes them and exits; the node agent writes them in
    /// each registered pod's network namespace.
    Iptables,
    /// eBPF when every program loads on this kernel with these privileges, else iptables.
    Auto,
}

/// How the iptables backend runs iptables.
#[derive(Debug, Args)]
pub struct IptablesArgs {
    /// Which binaries: iptables-legacy, iptables-nft, or plain iptables (ip6tables-* with --ipv6).
    #[arg(long, value_enum, default_value_t = IptablesMode::Legacy)]
    pub iptables_mode: IptablesMode,

    /// Pass -w to iptables (wait for the xtables lock).
    #[arg(long, short = 'w')]
    pub use_wait_flag: bool,
}

#[derive(Debug, Args)]
pub struct IptablesCleanupArgs {
    #[command(flatten)]
    pub iptables: IptablesArgs,

    /// The pod's network namespace [default: the current one].
    #[arg(long)]
    pub netns: Option<PathBuf>,

    /// Also clean up the ip6tables chains.
    #[arg(long, num_args = 0..=1, default_value_t = true, default_missing_value = "true",
          action = ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub ipv6: bool,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub interception: InterceptionArgs,

    /// Interception backend.
    #[arg(long, value_enum, default_value_t = Mode::Ebpf)]
    pub mode: Mode,

    #[command(flatten)]
    pub iptables: IptablesArgs,

    /// The pod's network namespace (e.g. /run/netns/NAME or /proc/PID/ns/net).
    #[arg(long, default_value = "/proc/self/ns/net")]
    pub netns: PathBuf,

    /// cgroup v2 directory the programs attach to [default: the root of the cgroup2 mount].
    #[arg(long)]
    pub cgroup: Option<PathBuf>,

    /// Print what would be done and change nothing.
    #[arg(long)]
    pub simulate: bool,

    /// Name of this attachment's state (under /run/interceptor and /sys/fs/bpf/interceptor).
    #[arg(long, default_value = "default")]
    pub instance: String,

    /// When a node agent answers on this socket, `run` registers the pod with it (and removes
    /// it on SIGINT/SIGTERM) instead of loading programs of its own.
    #[arg(long, default_value = "/run/interceptor/agent.sock")]
    pub agent_socket: PathBuf,

    /// Original destinations kept for the proxy to read, at most (least recently used evicted).
    #[arg(long, default_value_t = interceptor_common::DEFAULT_PENDING_ORIG_DST_CAPACITY,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub orig_dst_capacity: u32,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Only this instance.
    #[arg(long)]
    pub instance: Option<String>,

    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,

    /// Where to find the node agent (its API socket), whose pods are shown too.
    #[arg(long, default_value = crate::agent::DEFAULT_STATE_DIR)]
    pub agent_state_dir: PathBuf,

    /// Where the node agent pins its links: the programs they run (and so each hook's variant)
    /// are read from there.
    #[arg(long, default_value = crate::agent::DEFAULT_BPFFS)]
    pub agent_bpffs: PathBuf,
}

/// The pod's configuration from proxy-init's flags among `run`'s. The arguments are built from
/// the configuration crate's one table of the flags ([`FLAGS`]), whose value parser clap runs, so
/// each value reaches the configuration parsed once, typed ([`Setting`]).
#[derive(Debug)]
pub struct InterceptionArgs {
    pub config: InterceptionConfig,
}

/// proxy-init's flag as an argument: repeatable, its value parsed by the configuration crate
/// (a bad one refused as clap refuses any, exit status 2, naming the flag).
fn proxy_init_arg(flag: &'static Flag) -> Arg {
    let name = flag.name;
    let parse = move |value: &str| match Setting::parse(name, value) {
        Ok(setting) => Ok(setting),
        Err(ConfigError::Invalid { reason, .. }) => Err(reason),
        Err(e) => Err(e.to_string()),
    };
    let mut arg = Arg::new(name)
        .long(name)
        .value_name(flag.value)
        .help(flag.help)
        .required(flag.required)
        .action(ArgAction::Append)
        .value_parser(parse);
    if let Some(short) = flag.short {
        arg = arg.short(short);
    }
    match flag.value {
        // proxy-init's default, and linkerd-cni's "none", is -1.
        value if flags::IDS.contains(&value) => arg.allow_hyphen_values(true),
        // `--ipv6` alone is true, as with proxy-init.
        flags::BOOL => arg.num_args(0..=1).default_missing_value("true"),
        _ => arg,
    }
}

impl FromArgMatches for InterceptionArgs {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let given = FLAGS.iter().flat_map(|flag| {
            matches
                .get_many::<Setting>(flag.name)
                .into_iter()
                .flatten()
                .cloned()
        });
        let config = InterceptionConfig::from_settings(given)
            .map_err(|e| clap::Error::raw(clap::error::ErrorKind::MissingRequiredArgument, e))?;
        Ok(Self { config })
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl Args for InterceptionArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        FLAGS
            .iter()
            .fold(cmd, |cmd, flag| cmd.arg(proxy_init_arg(flag)))
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

/// Parses proxy-init's flags given after `--`; what does not parse is refused as clap refuses a
/// bad flag (exit status 2), with the usage of the command that took them.
fn parse_config(args: &[String], command: &[&str]) -> Result<InterceptionConfig, clap::Error> {
    InterceptionConfig::from_proxy_init_args(args).map_err(|e| {
        let mut cli = <Cli as clap::CommandFactory>::command();
        cli.build();
        let command = command.iter().fold(&mut cli, |cmd, name| {
            cmd.find_subcommand_mut(name)
                .expect("a command of this command line")
        });
        clap::Error::raw(clap::error::ErrorKind::ValueValidation, e).format(command)
    })
}

/// A pod's configuration as proxy-init's flags after `--`, as `interceptor run` takes them:
/// `pod add --netns P -- -p 4143 -o 4140 -u 2102`.
#[derive(Debug)]
pub struct PodConfigArgs {
    pub config: InterceptionConfig,
}

#[derive(Debug, Args)]
struct TrailingFlags {
    /// proxy-init's flags.
    #[arg(last = true, required = true)]
    config: Vec<String>,
}

impl FromArgMatches for PodConfigArgs {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let flags = TrailingFlags::from_arg_matches(matches)?;
        let config = parse_config(&flags.config, &["pod", "add"])?;
        Ok(Self { config })
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl Args for PodConfigArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        TrailingFlags::augment_args(cmd)
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        TrailingFlags::augment_args_for_update(cmd)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    /// The one table of proxy-init's flag cases.
    use interceptor_test_cases::flag_cases;

    /// A pod's configuration as `interceptor run` parses its flags, or clap's message.
    fn run(flags: &[&str]) -> Result<InterceptionConfig, String> {
        let argv = ["interceptor", "run"].iter().chain(flags);
        match Cli::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .command
        {
            Command::Run(run) => Ok(run.interception.config),
            other => panic!("unexpected command {other:?}"),
        }
    }

    /// A pod's configuration as `interceptor pod add` parses the flags after its `--`.
    fn pod_add(flags: &[&str]) -> Result<InterceptionConfig, String> {
        let argv = [
            "interceptor",
            "pod",
            "add",
            "--netns",
            "/run/netns/pod",
            "--",
        ]
        .iter()
        .chain(flags);
        match Cli::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .command
        {
            Command::Pod(PodArgs {
                command: PodCommand::Add { config, .. },
                ..
            }) => Ok(config.config),
            other => panic!("unexpected command {other:?}"),
        }
    }

    #[test]
    fn run_and_pod_add_read_proxy_init_flags_as_the_configuration_crate_does() {
        for (parser, parse) in [("run", run as fn(&[&str]) -> _), ("pod add", pod_add)] {
            for (flags, expected) in flag_cases::FLAG_CASES {
                match (parse(flags), expected) {
                    (Ok(config), Ok(expected)) => {
                        assert_eq!(&config.to_args().join(" "), expected, "{parser} {flags:?}")
                    }
                    (Err(e), Err(needle)) => assert!(e.contains(needle), "{parser} {flags:?}: {e}"),
                    (got, expected) => panic!("{parser} {flags:?}: {got:?}, expected {expected:?}"),
                }
            }
        }
    }

    #[test]
    fn a_refused_configuration_reads_as_clap_refuses_a_flag() {
        let err = Cli::try_parse_from(["interceptor", "run", "-p", "0", "-o", "4140"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        let message = err.to_string();
        // clap's own refusal: the configuration crate's parser is its value parser.
        assert!(
        message.starts_with(
            "error: invalid value '0' for '--incoming-proxy-port <PORT>': port 0 is out of range"
        ),
        "{message}"
    );
        let message = pod_add(&["-p", "4143"]).unwrap_err();
        assert!(
            message.starts_with("error: --outgoing-proxy-port is required")
                && message.contains("Usage: interceptor pod add "),
            "{message}"
        );
    }

    #[test]
    fn listen_addresses_take_ipv6_with_or_without_brackets() {
        use super::parse_listen_addr;
        let addr = |s: &str| parse_listen_addr(s).map(|a| a.to_string());
        assert_eq!(addr("10.0.0.7:9990").as_deref(), Ok("10.0.0.7:9990"));
        assert_eq!(addr("[fd00::7]:9990").as_deref(), Ok("[fd00::7]:9990"));
        // `$(HOST_IP):9990` on an IPv6 node.
        assert_eq!(addr("fd00::7:9990").as_deref(), Ok("[fd00::7]:9990"));
        assert_eq!(addr("::1:9990").as_deref(), Ok("[::1]:9990"));
        for bad in ["10.0.0.7", "fd00::7", "node:9990", "10.0.0.7:99999", ""] {
            assert!(parse_listen_addr(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_daemon_takes_a_cgroup_or_a_directory_to_find_the_kubelets_in_not_both() {
        let daemon = |args: &[&str]| {
            let mut argv = vec!["interceptor", "daemon"];
            argv.extend_from_slice(args);
            Cli::try_parse_from(argv).map(|cli| match cli.command {
                Command::Daemon(daemon) => (daemon.cgroup, daemon.kubepods_under),
                other => panic!("unexpected command {other:?}"),
            })
        };
        assert_eq!(
            daemon(&["--kubepods-under", "/host/sys/fs/cgroup"]).unwrap(),
            (None, Some(PathBuf::from("/host/sys/fs/cgroup")))
        );
        let both = daemon(&["--cgroup", "/a", "--kubepods-under", "/b"]).unwrap_err();
        assert!(both.to_string().contains("cannot be used with"), "{both}");
    }
}

/// `IP:PORT`, `[IPv6]:PORT`, or an IPv6 address and port without brackets (what a Kubernetes
/// `$(HOST_IP):PORT` gives on an IPv6 node): the port is after the last colon.
pub fn parse_listen_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    if let Ok(addr) = s.parse() {
        return Ok(addr);
    }
    let invalid = || format!("{s:?} is not an address and port (e.g. 127.0.0.1:9990, [::1]:9990)");
    let (ip, port) = s.rsplit_once(':').ok_or_else(invalid)?;
    let ip: std::net::IpAddr = ip.parse().map_err(|_| invalid())?;
    let port: u16 = port.parse().map_err(|_| invalid())?;
    Ok(std::net::SocketAddr::new(ip, port))
}

/// The `linkerd-interceptor` binary, the Linkerd extension `linkerd check` runs for the namespace
/// labelled `linkerd.io/extension: interceptor`.
#[derive(Debug, Parser)]
#[command(
    name = "linkerd-interceptor",
    version,
    about = "interceptor as a Linkerd extension: `linkerd check` runs `linkerd-interceptor check`"
)]
pub struct LinkerdCli {
    #[command(subcommand)]
    pub command: LinkerdCommand,
}

#[derive(Debug, Subcommand)]
pub enum LinkerdCommand {
    /// Check interceptor's health on the cluster (as `interceptor check`).
    Check(CheckArgs),
}

/// How `check` writes its results.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CheckFormat {
    /// Every check, under its category (Linkerd's default).
    Table,
    /// Linkerd's check JSON (what `linkerd check` asks an extension for).
    Json,
    /// Only the checks that did not pass.
    Short,
}

/// `check`'s flags: those `linkerd check` passes an extension (linkerd2 `cli/cmd/check.go`
/// `getExtensionCheckFlags`, and `EXTENSIONS.md`), then where interceptor is installed. A bool
/// flag takes `--flag=false` too, as Linkerd passes them; a flag given twice takes its last
/// value, as pflag does.
#[derive(Debug, Args)]
#[command(args_override_self = true)]
pub struct CheckArgs {
    /// Output format: table, json or short.
    #[arg(long, short = 'o', value_enum, default_value_t = CheckFormat::Table)]
    pub output: CheckFormat,
    /// How long the checks that converge (agents becoming ready) are retried, as Go writes a
    /// duration (`300s`, `5m0s`).
    #[arg(long, default_value = "5m0s", value_parser = parse_go_duration)]
    pub wait: std::time::Duration,
    /// Only name pods of this namespace in the pod checks [default: all] (what `linkerd check
    /// -n` means by it; it passes it on).
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// The namespace interceptor is installed in [default: the one labelled
    /// `linkerd.io/extension=interceptor`, else linkerd-cni].
    #[arg(long)]
    pub cni_namespace: Option<String>,
    /// The kubeconfig [default: $KUBECONFIG or ~/.kube/config, else the pod's service account].
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig's context to use [default: its current context].
    #[arg(long)]
    pub context: Option<String>,
    /// A user to impersonate.
    #[arg(long = "as")]
    pub as_user: Option<String>,
    /// A group to impersonate, with --as (repeatable; `[a,b]`, as `linkerd check` passes it, is
    /// two).
    #[arg(long, action = ArgAction::Append)]
    pub as_group: Vec<String>,
    /// Debug logging (on stderr).
    #[arg(long, num_args = 0..=1, default_value_t = false, default_missing_value = "true",
          action = ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub verbose: bool,
    /// Accepted for Linkerd and ignored: every check reads the data plane already.
    #[arg(long, num_args = 0..=1, default_value_t = false, default_missing_value = "true",
          action = ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub proxy: bool,
    /// Accepted for Linkerd and ignored: nothing needs checking before the chart installs.
    #[arg(long, num_args = 0..=1, default_value_t = false, default_missing_value = "true",
          action = ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub pre: bool,
    /// Accepted for Linkerd and ignored: no Linkerd API is asked.
    #[arg(long)]
    pub api_addr: Option<String>,
    /// Accepted for Linkerd and ignored: the checks do not read the control plane.
    #[arg(long, short = 'L')]
    pub linkerd_namespace: Option<String>,
}

#[derive(Debug, Args)]
pub struct NamespaceMetadataArgs {
    /// The namespace (the chart's release namespace).
    #[arg(long, short = 'n')]
    pub namespace: String,
    /// The kubeconfig [default: $KUBECONFIG or ~/.kube/config, else the pod's service account].
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// How long to keep trying while the API does not answer or refuses, in milliseconds.
    #[arg(long, default_value_t = 120_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout_ms: u64,
    /// Label the namespace `linkerd.io/extension: interceptor` (`linkerd check` then runs
    /// `linkerd-interceptor check`, and warns where it is not on the PATH); without it, the
    /// label is removed.
    #[arg(long)]
    pub linkerd_extension: bool,
}

/// A duration as Go writes and parses them (`time.ParseDuration`): `300s`, `5m0s`, `1h2m3.5s`,
/// `250ms`, `0`; a negative one counts as zero.
pub fn parse_go_duration(s: &str) -> Result<std::time::Duration, String> {
    let invalid = || format!("{s:?} is not a duration (e.g. 300s, 5m0s, 1m30s)");
    let (negative, mut rest) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if rest == "0" {
        return Ok(std::time::Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(invalid());
    }
    let mut seconds = 0f64;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(invalid)?;
        let number: f64 = rest[..number_end].parse().map_err(|_| invalid())?;
        rest = &rest[number_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(invalid()),
        };
        seconds += number * scale;
        rest = &rest[unit_end..];
    }
    if negative {
        return Ok(std::time::Duration::ZERO);
    }
    std::time::Duration::try_from_secs_f64(seconds).map_err(|_| invalid())
}
