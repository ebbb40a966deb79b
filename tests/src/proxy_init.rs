//! proxy-init's rule building, transcribed from its source: the reference the behaviour tables
//! hold every backend to, and what our rendering of its chains (`interceptor::iptables`) is
//! checked against.
//!
//! Source: linkerd/linkerd2-proxy-init at commit 183e791 (2026-07-23):
//! - `proxy-init/cmd/root.go`: the flags (`IntVarP`, `IntSliceVarP`, `StringSliceVar`,
//!   `BoolVar`; the UID and GID default to -1), `BuildFirewallConfiguration` (ports checked with
//!   `IsValidPort`, 0 included; each subnet trimmed and checked with Go's `net.ParseCIDR`, which
//!   refuses a bare address; `redirect-listed` mode when ports to redirect are given) and the
//!   passes (always IPv4 with `--ipv6=false`, then, with `--ipv6`, the same options with the
//!   ip6tables binaries);
//! - `pkg/iptables/iptables.go`: `ConfigureFirewall` (`<save> -t nat` first, the inbound
//!   commands, then the outbound ones, `-w` appended last, each through `nsenter --net=NS --`,
//!   stopping at the first that fails), `addIncomingTrafficRules`, `addOutgoingTrafficRules`,
//!   the regular expressions that find an existing chain or jump, `makeMultiportDestinations`
//!   (15 slots a rule, a range two, an entry that does not parse logged and dropped) and the
//!   `make*` command builders;
//! - `pkg/util/portrange.go`: `ParsePortRange`, `IsValidPort`.
//!
//! Written from that source alone, never from `interceptor::iptables::rules` nor its tests: a
//! mistake in our rendering must show up as a difference, not be shared.
//!
//! Where proxy-init and our SPEC part ways on purpose, [`accepted_by_both`] says which
//! configurations both take; only those are compared. And one thing here is not proxy-init's:
//! `--outbound-subnets-to-ignore`, our extension, which proxy-init has no flag for. Its rules
//! ([`Extension`]) are written as SPEC's outbound rule 5 places them (after the ignored ports,
//! before the redirect), in the form of proxy-init's subnet rule with `-d`, each pass taking the
//! CIDRs of its own family.
use std::{path::Path, process::Command};

/// iptables' multiport match takes at most 15 port references (`IptablesMultiportLimit`).
const MULTIPORT_LIMIT: usize = 15;
const OUTPUT_CHAIN: &str = "PROXY_INIT_OUTPUT";
const REDIRECT_CHAIN: &str = "PROXY_INIT_REDIRECT";

/// proxy-init's `RootOptions`, as its flags leave them (the options the rules depend on).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RootOptions {
    pub incoming_proxy_port: i64,
    pub outgoing_proxy_port: i64,
    pub proxy_user_id: i64,
    pub proxy_group_id: i64,
    pub ports_to_redirect: Vec<i64>,
    pub inbound_ports_to_ignore: Vec<String>,
    pub outbound_ports_to_ignore: Vec<String>,
    pub subnets_to_ignore: Vec<String>,
    pub use_wait_flag: bool,
    pub ipv6: bool,
}

impl Default for RootOptions {
    /// `newRootOptions`.
    fn default() -> Self {
        Self {
            incoming_proxy_port: -1,
            outgoing_proxy_port: -1,
            proxy_user_id: -1,
            proxy_group_id: -1,
            ports_to_redirect: Vec::new(),
            inbound_ports_to_ignore: Vec::new(),
            outbound_ports_to_ignore: Vec::new(),
            subnets_to_ignore: Vec::new(),
            use_wait_flag: false,
            ipv6: true,
        }
    }
}

/// Our extension's values, which proxy-init has no flag for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Extension {
    pub outbound_subnets_to_ignore: Vec<String>,
}

/// Reads the flags as proxy-init's cobra/pflag command line does, for the flags the rules
/// depend on: `--flag value` and `--flag=value` (short `-p 4143`, `-p=4143`, `-p4143`), a list
/// flag's values split at commas and adding up over repeats, `--ipv6` alone true. Our
/// extension's `--outbound-subnets-to-ignore` is set apart.
pub fn parse_args(args: &[String]) -> Result<(RootOptions, Extension), String> {
    let mut options = RootOptions::default();
    let mut extension = Extension::default();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let (name, inline) = if let Some(long) = arg.strip_prefix("--") {
            match long.split_once('=') {
                Some((name, value)) => (name.to_owned(), Some(value.to_owned())),
                None => (long.to_owned(), None),
            }
        } else if let Some(short) = arg.strip_prefix('-') {
            let mut chars = short.chars();
            let flag = chars.next().ok_or_else(|| format!("bad flag {arg:?}"))?;
            let name = match flag {
                'p' => "incoming-proxy-port",
                'o' => "outgoing-proxy-port",
                'u' => "proxy-uid",
                'g' => "proxy-gid",
                'r' => "ports-to-redirect",
                'w' => "use-wait-flag",
                _ => return Err(format!("unknown shorthand flag: {flag:?} in {arg}")),
            };
            let rest = chars.as_str();
            let inline = (!rest.is_empty()).then(|| rest.strip_prefix('=').unwrap_or(rest));
            (name.to_owned(), inline.map(str::to_owned))
        } else {
            return Err(format!("unexpected argument {arg:?}"));
        };
        let boolean = matches!(name.as_str(), "ipv6" | "use-wait-flag" | "simulate");
        let value = match inline {
            Some(value) => value,
            None if boolean => "true".to_owned(),
            None => args
                .next()
                .cloned()
                .ok_or_else(|| format!("flag needs an argument: --{name}"))?,
        };
        let int = |v: &str| {
            v.parse::<i64>()
                .map_err(|e| format!("invalid argument {v:?} for --{name}: {e}"))
        };
        // pflag's StringSlice reads its value as one CSV record; these values hold no quotes.
        let list = |v: &str| v.split(',').map(str::to_owned).collect::<Vec<_>>();
        match name.as_str() {
            "incoming-proxy-port" => options.incoming_proxy_port = int(&value)?,
            "outgoing-proxy-port" => options.outgoing_proxy_port = int(&value)?,
            "proxy-uid" => options.proxy_user_id = int(&value)?,
            "proxy-gid" => options.proxy_group_id = int(&value)?,
            "ports-to-redirect" => {
                for port in value.split(',') {
                    options.ports_to_redirect.push(int(port)?);
                }
            }
            "inbound-ports-to-ignore" => options.inbound_ports_to_ignore.extend(list(&value)),
            "outbound-ports-to-ignore" => options.outbound_ports_to_ignore.extend(list(&value)),
            "subnets-to-ignore" => options.subnets_to_ignore.extend(list(&value)),
            "ipv6" => options.ipv6 = go_bool(&value)?,
            "use-wait-flag" => options.use_wait_flag = go_bool(&value)?,
            "outbound-subnets-to-ignore" => {
                extension.outbound_subnets_to_ignore.extend(list(&value));
            }
            other => return Err(format!("unknown flag: --{other}")),
        }
    }
    Ok((options, extension))
}

/// Go's `strconv.ParseBool`.
fn go_bool(value: &str) -> Result<bool, String> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!("invalid boolean {value:?}")),
    }
}

/// Which pass: `iptables` or, with `--ipv6`, `ip6tables`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    V4,
    V6,
}

impl Pass {
    /// `getCommands` for `--iptables-mode legacy` (the default).
    pub fn legacy_binaries(self) -> (&'static str, &'static str) {
        match self {
            Self::V4 => ("iptables-legacy", "iptables-legacy-save"),
            Self::V6 => ("ip6tables-legacy", "ip6tables-legacy-save"),
        }
    }
}

/// Inbound steering: every port, or the listed ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    RedirectAll,
    RedirectListed,
}

/// proxy-init's `FirewallConfiguration` for one pass.
#[derive(Clone, Debug)]
pub struct FirewallConfiguration {
    pub pass: Pass,
    mode: Mode,
    ports_to_redirect_inbound: Vec<i64>,
    inbound_ports_to_ignore: Vec<String>,
    outbound_ports_to_ignore: Vec<String>,
    subnets_to_ignore: Vec<String>,
    proxy_inbound_port: i64,
    proxy_outgoing_port: i64,
    proxy_uid: i64,
    proxy_gid: i64,
    use_wait_flag: bool,
    /// Not proxy-init's: the extension's CIDRs of this pass's family.
    outbound_subnets_to_ignore: Vec<String>,
}

/// `IsValidPort`: 0 is valid to proxy-init.
fn is_valid_port(port: i64) -> bool {
    (0..=65535).contains(&port)
}

/// `BuildFirewallConfiguration` for one pass.
fn build_firewall_configuration(
    options: &RootOptions,
    extension: &Extension,
    pass: Pass,
) -> Result<FirewallConfiguration, String> {
    if !is_valid_port(options.incoming_proxy_port) {
        return Err("--incoming-proxy-port must be a valid TCP port number".into());
    }
    if !is_valid_port(options.outgoing_proxy_port) {
        return Err("--outgoing-proxy-port must be a valid TCP port number".into());
    }
    let mut subnets = Vec::new();
    for subnet in &options.subnets_to_ignore {
        let subnet = subnet.trim();
        if !go_parse_cidr(subnet) {
            return Err(format!("{subnet} is not a valid CIDR address"));
        }
        subnets.push(subnet.to_owned());
    }
    let own_family = |cidr: &&String| (pass == Pass::V6) == cidr.contains(':');
    Ok(FirewallConfiguration {
        pass,
        mode: if options.ports_to_redirect.is_empty() {
            Mode::RedirectAll
        } else {
            Mode::RedirectListed
        },
        ports_to_redirect_inbound: options.ports_to_redirect.clone(),
        inbound_ports_to_ignore: options.inbound_ports_to_ignore.clone(),
        outbound_ports_to_ignore: options.outbound_ports_to_ignore.clone(),
        subnets_to_ignore: subnets,
        proxy_inbound_port: options.incoming_proxy_port,
        proxy_outgoing_port: options.outgoing_proxy_port,
        proxy_uid: options.proxy_user_id,
        proxy_gid: options.proxy_group_id,
        use_wait_flag: options.use_wait_flag,
        outbound_subnets_to_ignore: extension
            .outbound_subnets_to_ignore
            .iter()
            .filter(own_family)
            .cloned()
            .collect(),
    })
}

/// Go's `net.ParseCIDR`: an address, `/`, a prefix length in range; a bare address fails.
fn go_parse_cidr(text: &str) -> bool {
    let Some((addr, len)) = text.split_once('/') else {
        return false;
    };
    let Ok(len) = len.parse::<u8>() else {
        return false;
    };
    match addr.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => len <= 32,
        Ok(std::net::IpAddr::V6(_)) => len <= 128,
        Err(_) => false,
    }
}

/// The passes proxy-init runs for these options: IPv4 always (with `IPv6 = false`), then IPv6
/// with `--ipv6`. An error is proxy-init's refusal before any command runs.
pub fn passes(
    options: &RootOptions,
    extension: &Extension,
) -> Result<Vec<FirewallConfiguration>, String> {
    let mut passes = vec![build_firewall_configuration(options, extension, Pass::V4)?];
    if options.ipv6 {
        passes.push(build_firewall_configuration(options, extension, Pass::V6)?);
    }
    Ok(passes)
}

fn args(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| (*s).to_owned()).collect()
}

fn comment(text: &str) -> String {
    format!("proxy-init/{text}")
}

/// A port or range (`ParsePortRange`): `N` or `L-U`, each 0..=65535, L <= U.
fn parse_port_range(text: &str) -> Option<(i64, i64)> {
    let bounds: Vec<&str> = text.split('-').collect();
    let (lower, upper) = match bounds[..] {
        [one] => (one, one),
        [lower, upper] => (lower, upper),
        _ => return None,
    };
    // Go's `strconv.Atoi` takes a sign, not spaces.
    let lower: i64 = lower.parse().ok().filter(|p| is_valid_port(*p))?;
    let upper: i64 = upper.parse().ok().filter(|p| is_valid_port(*p))?;
    (lower <= upper).then_some((lower, upper))
}

/// `makeMultiportDestinations`: the entries as multiport writes them (`L:U`), at most 15
/// references a rule (a range takes two), in order; an entry that does not parse is dropped.
pub fn multiport_destinations(ports_to_ignore: &[String]) -> Vec<Vec<String>> {
    let mut slices = Vec::new();
    if ports_to_ignore.is_empty() {
        return slices;
    }
    let mut count = 0;
    let mut destinations = Vec::new();
    for entry in ports_to_ignore {
        let Some((lower, upper)) = parse_port_range(entry) else {
            continue;
        };
        let references = if lower == upper { 1 } else { 2 };
        if count + references > MULTIPORT_LIMIT {
            slices.push(std::mem::take(&mut destinations));
            count = 0;
        }
        destinations.push(if lower == upper {
            lower.to_string()
        } else {
            format!("{lower}:{upper}")
        });
        count += references;
    }
    slices.push(destinations);
    slices
}

/// What an existing `<save> -t nat` holds of ours (proxy-init's four regular expressions).
#[derive(Clone, Copy, Debug, Default)]
struct Existing {
    prerouting_jump: bool,
    output_jump: bool,
    redirect_chain: bool,
    output_chain: bool,
}

impl Existing {
    fn read(save: &str) -> Self {
        // `(?m)^-A PREROUTING (.+ )?-j PROXY_INIT_REDIRECT`
        let jump = |chain: &str, target: &str| {
            let to = format!("-j {target}");
            save.lines().any(|line| {
                line.strip_prefix(&format!("-A {chain} "))
                    .is_some_and(|rest| rest.starts_with(&to) || rest.contains(&format!(" {to}")))
            })
        };
        let chain = |name: &str| save.lines().any(|l| l.starts_with(&format!(":{name} ")));
        Self {
            prerouting_jump: jump("PREROUTING", REDIRECT_CHAIN),
            output_jump: jump("OUTPUT", OUTPUT_CHAIN),
            redirect_chain: chain(REDIRECT_CHAIN),
            output_chain: chain(OUTPUT_CHAIN),
        }
    }
}

impl FirewallConfiguration {
    /// The commands `ConfigureFirewall` runs after reading `existing_rules` (the pass's
    /// `<save> -t nat`), each without its binary, `-w` appended with `--use-wait-flag`.
    pub fn commands(&self, existing_rules: &str) -> Vec<Vec<String>> {
        let existing = Existing::read(existing_rules);
        let mut commands = Vec::new();
        self.add_incoming_traffic_rules(existing, &mut commands);
        self.add_outgoing_traffic_rules(existing, &mut commands);
        if self.use_wait_flag {
            for command in &mut commands {
                command.push("-w".into());
            }
        }
        commands
    }

    fn add_outgoing_traffic_rules(&self, existing: Existing, commands: &mut Vec<Vec<String>>) {
        commands.push(if existing.output_chain {
            make_flush_chain(OUTPUT_CHAIN)
        } else {
            make_create_new_chain(OUTPUT_CHAIN)
        });
        if self.proxy_uid > 0 {
            commands.push(make_ignore_owner(
                "--uid-owner",
                self.proxy_uid,
                "ignore-proxy-user-id",
            ));
        }
        if self.proxy_gid > 0 {
            commands.push(make_ignore_owner(
                "--gid-owner",
                self.proxy_gid,
                "ignore-proxy-group-id",
            ));
        }
        commands.push(args(&[
            "-t",
            "nat",
            "-A",
            OUTPUT_CHAIN,
            "-o",
            "lo",
            "-j",
            "RETURN",
            "-m",
            "comment",
            "--comment",
            &comment("ignore-loopback"),
        ]));
        add_rules_for_ignored_ports(&self.outbound_ports_to_ignore, OUTPUT_CHAIN, commands);
        // The extension, not proxy-init's (see the module's header).
        for subnet in &self.outbound_subnets_to_ignore {
            commands.push(args(&[
                "-t",
                "nat",
                "-A",
                OUTPUT_CHAIN,
                "-p",
                "all",
                "-j",
                "RETURN",
                "-d",
                subnet,
                "-m",
                "comment",
                "--comment",
                &comment(&format!("ignore-outbound-subnet-{subnet}")),
            ]));
        }
        commands.push(make_redirect_chain_to_port(
            OUTPUT_CHAIN,
            self.proxy_outgoing_port,
            "redirect-all-outgoing-to-proxy-port",
        ));
        if !existing.output_jump {
            commands.push(make_jump(
                "OUTPUT",
                OUTPUT_CHAIN,
                "install-proxy-init-output",
            ));
        }
    }

    fn add_incoming_traffic_rules(&self, existing: Existing, commands: &mut Vec<Vec<String>>) {
        commands.push(if existing.redirect_chain {
            make_flush_chain(REDIRECT_CHAIN)
        } else {
            make_create_new_chain(REDIRECT_CHAIN)
        });
        add_rules_for_ignored_ports(&self.inbound_ports_to_ignore, REDIRECT_CHAIN, commands);
        for subnet in &self.subnets_to_ignore {
            commands.push(args(&[
                "-t",
                "nat",
                "-A",
                REDIRECT_CHAIN,
                "-p",
                "all",
                "-j",
                "RETURN",
                "-s",
                subnet,
                "-m",
                "comment",
                "--comment",
                &comment(&format!("ignore-subnet-{subnet}")),
            ]));
        }
        match self.mode {
            Mode::RedirectAll => commands.push(make_redirect_chain_to_port(
                REDIRECT_CHAIN,
                self.proxy_inbound_port,
                "redirect-all-incoming-to-proxy-port",
            )),
            Mode::RedirectListed => {
                for port in &self.ports_to_redirect_inbound {
                    commands.push(args(&[
                        "-t",
                        "nat",
                        "-A",
                        REDIRECT_CHAIN,
                        "-p",
                        "tcp",
                        "--destination-port",
                        &port.to_string(),
                        "-j",
                        "REDIRECT",
                        "--to-port",
                        &self.proxy_inbound_port.to_string(),
                        "-m",
                        "comment",
                        "--comment",
                        &comment(&format!("redirect-port-{port}-to-proxy-port")),
                    ]));
                }
            }
        }
        if !existing.prerouting_jump {
            commands.push(make_jump(
                "PREROUTING",
                REDIRECT_CHAIN,
                "install-proxy-init-prerouting",
            ));
        }
    }
}

fn add_rules_for_ignored_ports(ports: &[String], chain: &str, commands: &mut Vec<Vec<String>>) {
    for destinations in multiport_destinations(ports) {
        let list = destinations.join(",");
        commands.push(args(&[
            "-t",
            "nat",
            "-A",
            chain,
            "-p",
            "tcp",
            "--match",
            "multiport",
            "--dports",
            &list,
            "-j",
            "RETURN",
            "-m",
            "comment",
            "--comment",
            &comment(&format!("ignore-port-{list}")),
        ]));
    }
}

fn make_ignore_owner(flag: &str, id: i64, text: &str) -> Vec<String> {
    args(&[
        "-t",
        "nat",
        "-A",
        OUTPUT_CHAIN,
        "-m",
        "owner",
        flag,
        &id.to_string(),
        "-j",
        "RETURN",
        "-m",
        "comment",
        "--comment",
        &comment(text),
    ])
}

fn make_flush_chain(name: &str) -> Vec<String> {
    args(&["-t", "nat", "-F", name])
}

fn make_create_new_chain(name: &str) -> Vec<String> {
    args(&["-t", "nat", "-N", name])
}

fn make_redirect_chain_to_port(chain: &str, port: i64, text: &str) -> Vec<String> {
    args(&[
        "-t",
        "nat",
        "-A",
        chain,
        "-p",
        "tcp",
        "-j",
        "REDIRECT",
        "--to-port",
        &port.to_string(),
        "-m",
        "comment",
        "--comment",
        &comment(text),
    ])
}

/// `makeJumpFromChainToAnotherForAllProtocols` (to add).
fn make_jump(chain: &str, target: &str, text: &str) -> Vec<String> {
    args(&[
        "-t",
        "nat",
        "-A",
        chain,
        "-j",
        target,
        "-m",
        "comment",
        "--comment",
        &comment(text),
    ])
}

/// Whether proxy-init and our SPEC both take these flags, and if not why not. proxy-init
/// silently drops an ignored port entry that does not parse, and takes port 0 (`IsValidPort`);
/// we refuse both (SPEC: ports are 1..65535, a malformed entry refuses the whole
/// configuration). Every subnet goes to both of proxy-init's passes, and iptables refuses a
/// CIDR of the other family (`host/network 'fd00::' not found`, or an IPv4-mapped one's
/// `invalid mask`): proxy-init exits with an error and half-written chains, so it takes
/// subnets to ignore only if all are IPv4 and `--ipv6=false`, while we give each pass its own
/// family's. Go's `net.ParseCIDR` refuses a bare address, which we take as a /32 or /128. And
/// a subnet with host bits set (`10.1.2.3/8`) both take, and both match `10.0.0.0/8`, but
/// proxy-init's comment keeps the text as given (`ignore-subnet-10.1.2.3/8`) where ours names
/// the network: not drawn, so the nat tables compare whole.
pub fn accepted_by_both(args: &[String]) -> Result<(), String> {
    let (options, extension) = parse_args(args)?;
    passes(&options, &extension)?;
    for subnet in options
        .subnets_to_ignore
        .iter()
        .chain(&extension.outbound_subnets_to_ignore)
    {
        let net: ipnet::IpNet = subnet
            .trim()
            .parse()
            .map_err(|e| format!("{subnet:?}: {e}"))?;
        if net.trunc() != net {
            return Err(format!(
                "{subnet} has host bits set: proxy-init's comment keeps them, ours does not"
            ));
        }
    }
    for entry in options
        .inbound_ports_to_ignore
        .iter()
        .chain(&options.outbound_ports_to_ignore)
    {
        match parse_port_range(entry) {
            Some((lower, _)) if lower > 0 => {}
            _ => {
                return Err(format!(
                    "proxy-init drops the port entry {entry:?}; we refuse it"
                ));
            }
        }
    }
    if let Some(port) = options.ports_to_redirect.iter().find(|p| **p < 1) {
        return Err(format!(
            "proxy-init takes port {port} to redirect; we refuse it"
        ));
    }
    if options.ipv6 && !options.subnets_to_ignore.is_empty() {
        return Err(
            "with --ipv6 proxy-init hands every subnet to both iptables and ip6tables, \
                    one of which refuses it"
                .into(),
        );
    }
    if let Some(v6) = options.subnets_to_ignore.iter().find(|s| s.contains(':')) {
        return Err(format!(
            "iptables refuses the IPv6 subnet {v6} in proxy-init's IPv4 pass"
        ));
    }
    Ok(())
}

/// Runs proxy-init's passes for `args` in the network namespace at `netns`, as it does: each
/// pass reads `<save> -t nat` there, then runs its commands through `nsenter --net=NS --`
/// with the legacy binaries, stopping at the first that fails. Returns the commands that ran.
pub fn configure(netns: &Path, flags: &[String]) -> Result<Vec<String>, String> {
    let (options, extension) = parse_args(flags)?;
    let mut ran = Vec::new();
    for pass in passes(&options, &extension)? {
        let (binary, save) = pass.pass.legacy_binaries();
        let existing = nsenter(netns, save, &args(&["-t", "nat"]), false)?;
        for command in pass.commands(&existing) {
            nsenter(netns, binary, &command, true)?;
            ran.push(format!("{binary} {}", command.join(" ")));
        }
    }
    Ok(ran)
}

/// `nsenter --net=NS -- BINARY ARGS`, as linkerd-cni runs proxy-init. For a pod with a user
/// namespace of its own, which linkerd-cni cannot mesh (`xt_owner` refuses an owner match
/// written from outside it), as the pod's `linkerd-init` container runs it instead: inside that
/// user namespace too, as the pod's root (`nsenter --user` sets uid and gid 0), with an xtables
/// lock of its own, as a container has its own `/run`. Reads (`writes` false) stay in our user
/// namespace: the first on a node loads `ip_tables` (iptables-legacy runs modprobe), which the
/// pod's root may not (on a node, the runtime's or the agent's iptables have loaded it).
fn nsenter(netns: &Path, binary: &str, args: &[String], writes: bool) -> Result<String, String> {
    let shown = format!("{binary} {}", args.join(" "));
    let mut command = Command::new("nsenter");
    command.arg(format!("--net={}", netns.display()));
    let pod_users = if writes {
        pod_user_namespace(netns)?
    } else {
        None
    };
    let lock = pod_users.as_ref().map(|_| LockOfItsOwn::new());
    if let (Some(userns), Some(lock)) = (&pod_users, &lock) {
        use std::os::fd::AsRawFd as _;
        command
            .arg(format!(
                "--user=/proc/{}/fd/{}",
                std::process::id(),
                userns.as_raw_fd()
            ))
            .env("XTABLES_LOCKFILE", &lock.0);
    }
    let out = command
        .arg("--")
        .arg(binary)
        .args(args)
        .output()
        .map_err(|e| format!("`nsenter ... {shown}` could not run: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`{shown}` failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The user namespace that owns the network namespace at `netns`, unless it is ours.
fn pod_user_namespace(netns: &Path) -> Result<Option<std::os::fd::OwnedFd>, String> {
    use std::os::fd::AsFd as _;
    let file = std::fs::File::open(netns).map_err(|e| format!("{}: {e}", netns.display()))?;
    let userns = interceptor_sys::userns::owning_user_namespace(file.as_fd())
        .map_err(|e| format!("NS_GET_USERNS on {}: {e}", netns.display()))?;
    let ours = interceptor_sys::userns::is_own_user_namespace(userns.as_fd())
        .map_err(|e| format!("{}'s user namespace: {e}", netns.display()))?;
    Ok((!ours).then_some(userns))
}

/// A lock file the pod's root may open (the host's `/run/xtables.lock` is not its own); removed
/// when dropped.
struct LockOfItsOwn(std::path::PathBuf);

impl LockOfItsOwn {
    fn new() -> Self {
        let path = std::env::temp_dir().join(crate::unique_name("xtables-lock"));
        std::fs::write(&path, "").expect("an xtables lock file");
        let root = crate::fixture::POD_USERS_ON_HOST;
        std::os::unix::fs::chown(&path, Some(root), Some(root)).expect("chown the lock file");
        Self(path)
    }
}

impl Drop for LockOfItsOwn {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `<save> -t nat` as the tables compare it: without the `#` lines (the save's time) and the
/// chains' counters.
pub fn normalized_save(save: &str) -> String {
    save.lines()
        .filter(|line| !line.starts_with('#'))
        .map(|line| match line.strip_prefix(':') {
            Some(chain) => match chain.rsplit_once(" [") {
                Some((head, _counters)) => format!(":{head}\n"),
                None => format!("{line}\n"),
            },
            None => format!("{line}\n"),
        })
        .collect()
}

/// `<save> -t nat` inside the namespace at `netns`.
pub fn save_nat(netns: &Path, save: &str) -> String {
    nsenter(netns, save, &args(&["-t", "nat"]), false).unwrap_or_else(|e| panic!("{e}"))
}
