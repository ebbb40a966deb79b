use super::*;

fn conf(json: &str) -> NetConf {
    serde_json::from_str(json).expect("a network configuration")
}

#[test]
fn linkerd_keys_become_proxy_init_flags_with_linkerds_defaults() {
    let c = conf(
        r#"{"cniVersion":"1.0.0","name":"k8s-pod-network","type":"interceptor-cni",
            "log_level":"info","kubernetes":{"kubeconfig":"/etc/kubeconfig"},
            "linkerd":{"outbound-ports-to-ignore":["443","6443"],"ipv6":false,
                       "iptables-mode":"nft","use-wait-flag":true}}"#,
    );
    let flags = pod_flags(&c, &BTreeMap::new()).unwrap();
    assert!(!flags.simulate);
    assert_eq!(
        flags.args,
        [
            "--inbound-ports-to-ignore",
            "4190,4191",
            "--incoming-proxy-port",
            "4143",
            "--ipv6=false",
            "--outbound-ports-to-ignore",
            "443,6443",
            "--outgoing-proxy-port",
            "4140",
            "--proxy-uid",
            "2102",
        ]
    );
}

#[test]
fn runtime_config_and_cni_args_override_per_pod() {
    let c = conf(
        r#"{"cniVersion":"0.4.0","name":"n","type":"interceptor-cni",
            "linkerd":{"proxy-uid":2102,"simulate":false},
            "runtimeConfig":{"linkerd":{"proxy-uid":"3000"}}}"#,
    );
    let args = parse_cni_args("K8S_POD_NAME=web;linkerd.simulate=true").unwrap();
    let flags = pod_flags(&c, &args).unwrap();
    assert!(flags.simulate);
    let uid = flags.args.iter().position(|a| a == "--proxy-uid").unwrap();
    assert_eq!(flags.args[uid + 1], "3000");
}

#[test]
fn unknown_keys_and_wrong_types_are_errors_naming_them() {
    for (linkerd, names) in [
        (r#"{"incoming-proxy-prot":4143}"#, "incoming-proxy-prot"),
        (r#"{"ipv6":"maybe"}"#, "ipv6"),
        (r#"{"iptables-mode":"fast"}"#, "iptables-mode"),
        (
            r#"{"inbound-ports-to-ignore":[{"port":1}]}"#,
            "inbound-ports-to-ignore",
        ),
        (r#"{"incoming-proxy-port":[1]}"#, "incoming-proxy-port"),
    ] {
        let c = conf(&format!(
            r#"{{"cniVersion":"1.0.0","name":"n","type":"t","linkerd":{linkerd}}}"#
        ));
        let err = pod_flags(&c, &BTreeMap::new()).unwrap_err();
        assert!(err.contains(names), "{linkerd}: {err}");
    }
    assert!(parse_cni_args("K8S_POD_NAME").is_err());
}
