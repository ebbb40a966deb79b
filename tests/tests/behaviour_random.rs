//! The randomized behaviour table (`interceptor_tests::random`): seeded random proxy-init
//! configurations, each with random probes, on eBPF, iptables-legacy and iptables-nft; every
//! probe must come to the same on all three as on iptables-legacy (proxy-init's own behaviour):
//! where it lands, the original destination the proxy reads, the client the server sees, and
//! the app's `getpeername()` before and after the peer closes.
//!
//! `INTERCEPTOR_RANDOM_SEED=N` runs the configuration of seed N alone (each configuration's
//! seed is printed); `INTERCEPTOR_RANDOM_CONFIGS=N` runs N configurations (default
//! [`DEFAULT_CONFIGS`]) from a base seed drawn from the clock, printed too, or given by
//! `INTERCEPTOR_RANDOM_BASE_SEED`. `INTERCEPTOR_RANDOM_VERBOSE=1` prints every probe and what
//! each backend made of it.
use interceptor_tests::{
    privileged,
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
        "the backends disagree with iptables-legacy (proxy-init):\n{}",
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
