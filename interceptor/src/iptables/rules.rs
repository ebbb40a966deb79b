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
mod tests {
    use super::*;
    use crate::config::InterceptionConfig;

    fn linkerd() -> InterceptionConfig {
        InterceptionConfig {
            incoming_proxy_port: 4143,
            outgoing_proxy_port: 4140,
            proxy_uid: Some(2102),
            proxy_gid: None,
            inbound_ports_to_ignore: PortSet(
                vec![4190, 4191, 4567, 4568]
                    .into_iter()
                    .map(PortRange::single)
                    .collect(),
            ),
            outbound_ports_to_ignore: PortSet(vec![
                PortRange::single(443),
                PortRange::single(6443),
            ]),
            ports_to_redirect: vec![],
            subnets_to_ignore: vec![],
            outbound_subnets_to_ignore: vec![],
            ipv6: false,
        }
    }

    fn text(rules: &[Rule]) -> String {
        rules.iter().map(|r| format!("{r}\n")).collect()
    }

    /// What proxy-init writes for Linkerd's defaults, verbatim (`iptables-save` of a meshed pod).
    #[test]
    fn default_linkerd_configuration_is_the_spec_listing() {
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
        assert_eq!(
            text(&install(&linkerd(), Family::V4, Existing::default())),
            expected
        );
    }

    #[test]
    fn gid_subnet_and_ports_to_redirect_forms() {
        let mut config = linkerd();
        config.proxy_gid = Some(2103);
        config.subnets_to_ignore = vec!["10.0.0.0/8".parse().unwrap(), "fd00::/8".parse().unwrap()];
        config.ports_to_redirect = vec![80, 8080];
        config.inbound_ports_to_ignore = PortSet::default();
        let v4 = text(&install(&config, Family::V4, Existing::default()));
        assert!(v4.contains("\n-t nat -A PROXY_INIT_REDIRECT -p all -j RETURN -s 10.0.0.0/8 -m comment --comment proxy-init/ignore-subnet-10.0.0.0/8\n"), "{v4}");
        assert!(
            !v4.contains("fd00::/8"),
            "IPv6 subnets belong to the ip6tables pass: {v4}"
        );
        assert!(v4.contains("-t nat -A PROXY_INIT_REDIRECT -p tcp --destination-port 80 -j REDIRECT --to-port 4143 -m comment --comment proxy-init/redirect-port-80-to-proxy-port\n-t nat -A PROXY_INIT_REDIRECT -p tcp --destination-port 8080 -j REDIRECT --to-port 4143 -m comment --comment proxy-init/redirect-port-8080-to-proxy-port\n"), "{v4}");
        assert!(!v4.contains("redirect-all-incoming"), "{v4}");
        assert!(v4.contains("ignore-proxy-user-id\n-t nat -A PROXY_INIT_OUTPUT -m owner --gid-owner 2103 -j RETURN -m comment --comment proxy-init/ignore-proxy-group-id\n-t nat -A PROXY_INIT_OUTPUT -o lo"), "{v4}");
        let v6 = text(&install(&config, Family::V6, Existing::default()));
        assert!(
            v6.contains("-s fd00::/8 ") && !v6.contains("10.0.0.0/8"),
            "{v6}"
        );
    }

    #[test]
    fn multiport_lists_split_at_15_slots_with_ranges_as_two() {
        let ports: PortSet = PortSet(
            [22, 25, 33]
                .into_iter()
                .map(PortRange::single)
                .chain([PortRange { low: 25, high: 27 }])
                .collect(),
        );
        assert_eq!(
            multiport_groups(&ports),
            vec![vec!["22", "25", "33", "25:27"]]
        );
        // 14 singles + a range (2 slots) do not fit in one rule.
        let mut many: Vec<PortRange> = (1000..1014).map(PortRange::single).collect();
        many.push(PortRange {
            low: 2000,
            high: 2010,
        });
        many.push(PortRange::single(3000));
        let groups = multiport_groups(&PortSet(many));
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].len(), 14);
        assert_eq!(groups[1], vec!["2000:2010", "3000"]);
        let mut config = linkerd();
        config.outbound_ports_to_ignore = PortSet((1..=31).map(PortRange::single).collect());
        let rules = install(&config, Family::V4, Existing::default());
        let ignore: Vec<String> = rules
            .iter()
            .map(ToString::to_string)
            .filter(|r| r.contains("PROXY_INIT_OUTPUT -p tcp --match"))
            .collect();
        assert_eq!(ignore.len(), 3);
        assert!(
            ignore[2]
                .ends_with("--dports 31 -j RETURN -m comment --comment proxy-init/ignore-port-31"),
            "{}",
            ignore[2]
        );
    }

    #[test]
    fn rerunning_flushes_existing_chains_and_keeps_existing_jumps() {
        let existing = Existing {
            redirect_chain: true,
            output_chain: true,
            prerouting_jump: true,
            output_jump: true,
        };
        let rules = text(&install(&linkerd(), Family::V4, existing));
        assert!(
            rules.starts_with("-t nat -F PROXY_INIT_REDIRECT\n"),
            "{rules}"
        );
        assert!(rules.contains("-t nat -F PROXY_INIT_OUTPUT\n"), "{rules}");
        assert!(
            !rules.contains("-N ")
                && !rules.contains("-A PREROUTING")
                && !rules.contains("-A OUTPUT "),
            "{rules}"
        );
    }

    #[test]
    fn cleanup_removes_the_jumps_then_the_chains() {
        assert_eq!(
        text(&cleanup()),
        "\
-t nat -D PREROUTING -j PROXY_INIT_REDIRECT -m comment --comment proxy-init/install-proxy-init-prerouting
-t nat -D OUTPUT -j PROXY_INIT_OUTPUT -m comment --comment proxy-init/install-proxy-init-output
-t nat -F PROXY_INIT_REDIRECT
-t nat -X PROXY_INIT_REDIRECT
-t nat -F PROXY_INIT_OUTPUT
-t nat -X PROXY_INIT_OUTPUT
"
    );
    }
}
