//! The randomized behaviour table (`interceptor_tests::random`): seeded random proxy-init
//! configurations, each with random probes, on eBPF and our iptables backend (legacy and nft);
//! every probe must come to the same on all three as with proxy-init's own rules (the
//! transcription of proxy-init, `interceptor_tests::proxy_init`, run with iptables-legacy):
//! where it lands, the original destination the proxy reads, the client the server sees, and
//! the app's `getpeername()` before and after the peer closes. Our nat tables must be the ones
//! proxy-init's rules leave.
//!
//! `INTERCEPTOR_RANDOM_SEED=N` runs the configuration of seed N alone (each configuration's
//! seed is printed); `INTERCEPTOR_RANDOM_CONFIGS=N` runs N configurations (default
//! [`DEFAULT_CONFIGS`]) from a base seed drawn from the clock, printed too, or given by
//! `INTERCEPTOR_RANDOM_BASE_SEED`. `INTERCEPTOR_RANDOM_VERBOSE=1` prints every probe and what
//! each backend made of it.
use interceptor::iptables::{Existing, Family, install_rules};
use interceptor_tests::{
    privileged, proxy_init,
    random::{Drawn, compare},
};

/// Configurations a run of `cargo xtask test` draws (docs/testing.md says what they cost): issue
/// 39 gave everything it added to the test command (fuzzing, this table on the host and in the
/// kernel matrix) 6 minutes on a fresh 2-core machine. Each run draws new ones (the clock's
/// seed); `--random-configs N` runs more.
const DEFAULT_CONFIGS: u64 = 12;

fn env(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .parse()
            .unwrap_or_else(|e| panic!("{name}={value:?}: {e}")),
    )
}

/// The seeds to run: the one asked for, or a run of consecutive ones.
fn seeds() -> Vec<u64> {
    if let Some(seed) = env("INTERCEPTOR_RANDOM_SEED") {
        return vec![seed];
    }
    let count = env("INTERCEPTOR_RANDOM_CONFIGS").unwrap_or(DEFAULT_CONFIGS);
    let base = env("INTERCEPTOR_RANDOM_BASE_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("the clock is after 1970")
            .as_nanos() as u64
            % 1_000_000_000
    });
    eprintln!(
        "random behaviour table: {count} configurations from seed {base} \
         (INTERCEPTOR_RANDOM_BASE_SEED={base} INTERCEPTOR_RANDOM_CONFIGS={count})"
    );
    (base..base + count).collect()
}

#[test]
fn every_backend_agrees_with_proxy_init_on_random_configurations() {
    if !privileged() {
        return;
    }
    let started = std::time::Instant::now();
    let mut failed = Vec::new();
    for seed in seeds() {
        let drawn = Drawn::new(seed);
        let compared = compare(&drawn);
        let reports = compared.reports;
        eprintln!(
            "seed {seed}: {} probes ({}), {} disagreements ({:.1} s so far): {}",
            drawn.probes.len(),
            compared.landings,
            reports.len(),
            started.elapsed().as_secs_f64(),
            drawn.flags()
        );
        if !reports.is_empty() {
            failed.push(format!(
                "seed {seed} (INTERCEPTOR_RANDOM_SEED={seed}), configuration {}:\n    {}",
                drawn.flags(),
                reports.join("\n    ")
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "the backends disagree with proxy-init's rules:\n{}",
        failed.join("\n")
    );
}

/// A seed is the whole of a configuration and its probes: rerunning one reproduces it.
#[test]
fn a_seed_draws_the_same_configuration_and_probes() {
    for seed in [0, 1, 42, 987_654_321] {
        let (a, b) = (Drawn::new(seed), Drawn::new(seed));
        assert_eq!(a.config, b.config);
        let lines = |d: &Drawn| d.probes.iter().map(|p| p.to_string()).collect::<Vec<_>>();
        assert_eq!(lines(&a), lines(&b));
    }
}

fn strings(args: &str) -> Vec<String> {
    args.split_whitespace().map(str::to_owned).collect()
}

/// proxy-init's commands for flags, every pass's, on a namespace without our chains.
fn proxy_init_commands(flags: &str) -> Vec<String> {
    let (options, extension) = proxy_init::parse_args(&strings(flags))
        .unwrap_or_else(|e| panic!("proxy-init's flags {flags}: {e}"));
    proxy_init::passes(&options, &extension)
        .unwrap_or_else(|e| panic!("proxy-init refuses {flags}: {e}"))
        .iter()
        .flat_map(|pass| pass.commands(""))
        .map(|command| command.join(" "))
        .collect()
}

/// The transcription gives the listing of SPEC's "the chains proxy-init writes" for Linkerd's
/// defaults, and proxy-init's own tests' multiport splits.
#[test]
fn the_transcription_of_proxy_init_writes_the_spec_listing() {
    let expected = "\
-t nat -N PROXY_INIT_REDIRECT
-t nat -A PROXY_INIT_REDIRECT -p tcp --match multiport --dports 4190,4191,4567,4568 -j RETURN -m comment --comment proxy-init/ignore-port-4190,4191,4567,4568
-t nat -A PROXY_INIT_REDIRECT -p tcp -j REDIRECT --to-port 4143 -m comment --comment proxy-init/redirect-all-incoming-to-proxy-port
-t nat -A PREROUTING -j PROXY_INIT_REDIRECT -m comment --comment proxy-init/install-proxy-init-prerouting
-t nat -N PROXY_INIT_OUTPUT
-t nat -A PROXY_INIT_OUTPUT -m owner --uid-owner 2102 -j RETURN -m comment --comment proxy-init/ignore-proxy-user-id
-t nat -A PROXY_INIT_OUTPUT -o lo -j RETURN -m comment --comment proxy-init/ignore-loopback
-t nat -A PROXY_INIT_OUTPUT -p tcp --match multiport --dports 443,6443 -j RETURN -m comment --comment proxy-init/ignore-port-443,6443
-t nat -A PROXY_INIT_OUTPUT -p tcp -j REDIRECT --to-port 4140 -m comment --comment proxy-init/redirect-all-outgoing-to-proxy-port
-t nat -A OUTPUT -j PROXY_INIT_OUTPUT -m comment --comment proxy-init/install-proxy-init-output
";
    let flags = "-p 4143 -o 4140 -u 2102 --inbound-ports-to-ignore 4190,4191,4567,4568 \
                 --outbound-ports-to-ignore 443,6443 --ipv6=false";
    let commands: String = proxy_init_commands(flags)
        .iter()
        .map(|c| format!("{c}\n"))
        .collect();
    assert_eq!(commands, expected, "{flags}");
    // With --ipv6 the same commands again, for ip6tables.
    let both = proxy_init_commands(&flags.replace("--ipv6=false", "--ipv6"));
    assert_eq!(
        both.concat(),
        expected.lines().chain(expected.lines()).collect::<String>()
    );
    // proxy-init's TestMakeMultiportDestinations and its _Split.
    let split =
        |ports: &str| proxy_init::multiport_destinations(&strings(&ports.replace(',', " ")));
    assert_eq!(split("22,25-27,33"), [["22", "25:27", "33"]]);
    assert_eq!(
        split("22-22,25-27,not-a-number,33"),
        [["22", "25:27", "33"]]
    );
    assert_eq!(
        split("22-23,25-27,33-34,35-35,37-38,50-54,56,58,60,63,70-72"),
        [
            vec![
                "22:23", "25:27", "33:34", "35", "37:38", "50:54", "56", "58", "60", "63"
            ],
            vec!["70:72"]
        ]
    );
}

/// Our rendering of proxy-init's chains (`interceptor::iptables::install_rules`) is the
/// transcription's, command for command, for many drawn configurations (the table itself runs
/// a dozen), on a namespace without our chains and on one where a run left them (flushed and
/// refilled, no second jump).
#[test]
fn our_rules_are_proxy_inits_for_drawn_configurations() {
    let left = "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
                :PROXY_INIT_OUTPUT - [0:0]\n:PROXY_INIT_REDIRECT - [0:0]\n\
                -A PREROUTING -m comment --comment \"proxy-init/install-proxy-init-prerouting\" -j PROXY_INIT_REDIRECT\n\
                -A OUTPUT -m comment --comment \"proxy-init/install-proxy-init-output\" -j PROXY_INIT_OUTPUT\nCOMMIT\n";
    let rerun = Existing {
        redirect_chain: true,
        output_chain: true,
        prerouting_jump: true,
        output_jump: true,
    };
    for seed in 0..3000 {
        let drawn = Drawn::new(seed);
        let (options, extension) = proxy_init::parse_args(&drawn.args).expect("drawn flags");
        let passes = proxy_init::passes(&options, &extension).expect("drawn flags");
        for (existing, save) in [(Existing::default(), ""), (rerun, left)] {
            for pass in &passes {
                let family = match pass.pass {
                    proxy_init::Pass::V4 => Family::V4,
                    proxy_init::Pass::V6 => Family::V6,
                };
                let ours: Vec<String> = install_rules(&drawn.config, family, existing)
                    .iter()
                    .map(ToString::to_string)
                    .collect();
                let theirs: Vec<String> = pass.commands(save).iter().map(|c| c.join(" ")).collect();
                assert_eq!(
                    ours,
                    theirs,
                    "seed {seed} ({family:?}, {existing:?}): {}",
                    drawn.flags()
                );
            }
        }
    }
}

/// Where proxy-init and we part ways on purpose, as `proxy_init::accepted_by_both` says, and
/// why the table draws none of these: we take what proxy-init refuses or silently drops, or
/// refuse what it takes.
#[test]
fn proxy_init_and_we_part_ways_only_where_the_spec_says() {
    let base = "-p 4143 -o 4140 -u 2102";
    for (extra, we_take_it) in [
        // iptables refuses a CIDR of the other family: proxy-init fails half-way.
        ("--subnets-to-ignore fd00::/8 --ipv6=false", true),
        ("--subnets-to-ignore 10.0.0.0/8 --ipv6=true", true),
        ("--subnets-to-ignore ::ffff:10.0.0.0/104 --ipv6=true", true),
        // Go's net.ParseCIDR refuses a bare address.
        ("--subnets-to-ignore 10.0.0.1 --ipv6=false", true),
        // Both match 10.0.0.0/8; the comments differ (below).
        ("--subnets-to-ignore 10.1.2.3/8 --ipv6=false", true),
        // proxy-init drops a malformed entry and takes port 0; we refuse both.
        ("--inbound-ports-to-ignore 4190,banana --ipv6=false", false),
        ("--outbound-ports-to-ignore 0 --ipv6=false", false),
        ("--inbound-ports-to-ignore 30-20 --ipv6=false", false),
    ] {
        let args = strings(&format!("{base} {extra}"));
        assert!(
            proxy_init::accepted_by_both(&args).is_err(),
            "{extra}: drawn, yet proxy-init and we do not agree on it"
        );
        assert_eq!(
            interceptor::config::InterceptionConfig::from_proxy_init_args(&args).is_ok(),
            we_take_it,
            "{extra}"
        );
    }
    // The comment of a subnet with host bits: proxy-init's keeps the text, ours the network.
    let args = strings(&format!(
        "{base} --subnets-to-ignore 10.1.2.3/8 --ipv6=false"
    ));
    let ours = interceptor::config::InterceptionConfig::from_proxy_init_args(&args).expect("ours");
    let subnet_rule = |commands: Vec<String>| {
        commands
            .into_iter()
            .find(|c| c.contains(" -s "))
            .expect("a subnet rule")
    };
    assert_eq!(
        subnet_rule(proxy_init_commands(&args.join(" "))),
        "-t nat -A PROXY_INIT_REDIRECT -p all -j RETURN -s 10.1.2.3/8 -m comment --comment proxy-init/ignore-subnet-10.1.2.3/8"
    );
    assert_eq!(
        subnet_rule(
            install_rules(&ours, Family::V4, Existing::default())
                .iter()
                .map(ToString::to_string)
                .collect()
        ),
        "-t nat -A PROXY_INIT_REDIRECT -p all -j RETURN -s 10.0.0.0/8 -m comment --comment proxy-init/ignore-subnet-10.0.0.0/8"
    );
    assert_eq!(
        proxy_init::accepted_by_both(&strings(&format!(
            "{base} --subnets-to-ignore 0.0.0.0/0,10.0.0.0/8 --inbound-ports-to-ignore 4140-4143 \
             --proxy-gid 0 --ipv6=false"
        ))),
        Ok(())
    );
}
