use std::collections::BTreeMap;

use super::*;

#[test]
fn a_pods_plan_follows_linkerd_cnis_rules() {
    let settings = || linkerd_settings(&BTreeMap::new()).unwrap();
    let injected = |extra: &[(&str, &str)]| KubePod {
        annotations: [("linkerd.io/proxy-version", "edge-24.11.8")]
            .iter()
            .chain(extra)
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..KubePod::default()
    };
    let mesh = |plan: Plan| match plan {
        Plan::Mesh(settings) => settings.config,
        Plan::Skip(reason) => panic!("skipped: {reason}"),
    };

    // Not injected, or with linkerd-init: left alone, unless every pod is meshed.
    assert_eq!(
        pod_plan(settings(), Pods::Injected, &KubePod::default()).unwrap(),
        Plan::Skip(SkipReason::NotInjected)
    );
    let with_init = KubePod {
        linkerd_init: true,
        ..injected(&[])
    };
    assert_eq!(
        pod_plan(settings(), Pods::Injected, &with_init).unwrap(),
        Plan::Skip(SkipReason::LinkerdInit)
    );
    assert_eq!(
        mesh(pod_plan(settings(), Pods::All, &KubePod::default()).unwrap()),
        settings().config
    );

    // The pod's annotations over its namespace's; a control-plane pod skips the API server.
    let pod = KubePod {
        namespace_annotations: [
            ("config.linkerd.io/skip-outbound-ports", "25"),
            ("config.linkerd.io/proxy-uid", "3000"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect(),
        control_plane_component: Some("destination".into()),
        api_server_ports: vec![443, 8443],
        ..injected(&[("config.linkerd.io/proxy-uid", "4000")])
    };
    let config = mesh(pod_plan(settings(), Pods::Injected, &pod).unwrap());
    assert_eq!(config.proxy_uid, Some(4000));
    assert_eq!(config.outbound_ports_to_ignore.to_string(), "25,443,8443");

    let bad = injected(&[("config.linkerd.io/skip-outbound-ports", "smtp")]);
    let error = pod_plan(settings(), Pods::Injected, &bad).unwrap_err();
    assert!(error.to_string().contains("smtp"), "{error}");
}
