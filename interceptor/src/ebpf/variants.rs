//! Which program runs at each hook on this kernel. Every hook has the program written for
//! current kernels and, where an older kernel lacks something it uses and the behaviour can be
//! kept without it, a variant that does without (built from the same code, see
//! `interceptor-ebpf`). The first variant whose features the kernel has is loaded; a hook with
//! none makes the eBPF backend unusable here, and `--mode auto` falls back to iptables.
use serde::{Deserialize, Serialize};

use interceptor_common::names;
use interceptor_sys::bpf_attach_type;

use super::features::{Feature, KernelFeatures};

/// Where a program runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    Connect4,
    Connect6,
    SockOps,
    GetSockopt,
    PeerName4,
    PeerName6,
    /// Not attached: each pod's own program tail-calls it.
    SkLookup,
}

impl Hook {
    pub const ALL: [Hook; 7] = [
        Hook::Connect4,
        Hook::Connect6,
        Hook::SockOps,
        Hook::GetSockopt,
        Hook::PeerName4,
        Hook::PeerName6,
        Hook::SkLookup,
    ];

    /// The cgroup hook it attaches to; `None` for the tail-called sk_lookup program.
    pub fn attach_type(self) -> Option<bpf_attach_type> {
        Some(match self {
            Hook::Connect4 => bpf_attach_type::BPF_CGROUP_INET4_CONNECT,
            Hook::Connect6 => bpf_attach_type::BPF_CGROUP_INET6_CONNECT,
            Hook::SockOps => bpf_attach_type::BPF_CGROUP_SOCK_OPS,
            Hook::GetSockopt => bpf_attach_type::BPF_CGROUP_GETSOCKOPT,
            Hook::PeerName4 => bpf_attach_type::BPF_CGROUP_INET4_GETPEERNAME,
            Hook::PeerName6 => bpf_attach_type::BPF_CGROUP_INET6_GETPEERNAME,
            Hook::SkLookup => return None,
        })
    }

    pub fn describe(self) -> &'static str {
        match self {
            Hook::Connect4 => "cgroup/connect4",
            Hook::Connect6 => "cgroup/connect6",
            Hook::SockOps => "sock_ops",
            Hook::GetSockopt => "cgroup/getsockopt",
            Hook::PeerName4 => "cgroup/getpeername4",
            Hook::PeerName6 => "cgroup/getpeername6",
            Hook::SkLookup => "sk_lookup, tail-called",
        }
    }

    /// The name its link is pinned under: the main program's, whichever variant runs, so an
    /// agent of another variant (or an older agent) finds and updates the same link.
    pub fn link_name(self) -> &'static str {
        VARIANTS
            .iter()
            .find(|v| v.hook == self)
            .map(|v| v.program)
            .expect("every hook has a variant")
    }
}

/// One program the object holds for a hook.
#[derive(Clone, Copy, Debug)]
pub struct Variant {
    pub hook: Hook,
    pub program: &'static str,
    /// What it does differently, for `status`.
    pub name: &'static str,
    /// What the kernel must offer for it to load.
    pub needs: &'static [Feature],
    /// Where it makes a connection land otherwise than proxy-init's chains, if anywhere.
    pub differs: Option<&'static str>,
}

/// The `task IDs` connect programs' difference from proxy-init's chains.
const TASK_IDS_DIFFER: &str = "the proxy's UID and GID are told by the connecting task's real IDs, where iptables' owner match reads the credentials the socket was created with (fsuid, fsgid): a process whose real and effective IDs differ, or a socket created before its process became the proxy's user, lands otherwise";

/// In order of preference per hook: the first whose needs the kernel meets is loaded.
///
/// connect4/6's `task IDs` variant tells the proxy's UID and GID by the connecting task's real
/// IDs, where iptables' owner match reads the socket's creator's (`fsuid`, `fsgid`): a process
/// whose real and effective IDs differ, or a socket made before its process became the proxy's
/// user, lands differently there. `interceptor kernel` and the behaviour table say so.
///
/// connect4/6 and sock_ops have no variant without BPF atomics (5.12), though one could keep
/// the behaviour with the LRU maps alone: it would only run where sock_ops and getsockopt can
/// ask for the netns cookie (5.15) and atomics are missing, which no kernel is, and it cost
/// 1.5 µs a connection more.
pub const VARIANTS: [Variant; 10] = [
    Variant {
        hook: Hook::Connect4,
        program: names::PROG_CONNECT4,
        name: "creator IDs",
        needs: &[Feature::Atomics, Feature::SocketCreator],
        differs: None,
    },
    Variant {
        hook: Hook::Connect4,
        program: names::PROG_CONNECT4_TASK,
        name: "task IDs",
        needs: &[Feature::Atomics],
        differs: Some(TASK_IDS_DIFFER),
    },
    Variant {
        hook: Hook::Connect6,
        program: names::PROG_CONNECT6,
        name: "creator IDs",
        needs: &[Feature::Atomics, Feature::SocketCreator],
        differs: None,
    },
    Variant {
        hook: Hook::Connect6,
        program: names::PROG_CONNECT6_TASK,
        name: "task IDs",
        needs: &[Feature::Atomics],
        differs: Some(TASK_IDS_DIFFER),
    },
    Variant {
        hook: Hook::SockOps,
        program: names::PROG_SOCKOPS,
        name: "slots",
        needs: &[Feature::Atomics, Feature::NetnsCookieSockops],
        differs: None,
    },
    Variant {
        hook: Hook::GetSockopt,
        program: names::PROG_GETSOCKOPT,
        name: "main",
        needs: &[Feature::NetnsCookieGetsockopt],
        differs: None,
    },
    Variant {
        hook: Hook::PeerName4,
        program: names::PROG_PEERNAME4,
        name: "main",
        needs: &[],
        differs: None,
    },
    Variant {
        hook: Hook::PeerName6,
        program: names::PROG_PEERNAME6,
        name: "main",
        needs: &[],
        differs: None,
    },
    Variant {
        hook: Hook::SkLookup,
        program: names::PROG_SK_LOOKUP,
        name: "ifindex",
        needs: &[Feature::IngressIfindex],
        differs: None,
    },
    Variant {
        hook: Hook::SkLookup,
        program: names::PROG_SK_LOOKUP_ADDR,
        name: "address",
        needs: &[],
        differs: None,
    },
];

/// The variant chosen for a hook, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chosen {
    pub program: String,
    pub variant: String,
    /// Empty for a hook's first choice; else what the kernel lacks for the better ones.
    pub reason: String,
}

/// The programs to load on a kernel with `features`, one per hook in [`Hook::ALL`] order, or
/// everything that keeps the eBPF backend from working there.
pub fn choose(features: &KernelFeatures) -> Result<Vec<(Hook, Variant, Chosen)>, String> {
    let mut missing = Vec::new();
    if !features.has(Feature::SoNetnsCookie) {
        missing.push(format!(
            "pods are keyed by their network namespace's cookie, and {}",
            features.why_missing(Feature::SoNetnsCookie)
        ));
    }
    let mut chosen = Vec::new();
    for hook in Hook::ALL {
        let mut passed_over = Vec::new();
        let found = VARIANTS.iter().filter(|v| v.hook == hook).find(|variant| {
            match variant.needs.iter().find(|f| !features.has(**f)) {
                None => true,
                Some(lacking) => {
                    passed_over.push(format!(
                        "not {}: {}",
                        variant.name,
                        features.why_missing(*lacking)
                    ));
                    false
                }
            }
        });
        match found {
            Some(variant) => chosen.push((
                hook,
                *variant,
                Chosen {
                    program: variant.program.to_owned(),
                    variant: variant.name.to_owned(),
                    reason: passed_over.join("; "),
                },
            )),
            None => missing.push(format!(
                "no {} program works here ({})",
                hook.describe(),
                passed_over.join("; ")
            )),
        }
    }
    if missing.is_empty() {
        Ok(chosen)
    } else {
        Err(missing.join("; "))
    }
}

/// One line saying which variant runs at each hook, and why where it is not the first choice.
pub fn log(chosen: &[(Hook, Variant, Chosen)]) {
    let summary: Vec<String> = chosen
        .iter()
        .map(|(hook, _, c)| {
            let hook = hook.describe().split(',').next().unwrap_or_default();
            format!("{hook}={}", c.variant)
        })
        .collect();
    let features = &super::features::KernelFeatures::get();
    let missing: Vec<String> = Feature::ALL
        .iter()
        .filter(|f| !features.has(**f))
        .map(|f| features.why_missing(*f))
        .collect();
    tracing::info!(
        variants = %summary.join(" "),
        missing = %missing.join("; "),
        "eBPF program variants for this kernel"
    );
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn features(without: &[Feature]) -> KernelFeatures {
        KernelFeatures {
            probed: Feature::ALL
                .into_iter()
                .filter(|f| !without.contains(f))
                .collect(),
            taken_away: BTreeSet::new(),
        }
    }

    fn programs(chosen: &[(Hook, Variant, Chosen)]) -> Vec<&'static str> {
        chosen.iter().map(|(_, v, _)| v.program).collect()
    }

    #[test]
    fn a_current_kernel_runs_every_main_program() {
        let chosen = choose(&features(&[])).unwrap();
        assert_eq!(
            programs(&chosen),
            [
                names::PROG_CONNECT4,
                names::PROG_CONNECT6,
                names::PROG_SOCKOPS,
                names::PROG_GETSOCKOPT,
                names::PROG_PEERNAME4,
                names::PROG_PEERNAME6,
                names::PROG_SK_LOOKUP,
            ]
        );
        assert!(chosen.iter().all(|(_, _, c)| c.reason.is_empty()));
    }

    #[test]
    fn each_missing_optional_feature_picks_its_variant_and_says_why() {
        let chosen = choose(&features(&Feature::OPTIONAL)).unwrap();
        assert_eq!(
            programs(&chosen),
            [
                names::PROG_CONNECT4_TASK,
                names::PROG_CONNECT6_TASK,
                names::PROG_SOCKOPS,
                names::PROG_GETSOCKOPT,
                names::PROG_PEERNAME4,
                names::PROG_PEERNAME6,
                names::PROG_SK_LOOKUP_ADDR,
            ]
        );
        let (_, _, sk_lookup) = &chosen[6];
        assert!(
            sk_lookup.reason.contains("sk_lookup context (Linux 5.17)"),
            "{sk_lookup:?}"
        );
        let (_, _, connect4) = &chosen[0];
        assert!(connect4.reason.contains("socket's creator"), "{connect4:?}");
    }

    #[test]
    fn a_kernel_without_a_required_feature_cannot_run_the_programs() {
        let err = choose(&features(&[Feature::NetnsCookieGetsockopt])).unwrap_err();
        assert!(err.contains("cgroup/getsockopt"), "{err}");
        // No kernel that lacks atomics can run sock_ops and getsockopt anyway.
        let err = choose(&features(&[Feature::Atomics])).unwrap_err();
        for hook in ["cgroup/connect4", "cgroup/connect6", "sock_ops"] {
            assert!(err.contains(&format!("no {hook} program")), "{hook}: {err}");
        }
        assert!(err.contains("compare-and-exchange (Linux 5.12)"), "{err}");
        let err = choose(&features(&[Feature::SoNetnsCookie])).unwrap_err();
        assert!(err.contains("SO_NETNS_COOKIE"), "{err}");
        // Everything missing is named, as on 5.10.
        let err = choose(&features(&Feature::ALL)).unwrap_err();
        for named in [
            "SO_NETNS_COOKIE",
            "no cgroup/connect4 program",
            "no sock_ops program",
            "no cgroup/getsockopt program",
        ] {
            assert!(err.contains(named), "{named}: {err}");
        }
    }

    #[test]
    fn every_link_keeps_the_main_programs_name() {
        assert_eq!(Hook::Connect4.link_name(), names::PROG_CONNECT4);
        assert_eq!(Hook::SockOps.link_name(), names::PROG_SOCKOPS);
        assert_eq!(Hook::SkLookup.link_name(), names::PROG_SK_LOOKUP);
    }
}
