//! What the matrix runs in each guest: one table of test runs, each with what it needs of the
//! kernel. A run a kernel cannot support is listed with the reason and reported, never dropped.

/// The eBPF programs' kernel features, as `INTERCEPTOR_KERNEL_FEATURES` sets them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Features {
    /// What the kernel offers: the programs' best variants.
    Native,
    /// `-all`: every feature forced off, so the fallback variants load and run.
    AllOff,
}

impl Features {
    pub fn env_value(self) -> Option<&'static str> {
        match self {
            Self::Native => None,
            Self::AllOff => Some("-all"),
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::Native => "native",
            Self::AllOff => "-all",
        }
    }
}

/// Which command runs it: `cargo xtask test` runs the core on every kernel, `cargo xtask
/// kernels --full` also the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    Core,
    Full,
}

/// What a run needs of the kernel.
#[derive(Clone, Copy, Debug)]
pub enum Needs {
    /// Nothing beyond what every kernel of the matrix has (the iptables backend).
    Any,
    /// The eBPF programs load: SO_NETNS_COOKIE (5.14), `bpf_get_netns_cookie` in sockopt
    /// programs (5.15) and the rest of the requirements in docs/kernels.md.
    Ebpf,
    /// In the core, only where the eBPF programs cannot run: the fallback made for those
    /// kernels (elsewhere the host's run and `--full` cover it).
    NoEbpf,
}

/// Minimum kernel of the eBPF backend, and why.
const EBPF_MIN: (u32, u32) = (5, 15);
const COVERED_ELSEWHERE: &str = "the fallback for kernels the eBPF programs cannot run on: run on the host, and here with --full";
const EBPF_REASON: &str = "the eBPF programs need 5.15 (SO_NETNS_COOKIE 5.14, bpf_get_netns_cookie in cgroup/getsockopt 5.15): only the iptables backend works here";

pub struct TestRun {
    /// The test target (`tests/tests/<binary>.rs`).
    pub binary: &'static str,
    /// libtest name filters (substrings; a test matching any runs); none: every test.
    pub filters: &'static [&'static str],
    /// libtest `--skip` filters: tests another run of the table covers.
    pub skip: &'static [&'static str],
    pub features: Features,
    /// More of the test's environment (e.g. how many random configurations).
    pub env: &'static [(&'static str, &'static str)],
    pub scope: Scope,
    pub needs: Needs,
    /// Killed after this long in the guest (software emulation is about ten times slower).
    pub timeout_secs: u64,
}

impl TestRun {
    /// Names the run in reports: the binary, its filters' purpose, its features.
    pub fn id(&self) -> String {
        let mut id = self.binary.to_owned();
        if let [first, ..] = self.filters {
            id.push_str(&format!("[{}]", first.trim_end_matches("::")));
        }
        if self.features != Features::Native {
            id.push_str(&format!(" {}", self.features.label()));
        }
        id
    }
}

const fn run(
    binary: &'static str,
    filters: &'static [&'static str],
    features: Features,
    needs: Needs,
) -> TestRun {
    TestRun {
        binary,
        filters,
        skip: &[],
        features,
        env: &[],
        scope: Scope::Core,
        needs,
        timeout_secs: 300,
    }
}

/// Random configurations per guest run, each about 18 s under emulation: one in the core (the
/// test command's time budget), eight with `--full`.
const RANDOM_IN_A_GUEST: &[(&str, &str)] = &[("INTERCEPTOR_RANDOM_CONFIGS", "1")];
const RANDOM_IN_A_GUEST_FULL: &[(&str, &str)] = &[("INTERCEPTOR_RANDOM_CONFIGS", "8")];

/// `--mode auto` choosing eBPF: only where the programs load.
const AUTO_MODE_PICKS_EBPF: &str = "auto_mode_uses_ebpf_when_the_kernel_allows_it";
/// 3,000 connections: minutes under emulation.
const THOUSANDS: &str = "thousands_of_short_connections_all_get_their_original_destination";
/// Our rendering of proxy-init's chains against its transcription for 3,000 configurations: no
/// kernel in it (the host runs it), and about ten times its 4 s under emulation.
const RENDERING: &str = "our_rules_are_proxy_inits_for_drawn_configurations";

/// `--full` has the time: whole tables of iptables rows take many minutes under emulation.
const fn full(run: TestRun) -> TestRun {
    TestRun {
        scope: Scope::Full,
        timeout_secs: 1800,
        ..run
    }
}

/// The eBPF agent taking over an iptables agent's pods: it needs the programs to load.
const EBPF_TAKEOVER: &str = "an_ebpf_agent_takes_over_the_pods_an_iptables_agent_meshed";

/// The load-and-behaviour core (in `cargo xtask test`: what fits its time budget on every
/// kernel), then, with `--full`, the rest: the other families of the behaviour table and
/// iptables-nft, the agent's and the CNI plugin's main paths with eBPF, and the fallback variants
/// through the whole table.
/// `user_namespaces`' tests in the core run, for each kind of kernel.
const USER_NAMESPACES_CORE_IPTABLES: [&str; 4] = [
    "iptables_legacy::ipv4::proxy_uid_connects_to_the_real_address",
    "iptables_legacy::ipv4::proxy_gid_is_exempt",
    "iptables_legacy::a_socket_keeps_the_ids_it_was_created_with",
    "an_iptables_agent_meshes_a_user_namespaced_pod",
];
const USER_NAMESPACES_CORE_EBPF: [&str; 4] = [
    "ebpf::ipv4::proxy_uid_connects_to_the_real_address",
    "ebpf::ipv4::proxy_gid_is_exempt",
    "ebpf::a_socket_keeps_the_ids_it_was_created_with",
    "an_ebpf_agent_meshes_a_user_namespaced_pod",
];

pub const RUNS: &[TestRun] = &[
    // Every variant loads exactly where the feature probes say it can, and `--mode auto` picks
    // eBPF exactly where every hook has one: on every kernel, whatever it supports.
    run("kernel_support", &[], Features::Native, Needs::Any),
    TestRun {
        skip: &[THOUSANDS],
        ..run("outbound_ebpf", &[], Features::Native, Needs::Ebpf)
    },
    run("inbound_ebpf", &[], Features::Native, Needs::Ebpf),
    // IPv4, IPv4 on IPv6 sockets and native IPv6 at once, every connection accounted for.
    run("dual_stack", &[], Features::Native, Needs::Ebpf),
    run(
        "behaviour_table",
        &["ebpf::ipv4::"],
        Features::Native,
        Needs::Ebpf,
    ),
    // A random proxy-init configuration: eBPF and our chains (legacy and nft) land every probe
    // where proxy-init's rules do in this kernel (the host runs the test command's count; `--full` runs
    // more, and with the fallback variants).
    TestRun {
        env: RANDOM_IN_A_GUEST,
        skip: &[RENDERING],
        ..run("behaviour_random", &[], Features::Native, Needs::Ebpf)
    },
    TestRun {
        skip: &[THOUSANDS],
        ..run("outbound_ebpf", &[], Features::AllOff, Needs::Ebpf)
    },
    run("inbound_ebpf", &[], Features::AllOff, Needs::Ebpf),
    // Where the programs cannot run, the agent meshes pods with proxy-init's chains, through its
    // API and the CNI plugin, with --mode auto choosing so.
    TestRun {
        skip: &[EBPF_TAKEOVER],
        ..run("agent_iptables", &[], Features::Native, Needs::NoEbpf)
    },
    // Pods with a user namespace of their own (`hostUsers: false`): proxy-init's chains written
    // from inside it on every kernel, the programs comparing the ids translated out of it
    // wherever they run; the agent meshing such a pod through the CNI plugin with each. A pod
    // of its own per test is slow under emulation (a minute each on a busy host): the rows of
    // the proxy's UID and GID and the socket's creator, not all of them (`--full` runs all).
    run(
        "user_namespaces",
        &USER_NAMESPACES_CORE_IPTABLES,
        Features::Native,
        Needs::Any,
    ),
    run(
        "user_namespaces",
        &USER_NAMESPACES_CORE_EBPF,
        Features::Native,
        Needs::Ebpf,
    ),
    full(TestRun {
        skip: &USER_NAMESPACES_CORE_IPTABLES,
        ..run(
            "user_namespaces",
            &["iptables_legacy::", "iptables_nft::"],
            Features::Native,
            Needs::Any,
        )
    }),
    full(TestRun {
        skip: &USER_NAMESPACES_CORE_EBPF,
        ..run(
            "user_namespaces",
            &["ebpf::"],
            Features::Native,
            Needs::Ebpf,
        )
    }),
    full(run("socket_paths", &[], Features::Native, Needs::Ebpf)),
    full(run(
        "outbound_ebpf",
        &[THOUSANDS],
        Features::Native,
        Needs::Ebpf,
    )),
    full(run(
        "behaviour_table",
        &["ebpf::ipv4_mapped_on_ipv6::", "ebpf::ipv6::"],
        Features::Native,
        Needs::Ebpf,
    )),
    full(TestRun {
        skip: &[AUTO_MODE_PICKS_EBPF],
        ..run("iptables", &[], Features::Native, Needs::Any)
    }),
    full(run(
        "iptables",
        &[AUTO_MODE_PICKS_EBPF],
        Features::Native,
        Needs::Ebpf,
    )),
    full(run(
        "behaviour_table",
        &["iptables_legacy::", "iptables_nft::"],
        Features::Native,
        Needs::Any,
    )),
    full(TestRun {
        skip: &[EBPF_TAKEOVER],
        ..run("agent_iptables", &[], Features::Native, Needs::Any)
    }),
    full(run(
        "agent_iptables",
        &[EBPF_TAKEOVER],
        Features::Native,
        Needs::Ebpf,
    )),
    full(run(
        "socket_paths",
        &["ebpf"],
        Features::AllOff,
        Needs::Ebpf,
    )),
    full(run("dual_stack", &[], Features::AllOff, Needs::Ebpf)),
    full(TestRun {
        env: RANDOM_IN_A_GUEST_FULL,
        skip: &[RENDERING],
        ..run("behaviour_random", &[], Features::AllOff, Needs::Ebpf)
    }),
    full(TestRun {
        env: RANDOM_IN_A_GUEST_FULL,
        skip: &[RENDERING],
        ..run("behaviour_random", &[], Features::Native, Needs::Ebpf)
    }),
    full(run(
        "behaviour_table",
        &["ebpf::"],
        Features::AllOff,
        Needs::Ebpf,
    )),
    full(run(
        "agent",
        &[
            "pods_registered_through_the_api_are_intercepted_until_removed",
            "a_killed_agent_leaves_pods_intercepted_and_the_next_one_takes_them_back",
        ],
        Features::Native,
        Needs::Ebpf,
    )),
    // The previous release's agent handing its pods to this tree's and taking them back (the
    // host runs both in the test command): with the programs where they load, with proxy-init's
    // chains where they cannot.
    full(run(
        "upgrade",
        &["an_ebpf_node_"],
        Features::Native,
        Needs::Ebpf,
    )),
    full(run(
        "upgrade",
        &["an_iptables_node_"],
        Features::Native,
        Needs::NoEbpf,
    )),
    full(run(
        "cni",
        &[
            "pods_added_by_the_runtime_are_intercepted_from_their_first_connect",
            "only_the_pods_linkerd_injected_are_meshed_each_with_its_own_annotations",
        ],
        Features::Native,
        Needs::Ebpf,
    )),
];

/// What a kernel is expected to do with a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expectation {
    /// Every test passes.
    Pass,
    /// Not run: the kernel cannot support it.
    Impossible(&'static str),
    /// Not run in the core on this kernel: other runs cover it here.
    Covered(&'static str),
}

pub fn expectation(run: &TestRun, kernel: (u32, u32)) -> Expectation {
    match run.needs {
        Needs::Any => Expectation::Pass,
        Needs::Ebpf if kernel >= EBPF_MIN => Expectation::Pass,
        Needs::Ebpf => Expectation::Impossible(EBPF_REASON),
        Needs::NoEbpf if kernel < EBPF_MIN => Expectation::Pass,
        Needs::NoEbpf => Expectation::Covered(COVERED_ELSEWHERE),
    }
}

/// `(major, minor)` of a release such as `6.1.0-50-amd64`.
pub fn major_minor(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}
