//! The commands proxy-init runs, argument for argument, as linkerd2-proxy-init writes them: the nat
//! table only, the inbound chain first, then the outbound one, each filled before its jump.
use std::fmt;

use ipnet::IpNet;

use crate::config::{InterceptionConfig, PortRange, PortSet};

pub use interceptor_parse::iptables::{Existing, OUTPUT_CHAIN, REDIRECT_CHAIN};

/// iptables' multiport match takes at most 15 port slots; a range takes two.
const MULTIPORT_SLOTS: usize = 15;

/// Which address family a pass is for (`--ipv6` runs the same rules with ip6tables).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

/// One iptables invocation, without the binary name and `-w`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule(pub Vec<String>);

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join(" "))
    }
}

fn rule(parts: &[&str]) -> Rule {
    Rule(parts.iter().map(|s| (*s).to_owned()).collect())
}

fn comment(text: &str) -> [String; 4] {
    [
        "-m".into(),
        "comment".into(),
        "--comment".into(),
        format!("proxy-init/{text}"),
    ]
}

fn append(chain: &str, mut matches: Vec<String>, target: &[&str], text: &str) -> Rule {
    let mut parts = vec!["-t".to_owned(), "nat".into(), "-A".into(), chain.into()];
    parts.append(&mut matches);
    parts.extend(target.iter().map(|s| (*s).to_owned()));
    parts.extend(comment(text));
    Rule(parts)
}

fn strings(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| (*s).to_owned()).collect()
}

/// The commands that install interception for `config` on one address family.
pub fn install(config: &InterceptionConfig, family: Family, existing: Existing) -> Vec<Rule> {
    let mut rules = Vec::new();
    let create =
        |chain: &str, exists: bool| rule(&["-t", "nat", if exists { "-F" } else { "-N" }, chain]);

    rules.push(create(REDIRECT_CHAIN, existing.redirect_chain));
    rules.extend(ignore_ports(
        REDIRECT_CHAIN,
        &config.inbound_ports_to_ignore,
    ));
    for net in subnets(&config.subnets_to_ignore, family) {
        rules.push(append(
            REDIRECT_CHAIN,
            strings(&["-p", "all", "-j", "RETURN", "-s", &net]),
            &[],
            &format!("ignore-subnet-{net}"),
        ));
    }
    let inbound = config.incoming_proxy_port.to_string();
    if config.ports_to_redirect.is_empty() {
        rules.push(append(
            REDIRECT_CHAIN,
            strings(&["-p", "tcp"]),
            &["-j", "REDIRECT", "--to-port", &inbound],
            "redirect-all-incoming-to-proxy-port",
        ));
    }
    for port in &config.ports_to_redirect {
        let port = port.to_string();
        rules.push(append(
            REDIRECT_CHAIN,
            strings(&["-p", "tcp", "--destination-port", &port]),
            &["-j", "REDIRECT", "--to-port", &inbound],
            &format!("redirect-port-{port}-to-proxy-port"),
        ));
    }
    if !existing.prerouting_jump {
        rules.push(jump(
            "-A",
            "PREROUTING",
            REDIRECT_CHAIN,
            "install-proxy-init-prerouting",
        ));
    }

    rules.push(create(OUTPUT_CHAIN, existing.output_chain));
    if let Some(uid) = config.proxy_uid {
        rules.push(append(
            OUTPUT_CHAIN,
            strings(&["-m", "owner", "--uid-owner", &uid.to_string()]),
            &["-j", "RETURN"],
            "ignore-proxy-user-id",
        ));
    }
    if let Some(gid) = config.proxy_gid {
        rules.push(append(
            OUTPUT_CHAIN,
            strings(&["-m", "owner", "--gid-owner", &gid.to_string()]),
            &["-j", "RETURN"],
            "ignore-proxy-group-id",
        ));
    }
    rules.push(append(
        OUTPUT_CHAIN,
        strings(&["-o", "lo"]),
        &["-j", "RETURN"],
        "ignore-loopback",
    ));
    rules.extend(ignore_ports(OUTPUT_CHAIN, &config.outbound_ports_to_ignore));
    // Extension (not in proxy-init): outbound destinations never redirected.
    for net in subnets(&config.outbound_subnets_to_ignore, family) {
        rules.push(append(
            OUTPUT_CHAIN,
            strings(&["-p", "all", "-j", "RETURN", "-d", &net]),
            &[],
            &format!("ignore-outbound-subnet-{net}"),
        ));
    }
    let outbound = config.outgoing_proxy_port.to_string();
    rules.push(append(
        OUTPUT_CHAIN,
        strings(&["-p", "tcp"]),
        &["-j", "REDIRECT", "--to-port", &outbound],
        "redirect-all-outgoing-to-proxy-port",
    ));
    if !existing.output_jump {
        rules.push(jump(
            "-A",
            "OUTPUT",
            OUTPUT_CHAIN,
            "install-proxy-init-output",
        ));
    }
    rules
}

/// The commands that remove exactly what [`install`] added.
pub fn cleanup() -> Vec<Rule> {
    vec![
        jump(
            "-D",
            "PREROUTING",
            REDIRECT_CHAIN,
            "install-proxy-init-prerouting",
        ),
        jump("-D", "OUTPUT", OUTPUT_CHAIN, "install-proxy-init-output"),
        rule(&["-t", "nat", "-F", REDIRECT_CHAIN]),
        rule(&["-t", "nat", "-X", REDIRECT_CHAIN]),
        rule(&["-t", "nat", "-F", OUTPUT_CHAIN]),
        rule(&["-t", "nat", "-X", OUTPUT_CHAIN]),
    ]
}

fn jump(action: &str, from: &str, to: &str, text: &str) -> Rule {
    let mut parts = strings(&["-t", "nat", action, from, "-j", to]);
    parts.extend(comment(text));
    Rule(parts)
}

/// `-p tcp --match multiport --dports ...` rules, split so no rule exceeds 15 port slots.
fn ignore_ports(chain: &str, ports: &PortSet) -> Vec<Rule> {
    multiport_groups(ports)
        .into_iter()
        .map(|group| {
            let list = group.join(",");
            append(
                chain,
                strings(&["-p", "tcp", "--match", "multiport", "--dports", &list]),
                &["-j", "RETURN"],
                &format!("ignore-port-{list}"),
            )
        })
        .collect()
}

/// Ports as multiport writes them (`L:U` for a range), grouped by at most 15 slots.
pub fn multiport_groups(ports: &PortSet) -> Vec<Vec<String>> {
    let mut groups: Vec<Vec<String>> = Vec::new();
    let mut used = MULTIPORT_SLOTS;
    for range in &ports.0 {
        let (text, slots) = multiport_entry(range);
        if used + slots > MULTIPORT_SLOTS {
            groups.push(Vec::new());
            used = 0;
        }
        groups
            .last_mut()
            .expect("a group was just pushed")
            .push(text);
        used += slots;
    }
    groups
}

fn multiport_entry(range: &PortRange) -> (String, usize) {
    if range.is_single() {
        (range.low.to_string(), 1)
    } else {
        (format!("{}:{}", range.low, range.high), 2)
    }
}

fn subnets(nets: &[IpNet], family: Family) -> Vec<String> {
    nets.iter()
        .filter(|n| {
            matches!(
                (n, family),
                (IpNet::V4(_), Family::V4) | (IpNet::V6(_), Family::V6)
            )
        })
        .map(IpNet::to_string)
        .collect()
}

#[cfg(test)]
#[path = "rules_tests.rs"]
mod tests;
