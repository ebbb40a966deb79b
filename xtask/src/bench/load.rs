//! One timed run of `connload` (the lean load generator and proxy in `tests/`) against a pod set
//! up for one mode, and what it measured.
use std::{fmt, path::Path, process::Command};

use anyhow::{Context as _, ensure};
use serde_json::Value;

use crate::{
    cmd,
    sandbox::{APP_UID, POD_ADDR, POD_ADDR6, Pod},
};

/// Which way the connections go.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Direction {
    /// The pod's app connects out (connect4/6, sock_ops, getsockopt; iptables OUTPUT).
    Outbound,
    /// The pod's peer connects in (sk_lookup, sock_ops and getsockopt on the proxy's side;
    /// iptables PREROUTING).
    Inbound,
}

/// Which sockets the app connects with.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Family {
    /// AF_INET sockets (connect4).
    Ipv4,
    /// AF_INET6 sockets to IPv4-mapped addresses: IPv4 connections through connect6.
    Ipv4Mapped,
    /// Native IPv6 (connect6, the ip6tables pass).
    Ipv6,
}

/// How each connection ends.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Close {
    /// SO_LINGER 0 on the app's side: an RST, nothing left behind.
    Rst,
    /// A normal close, the pod's side first (the app outbound, the proxy inbound): FIN both
    /// ways and TIME_WAIT in the pod. (A single inbound client closing first would soon have
    /// every port of its address in TIME_WAIT, whatever the mode.)
    Fin,
}

/// What is in force in the pod.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    /// Nothing: the app (or peer) connects to the proxy itself. The same work minus
    /// interception, the limit the others are compared with.
    Limit,
    Ebpf,
    IptablesLegacy,
    IptablesNft,
}

pub const MODES: [Mode; 4] = [
    Mode::Limit,
    Mode::Ebpf,
    Mode::IptablesLegacy,
    Mode::IptablesNft,
];

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Limit => "no interception",
            Mode::Ebpf => "eBPF",
            Mode::IptablesLegacy => "iptables-legacy",
            Mode::IptablesNft => "iptables-nft",
        }
    }
}

/// One configuration the modes are compared in.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Case {
    pub direction: Direction,
    pub family: Family,
    pub workers: usize,
    pub pinned: bool,
    pub close: Close,
    /// Ports in the pod's ignore lists (both directions; none of them is the one connected to).
    pub ignored_ports: usize,
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}, {} worker{}, {}, {} close",
            match self.direction {
                Direction::Outbound => "outbound",
                Direction::Inbound => "inbound",
            },
            self.workers,
            if self.workers == 1 { "" } else { "s" },
            if self.pinned { "pinned" } else { "unpinned" },
            match self.close {
                Close::Rst => "RST",
                Close::Fin => "FIN",
            },
        )?;
        if self.family != Family::Ipv4 {
            write!(f, ", {:?}", self.family)?;
        }
        if self.ignored_ports > 0 {
            write!(f, ", {} ignored ports", self.ignored_ports)?;
        }
        Ok(())
    }
}

/// What one run measured.
#[derive(Clone, Debug)]
pub struct Sample {
    pub conns: f64,
    pub rate: f64,
    pub cpu_us_per_conn: f64,
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    /// Entries in the pod's conntrack table after the run (0 when conntrack is not loaded there).
    pub conntrack: u64,
}

/// Addresses of one run: (where the proxy listens, whether that listener is IPV6_V6ONLY, where
/// the client connects, the original destination the proxy must be told).
struct Addresses {
    listen: String,
    v6only: bool,
    connect: String,
    expect: Option<String>,
}

fn addresses(case: &Case, mode: Mode) -> Addresses {
    let limit = mode == Mode::Limit;
    // Outbound, the app connects to a documentation address (the pod's peer refuses it, so a
    // connection that is not intercepted fails); inbound, to the pod's port 80, where nothing
    // listens.
    let (listen, v6only, direct, redirected) = match (case.direction, case.family) {
        (Direction::Outbound, Family::Ipv4) => (
            "127.0.0.1:4140",
            false,
            "127.0.0.1:4140".into(),
            "192.0.2.1:80".into(),
        ),
        (Direction::Outbound, Family::Ipv4Mapped) => (
            "127.0.0.1:4140",
            false,
            "[::ffff:127.0.0.1]:4140".into(),
            "[::ffff:192.0.2.1]:80".into(),
        ),
        (Direction::Outbound, Family::Ipv6) => (
            "[::1]:4140",
            true,
            "[::1]:4140".into(),
            "[2001:db8::1]:80".into(),
        ),
        (Direction::Inbound, Family::Ipv4) => (
            "0.0.0.0:4143",
            false,
            format!("{POD_ADDR}:4143"),
            format!("{POD_ADDR}:80"),
        ),
        (Direction::Inbound, Family::Ipv4Mapped) => (
            "0.0.0.0:4143",
            false,
            format!("[::ffff:{POD_ADDR}]:4143"),
            format!("[::ffff:{POD_ADDR}]:80"),
        ),
        (Direction::Inbound, Family::Ipv6) => (
            "[::]:4143",
            true,
            format!("[{POD_ADDR6}]:4143"),
            format!("[{POD_ADDR6}]:80"),
        ),
    };
    // The proxy sees an IPv4-mapped client's connection as plain IPv4.
    let expect = (!limit).then(|| redirected.replace("[::ffff:", "").replace("]:", ":"));
    Addresses {
        listen: listen.into(),
        v6only,
        connect: if limit { direct } else { redirected },
        expect,
    }
}

/// Runs connload once for `case` in `pod`, set up for `mode`. Any connection that failed or
/// whose original destination was wrong fails the run: a bypass must never count as speed.
pub fn measure(
    connload: &Path,
    pod: &Pod,
    client_cgroup: &Path,
    case: &Case,
    mode: Mode,
    seconds: f64,
) -> anyhow::Result<Sample> {
    let addrs = addresses(case, mode);
    let mut cmd = Command::new(connload);
    cmd.arg("--listen-netns")
        .arg(&pod.netns)
        .args(["--listen", &addrs.listen])
        .arg("--cgroup")
        .arg(&pod.cgroup)
        .args(["--connect", &addrs.connect])
        .args(["--expect", addrs.expect.as_deref().unwrap_or("none")])
        .args(["--workers", &case.workers.to_string()])
        .args(["--seconds", &seconds.to_string()])
        .args([
            "--close",
            match (case.close, case.direction) {
                (Close::Rst, _) => "rst",
                (Close::Fin, Direction::Outbound) => "fin",
                (Close::Fin, Direction::Inbound) => "fin-server",
            },
        ]);
    if addrs.v6only {
        cmd.arg("--v6only");
    }
    if case.pinned {
        cmd.args(["--cpu", "0"]);
    }
    match case.direction {
        Direction::Outbound => {
            cmd.arg("--connect-netns")
                .arg(&pod.netns)
                .args(["--uid", APP_UID]);
        }
        Direction::Inbound => {
            // The client is no process of the pod: its sockets are in a cgroup nothing is
            // attached to.
            cmd.arg("--connect-netns")
                .arg(pod.peer_netns())
                .arg("--client-cgroup")
                .arg(client_cgroup);
        }
    }
    let out = cmd::output(&mut cmd)?;
    let json: Value =
        serde_json::from_str(out.trim()).with_context(|| format!("connload printed {out:?}"))?;
    let num = |key: &str| -> anyhow::Result<f64> {
        json[key]
            .as_f64()
            .with_context(|| format!("no {key} in connload's {out:?}"))
    };
    let failures = num("failures")?;
    ensure!(
        failures == 0.0,
        "{} ({case}): {failures} of {} connections failed, the first: {}",
        mode.name(),
        num("conns")?,
        json["first_failure"].as_str().unwrap_or("?")
    );
    Ok(Sample {
        conns: num("conns")?,
        rate: num("rate")?,
        cpu_us_per_conn: num("cpu_us_per_conn")?,
        p50: num("p50_us")?,
        p99: num("p99_us")?,
        p999: num("p999_us")?,
        conntrack: pod.conntrack_entries().parse().unwrap_or(0),
    })
}
