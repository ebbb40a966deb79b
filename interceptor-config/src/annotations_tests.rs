use super::*;

fn pod(annotations: &[(&str, &str)]) -> BTreeMap<String, String> {
    annotations
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn applied(annotations: &[(&str, &str)]) -> InterceptionConfig {
    apply(&InterceptionConfig::linkerd(), &pod(annotations)).unwrap()
}

#[test]
fn an_injected_pod_is_meshed() {
    assert_eq!(
        decide(&pod(&[(PROXY_VERSION, "edge-24.11.8")])),
        Decision::Mesh
    );
    // A pod injected by hand carries the annotation whatever linkerd.io/inject says.
    assert_eq!(
        decide(&pod(&[
            (PROXY_VERSION, "stable-2.14.10"),
            ("linkerd.io/inject", "disabled"),
        ])),
        Decision::Mesh
    );
}

#[test]
fn a_pod_linkerd_did_not_inject_is_skipped_with_the_reason() {
    for annotations in [
        pod(&[]),
        pod(&[("linkerd.io/inject", "enabled")]),
        pod(&[(SKIP_OUTBOUND_PORTS, "1404")]),
        pod(&[("config.linkerd.io/proxy-version", "stable-2.14.10")]),
    ] {
        let Decision::Skip { reason } = decide(&annotations) else {
            panic!("{annotations:?} is meshed");
        };
        assert_eq!(reason, SkipReason::NotInjected);
        assert_eq!(reason.label(), "not_injected");
        assert!(reason.to_string().contains(PROXY_VERSION), "{reason}");
    }
}

#[test]
fn no_annotation_keeps_the_base_configuration() {
    let base = InterceptionConfig::linkerd();
    assert_eq!(applied(&[(PROXY_VERSION, "v1"), ("app", "web")]), base);
    // An empty value is no value, as in linkerd-cni.
    assert_eq!(
        applied(&[(SKIP_OUTBOUND_PORTS, ""), (PROXY_UID, " ")]),
        base
    );
}

#[test]
fn skip_outbound_ports_replaces_the_list() {
    let mut base = InterceptionConfig::linkerd();
    base.outbound_ports_to_ignore = "443".parse().unwrap();
    let config = apply(&base, &pod(&[(SKIP_OUTBOUND_PORTS, "25,587,3306-3307")])).unwrap();
    assert_eq!(
        config.outbound_ports_to_ignore.to_string(),
        "25,587,3306-3307"
    );
    assert!(!config.outbound_ports_to_ignore.contains(443));
}

#[test]
fn skip_inbound_ports_adds_to_the_list() {
    let config = applied(&[(SKIP_INBOUND_PORTS, "4222,6222,4320-4325")]);
    assert_eq!(
        config.inbound_ports_to_ignore.to_string(),
        "4190,4191,4222,6222,4320-4325"
    );
}

#[test]
fn skip_subnets_replaces_the_inbound_subnets() {
    let mut base = InterceptionConfig::linkerd();
    base.set("subnets-to-ignore", "10.0.0.0/8").unwrap();
    let config = apply(&base, &pod(&[(SKIP_SUBNETS, "172.17.0.0/16,fd00::/8")])).unwrap();
    assert_eq!(
        config
            .subnets_to_ignore
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["172.17.0.0/16", "fd00::/8"]
    );
    assert!(config.outbound_subnets_to_ignore.is_empty());
}

#[test]
fn proxy_ids_and_ports() {
    let config = applied(&[
        (PROXY_UID, "2103"),
        (PROXY_GID, "2104"),
        (INBOUND_PORT, "5143"),
        (OUTBOUND_PORT, "5140"),
        (ADMIN_PORT, "5191"),
        (CONTROL_PORT, "5190"),
    ]);
    assert_eq!(config.proxy_uid, Some(2103));
    assert_eq!(config.proxy_gid, Some(2104));
    assert_eq!(config.incoming_proxy_port, 5143);
    assert_eq!(config.outgoing_proxy_port, 5140);
    // Applied in the order of CONFIG_ANNOTATIONS; a port already ignored is not repeated.
    assert_eq!(
        config.inbound_ports_to_ignore.to_string(),
        "4190,4191,5191,5190"
    );
    assert_eq!(
        applied(&[(ADMIN_PORT, "4191")])
            .inbound_ports_to_ignore
            .to_string(),
        "4190,4191"
    );
}

#[test]
fn a_malformed_value_names_the_annotation_and_the_value() {
    for (name, value, reason) in [
        (
            SKIP_OUTBOUND_PORTS,
            "25,smtp",
            "\"smtp\" is not a port number",
        ),
        (
            SKIP_OUTBOUND_PORTS,
            "3307-3306",
            "low end above its high end",
        ),
        (SKIP_INBOUND_PORTS, "70000", "out of range"),
        (SKIP_SUBNETS, "172.17.0.0/33", "CIDR"),
        (PROXY_UID, "linkerd", "not a numeric id"),
        (PROXY_GID, "2102.5", "not a numeric id"),
        (INBOUND_PORT, "0", "out of range"),
        (OUTBOUND_PORT, "4140,4141", "not a port number"),
        (ADMIN_PORT, "4190-4191", "not a single port"),
        (CONTROL_PORT, "x", "not a port number"),
    ] {
        let e = apply(&InterceptionConfig::linkerd(), &pod(&[(name, value)])).unwrap_err();
        let message = e.to_string();
        assert!(
            message.starts_with(&format!("invalid value '{value}' for '{name}': ")),
            "{message}"
        );
        assert!(message.contains(reason), "{message}");
    }
}

#[test]
fn a_negative_proxy_id_is_none_as_in_proxy_init() {
    // Linkerd's chart spells an unset GID -1; proxy-init writes no rule for 0 or below.
    let config = applied(&[(PROXY_UID, "-1"), (PROXY_GID, "-1")]);
    assert_eq!(config.proxy_uid, None);
    assert_eq!(config.proxy_gid, None);
    assert_eq!(applied(&[(PROXY_GID, "0")]).proxy_gid, None);
}

#[test]
fn a_control_plane_pod_reaches_the_api_server_around_its_proxy() {
    // After the pod's own skip-outbound-ports, which replaces the list, as linkerd-cni does.
    let mut config = applied(&[(SKIP_OUTBOUND_PORTS, "25,443")]);
    skip_api_server(&mut config, &DEFAULT_API_SERVER_PORTS);
    assert_eq!(config.outbound_ports_to_ignore.to_string(), "25,443,6443");
    // The `kubernetes` Service's port and target port, as linkerd-cni reads them.
    let mut config = InterceptionConfig::linkerd();
    skip_api_server(&mut config, &[443, 8443]);
    assert_eq!(config.outbound_ports_to_ignore.to_string(), "443,8443");
}

/// Found by the `annotations` fuzz target (`!control-plane=0`): port 0 went into the ignore
/// list, a configuration its own JSON form refuses, so the agent refused the pod.
#[test]
fn an_api_server_port_of_0_is_not_skipped() {
    let mut config = InterceptionConfig::linkerd();
    skip_api_server(&mut config, &[0, 443]);
    assert_eq!(config.outbound_ports_to_ignore.to_string(), "443");
    let json = serde_json::to_string(&config).unwrap();
    assert_eq!(
        serde_json::from_str::<InterceptionConfig>(&json).unwrap(),
        config
    );
}

#[test]
fn a_pod_with_a_linkerd_init_container_is_left_to_it() {
    let injected = pod(&[(PROXY_VERSION, "stable-2.14.10")]);
    assert_eq!(decide_with_containers(&injected, false), Decision::Mesh);
    let Decision::Skip { reason } = decide_with_containers(&injected, true) else {
        panic!("a pod with linkerd-init is meshed");
    };
    assert_eq!(reason.label(), "linkerd_init");
    assert!(reason.to_string().contains("linkerd-init"), "{reason}");
    // Not injected stays the reason when both hold.
    assert_eq!(
        decide_with_containers(&pod(&[]), true),
        Decision::Skip {
            reason: SkipReason::NotInjected
        }
    );
}

#[test]
fn a_namespaces_config_annotations_apply_where_the_pod_has_none_of_its_own() {
    let namespace = pod(&[
        (SKIP_OUTBOUND_PORTS, "3306"),
        (PROXY_UID, "2103"),
        (SKIP_SUBNETS, "10.0.0.0/8"),
        ("linkerd.io/inject", "enabled"),
        (PROXY_VERSION, "edge-24.11.8"),
        (
            "config.alpha.linkerd.io/proxy-wait-before-exit-seconds",
            "5",
        ),
    ]);
    let own = pod(&[
        (PROXY_VERSION, "stable-2.14.10"),
        (SKIP_OUTBOUND_PORTS, "25"),
        (PROXY_UID, " "),
    ]);
    let merged = with_namespace_defaults(&own, &namespace);
    assert_eq!(
        merged,
        pod(&[
            (PROXY_VERSION, "stable-2.14.10"),
            // The pod's own value wins, key by key; an empty one is no value.
            (SKIP_OUTBOUND_PORTS, "25"),
            (PROXY_UID, "2103"),
            (SKIP_SUBNETS, "10.0.0.0/8"),
        ])
    );
    let config = apply(&InterceptionConfig::linkerd(), &merged).unwrap();
    assert_eq!(config.outbound_ports_to_ignore.to_string(), "25");
    assert_eq!(config.proxy_uid, Some(2103));
    // Only config.linkerd.io/* comes from the namespace: it never decides whether a pod is
    // meshed.
    assert_eq!(
        decide(&with_namespace_defaults(&pod(&[]), &namespace)),
        Decision::Skip {
            reason: SkipReason::NotInjected
        }
    );
}
