//! `iptables-save -t nat`, as the agent reads it in a pod's namespace: which of proxy-init's
//! chains and jumps are there before it writes them, and which lines are its own when it checks
//! them. Whatever else the table holds (a CNI's chains, rules the pod's containers wrote with
//! `NET_ADMIN`) is someone else's, and must never pass for ours.

/// proxy-init's inbound chain, jumped to from `PREROUTING`.
pub const REDIRECT_CHAIN: &str = "PROXY_INIT_REDIRECT";
/// proxy-init's outbound chain, jumped to from `OUTPUT`.
pub const OUTPUT_CHAIN: &str = "PROXY_INIT_OUTPUT";

/// Where the installation stands before it runs: re-running flushes an existing chain instead of
/// creating it, and never adds a jump twice.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Existing {
    pub redirect_chain: bool,
    pub output_chain: bool,
    pub prerouting_jump: bool,
    pub output_jump: bool,
}

/// Which of our chains and jumps `iptables-save -t nat` output (`save`) holds.
pub fn existing(save: &str) -> Existing {
    let declared = |chain: &str| save.lines().any(|l| declares(l, chain));
    let jumped = |from: &str, to: &str| save.lines().any(|l| jumps(l, from, to));
    Existing {
        redirect_chain: declared(REDIRECT_CHAIN),
        output_chain: declared(OUTPUT_CHAIN),
        prerouting_jump: jumped("PREROUTING", REDIRECT_CHAIN),
        output_jump: jumped("OUTPUT", OUTPUT_CHAIN),
    }
}

/// The lines of `iptables-save -t nat` output that are ours: the rules of our two chains and the
/// jumps to them (not the chains' declarations, whose counters change).
pub fn ours(save: &str) -> Vec<&str> {
    save.lines()
        .filter(|line| {
            [REDIRECT_CHAIN, OUTPUT_CHAIN]
                .iter()
                .any(|chain| line.starts_with(&format!("-A {chain} ")))
                || jumps(line, "PREROUTING", REDIRECT_CHAIN)
                || jumps(line, "OUTPUT", OUTPUT_CHAIN)
        })
        .collect()
}

/// `:CHAIN POLICY [packets:bytes]`.
fn declares(line: &str, chain: &str) -> bool {
    line.strip_prefix(':')
        .and_then(|rest| rest.strip_prefix(chain))
        .is_some_and(|rest| rest.starts_with(' '))
}

/// A rule of `from` whose target is `to`: iptables-save writes the target last (`-j CHAIN`, a
/// chain's jump has no target options), after matches such as a comment, which may hold
/// anything, `-j` and our chain's name included.
fn jumps(line: &str, from: &str, to: &str) -> bool {
    line.starts_with(&format!("-A {from} ")) && line.ends_with(&format!(" -j {to}"))
}

#[cfg(test)]
#[path = "iptables_tests.rs"]
mod tests;
