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
        outbound_ports_to_ignore: PortSet(vec![PortRange::single(443), PortRange::single(6443)]),
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
        ignore[2].ends_with("--dports 31 -j RETURN -m comment --comment proxy-init/ignore-port-31"),
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
        !rules.contains("-N ") && !rules.contains("-A PREROUTING") && !rules.contains("-A OUTPUT "),
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
