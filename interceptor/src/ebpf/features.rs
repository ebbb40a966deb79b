//! What this kernel offers the programs, probed once per process by loading a few instructions
//! that use each feature (as `bpftool feature probe` does), never guessed from a version:
//! distributions backport features, and RHEL 9's 5.14 is not upstream's 5.14.
//!
//! `INTERCEPTOR_KERNEL_FEATURES` takes features away for tests: `-ingress_ifindex` makes the
//! loader act as on a kernel without it (it picks the variant made for such kernels), `-all`
//! takes away every feature a variant can do without, `-atomics` (or any required feature)
//! makes the eBPF backend unusable, as on 5.10. It can only take away,
//! never pretend a feature is there.
use std::{collections::BTreeSet, fmt, sync::OnceLock};

use interceptor_sys::{
    BPF_CMPXCHG, ProgLoad,
    asm::{ATOMIC_DW, CALL, EXIT, JEQ_IMM, LDX_DW, LDX_W, MOV64_IMM, SK_PASS, ST_DW},
    bpf_attach_type, bpf_func_id, bpf_insn as Insn, bpf_prog_type, insn,
};
use serde::{Deserialize, Serialize};

/// The variable that takes features away (tests, and a user working around a kernel bug).
pub const FEATURES_ENV: &str = "INTERCEPTOR_KERNEL_FEATURES";

/// A kernel feature the programs use, with the upstream version that brought it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Feature {
    /// BPF compare-and-exchange and exchange (`BPF_ATOMIC`, Linux 5.12): the slot arrays.
    /// Required: every kernel with `bpf_get_netns_cookie` in sock_ops and getsockopt (5.15) has
    /// it, so the programs have no variant without it.
    Atomics,
    /// `bpf_sk_lookup.ingress_ifindex` (Linux 5.17): loopback told by the interface.
    IngressIfindex,
    /// `bpf_get_netns_cookie` in sock_ops (Linux 5.15): which pod a connection is in.
    NetnsCookieSockops,
    /// `bpf_get_netns_cookie` in cgroup/getsockopt (Linux 5.15): which pod asks.
    NetnsCookieGetsockopt,
    /// `getsockopt(SO_NETNS_COOKIE)` (Linux 5.14): the agent learns a pod's key.
    SoNetnsCookie,
    /// `bpf_skc_to_tcp_sock` in cgroup/connect4 (Linux 5.9) and the kernel's BTF with the
    /// fields from a socket to its creator's credentials: the proxy's UID and GID told as
    /// iptables' owner match tells them.
    SocketCreator,
}

impl Feature {
    pub const ALL: [Feature; 6] = [
        Feature::Atomics,
        Feature::IngressIfindex,
        Feature::NetnsCookieSockops,
        Feature::NetnsCookieGetsockopt,
        Feature::SoNetnsCookie,
        Feature::SocketCreator,
    ];

    /// The features some program variant does without (what `-all` takes away).
    pub const OPTIONAL: [Feature; 2] = [Feature::IngressIfindex, Feature::SocketCreator];

    pub fn name(self) -> &'static str {
        match self {
            Feature::Atomics => "atomics",
            Feature::IngressIfindex => "ingress_ifindex",
            Feature::NetnsCookieSockops => "netns_cookie_sockops",
            Feature::NetnsCookieGetsockopt => "netns_cookie_getsockopt",
            Feature::SoNetnsCookie => "so_netns_cookie",
            Feature::SocketCreator => "socket_creator",
        }
    }

    /// What it is, for users: names the upstream kernel that brought it.
    pub fn describe(self) -> &'static str {
        match self {
            Feature::Atomics => "BPF atomic compare-and-exchange (Linux 5.12)",
            Feature::IngressIfindex => "ingress_ifindex in the sk_lookup context (Linux 5.17)",
            Feature::NetnsCookieSockops => "bpf_get_netns_cookie in sock_ops (Linux 5.15)",
            Feature::NetnsCookieGetsockopt => {
                "bpf_get_netns_cookie in cgroup/getsockopt (Linux 5.15)"
            }
            Feature::SoNetnsCookie => "SO_NETNS_COOKIE socket option (Linux 5.14)",
            Feature::SocketCreator => {
                "BTF access to a socket's creator from cgroup/connect4 (Linux 5.9 with BTF)"
            }
        }
    }

    fn probe(self) -> bool {
        match self {
            Feature::Atomics => loads(
                bpf_prog_type::BPF_PROG_TYPE_SOCKET_FILTER,
                None,
                &compare_exchange_on_stack(),
            ),
            Feature::IngressIfindex => loads(
                bpf_prog_type::BPF_PROG_TYPE_SK_LOOKUP,
                Some(bpf_attach_type::BPF_SK_LOOKUP),
                &[
                    insn(
                        LDX_W,
                        2,
                        1,
                        interceptor_common::sk_lookup_ctx::INGRESS_IFINDEX,
                        0,
                    ),
                    insn(MOV64_IMM, 0, 0, 0, SK_PASS),
                    insn(EXIT, 0, 0, 0, 0),
                ],
            ),
            Feature::NetnsCookieSockops => loads(
                bpf_prog_type::BPF_PROG_TYPE_SOCK_OPS,
                None,
                &netns_cookie_of_ctx(),
            ),
            Feature::NetnsCookieGetsockopt => loads(
                bpf_prog_type::BPF_PROG_TYPE_CGROUP_SOCKOPT,
                Some(bpf_attach_type::BPF_CGROUP_GETSOCKOPT),
                &netns_cookie_of_ctx(),
            ),
            Feature::SoNetnsCookie => {
                crate::netns::PodNetns::open(std::path::Path::new("/proc/self/ns/net"))
                    .and_then(|ns| ns.cookie())
                    .is_ok()
            }
            Feature::SocketCreator => super::creds::offsets()
                .and_then(socket_creator_walk)
                .is_some_and(|insns| {
                    loads(
                        bpf_prog_type::BPF_PROG_TYPE_CGROUP_SOCK_ADDR,
                        Some(bpf_attach_type::BPF_CGROUP_INET4_CONNECT),
                        &insns,
                    )
                }),
        }
    }
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The features of this kernel, less those taken away by [`FEATURES_ENV`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelFeatures {
    /// What the probes found.
    pub probed: BTreeSet<Feature>,
    /// Taken away by [`FEATURES_ENV`].
    pub taken_away: BTreeSet<Feature>,
}

impl KernelFeatures {
    /// This kernel's, probed on first use.
    pub fn get() -> &'static KernelFeatures {
        static FEATURES: OnceLock<KernelFeatures> = OnceLock::new();
        FEATURES.get_or_init(|| {
            let probed = Feature::ALL.into_iter().filter(|f| f.probe()).collect();
            let taken_away = match std::env::var(FEATURES_ENV) {
                Ok(value) => taken_away(&value).unwrap_or_else(|e| {
                    tracing::warn!(variable = FEATURES_ENV, %value, error = %e, "ignored");
                    BTreeSet::new()
                }),
                Err(_) => BTreeSet::new(),
            };
            KernelFeatures { probed, taken_away }
        })
    }

    pub fn has(&self, feature: Feature) -> bool {
        self.probed.contains(&feature) && !self.taken_away.contains(&feature)
    }

    /// Why `feature` is missing, for a log line or `status`.
    pub fn why_missing(&self, feature: Feature) -> String {
        if self.probed.contains(&feature) {
            format!("{} taken away by {FEATURES_ENV}", feature.describe())
        } else {
            format!("this kernel has no {}", feature.describe())
        }
    }
}

/// Parses `-a,-b` or `-all`.
fn taken_away(value: &str) -> Result<BTreeSet<Feature>, String> {
    let mut away = BTreeSet::new();
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let name = item
            .strip_prefix('-')
            .ok_or_else(|| format!("{item:?}: features can only be taken away, as -{item}"))?;
        if name == "all" {
            away.extend(Feature::OPTIONAL);
            continue;
        }
        let feature = Feature::ALL
            .into_iter()
            .find(|f| f.name() == name)
            .ok_or_else(|| {
                let known: Vec<_> = Feature::ALL.iter().map(|f| f.name()).collect();
                format!(
                    "{name:?} is not a feature; known: all, {}",
                    known.join(", ")
                )
            })?;
        away.insert(feature);
    }
    Ok(away)
}

fn loads(prog_type: bpf_prog_type, attach: Option<bpf_attach_type>, insns: &[Insn]) -> bool {
    interceptor_sys::prog_load(&ProgLoad {
        prog_type,
        expected_attach_type: attach,
        name: "icpt_probe",
        insns,
        license: c"GPL",
    })
    .is_ok()
}

/// `*(u64 *)(r10 - 8) = 0; r0 = 0; r0 = cmpxchg(r10 - 8, r0, r1); r0 = 0; exit`: before 5.12 the
/// verifier refuses the atomic's `imm` ("BPF_STX uses reserved fields").
fn compare_exchange_on_stack() -> [Insn; 6] {
    [
        insn(ST_DW, 10, 0, -8, 0),
        insn(MOV64_IMM, 0, 0, 0, 0),
        insn(MOV64_IMM, 1, 0, 0, 1),
        insn(ATOMIC_DW, 10, 1, -8, BPF_CMPXCHG as i32),
        insn(MOV64_IMM, 0, 0, 0, 0),
        insn(EXIT, 0, 0, 0, 0),
    ]
}

/// `call bpf_get_netns_cookie(ctx); r0 = 1; exit`: "unknown func bpf_get_netns_cookie#122"
/// where the program type may not call it.
fn netns_cookie_of_ctx() -> [Insn; 3] {
    [
        insn(CALL, 0, 0, 0, bpf_func_id::BPF_FUNC_get_netns_cookie as i32),
        insn(MOV64_IMM, 0, 0, 0, 1),
        insn(EXIT, 0, 0, 0, 0),
    ]
}

/// The connect programs' walk from the context to the socket's creator, load for load at this
/// kernel's offsets (`interceptor-ebpf/src/creds.rs`): `ctx->sk`, `bpf_skc_to_tcp_sock`, then
/// `->sk_socket->file->f_cred->{fsuid,fsgid}`, each pointer tested for null. "unknown func"
/// where connect4 may not call the helper (before 5.9, or without CAP_PERFMON); a kernel whose
/// verifier refuses a load through one of these BTF pointers refuses the probe too, so the
/// programs fall back to the task's IDs rather than fail to load. `None` where an offset does
/// not fit an instruction.
fn socket_creator_walk(offsets: &interceptor_common::CredOffsets) -> Option<[Insn; 13]> {
    let at = |offset: u32| i16::try_from(offset).ok();
    // Each null test jumps to the `r0 = 1` at index 11.
    let out = |from: i16| 10 - from;
    Some([
        insn(LDX_DW, 1, 1, interceptor_common::creds::SOCK_ADDR_CTX_SK, 0),
        insn(CALL, 0, 0, 0, bpf_func_id::BPF_FUNC_skc_to_tcp_sock as i32),
        insn(JEQ_IMM, 0, 0, out(2), 0),
        insn(LDX_DW, 1, 0, at(offsets.sock_socket)?, 0),
        insn(JEQ_IMM, 1, 0, out(4), 0),
        insn(LDX_DW, 1, 1, at(offsets.socket_file)?, 0),
        insn(JEQ_IMM, 1, 0, out(6), 0),
        insn(LDX_DW, 1, 1, at(offsets.file_cred)?, 0),
        insn(JEQ_IMM, 1, 0, out(8), 0),
        insn(LDX_W, 2, 1, at(offsets.cred_fsuid)?, 0),
        insn(LDX_W, 2, 1, at(offsets.cred_fsgid)?, 0),
        insn(MOV64_IMM, 0, 0, 0, 1),
        insn(EXIT, 0, 0, 0, 0),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_creator_probe_walks_the_pointers_the_programs_walk() {
        if !nix::unistd::geteuid().is_root() {
            assert!(
                std::env::var_os("INTERCEPTOR_REQUIRE_PRIVILEGED").is_none(),
                "this test loads programs: run as root, e.g. sudo -E cargo xtask test"
            );
            eprintln!("skipped: loading programs needs root");
            return;
        }
        let offsets = super::super::creds::offsets().expect("this kernel has BTF");
        let load = |offsets| {
            loads(
                bpf_prog_type::BPF_PROG_TYPE_CGROUP_SOCK_ADDR,
                Some(bpf_attach_type::BPF_CGROUP_INET4_CONNECT),
                &socket_creator_walk(offsets).expect("offsets that fit"),
            )
        };
        assert!(load(offsets));
        // Taking a field that is no pointer (the first of `struct sock`, its address pair) for
        // `sk_socket`: the next load is through a scalar, which the verifier refuses, so the
        // probe fails wherever the programs' walk would.
        let wrong = interceptor_common::CredOffsets {
            sock_socket: 0,
            ..*offsets
        };
        assert!(!load(&wrong));
    }

    #[test]
    fn features_are_taken_away_by_name_or_all() {
        assert_eq!(
            taken_away("-atomics, -ingress_ifindex").unwrap(),
            BTreeSet::from([Feature::Atomics, Feature::IngressIfindex])
        );
        assert_eq!(
            taken_away("-all").unwrap(),
            BTreeSet::from(Feature::OPTIONAL)
        );
        assert_eq!(taken_away("").unwrap(), BTreeSet::new());
        assert!(taken_away("atomics").unwrap_err().contains("-atomics"));
        assert!(
            taken_away("-atomic")
                .unwrap_err()
                .contains("known: all, atomics")
        );
    }

    #[test]
    fn names_round_trip_through_serde() {
        for feature in Feature::ALL {
            let json = serde_json::to_string(&feature).unwrap();
            assert_eq!(json, format!("\"{}\"", feature.name()));
        }
    }
}
