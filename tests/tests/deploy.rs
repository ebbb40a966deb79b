//! What ships: the Helm chart `charts/interceptor`, the one source of the Kubernetes manifests,
//! rendered and linted by Helm's own code (tests/helm_render.py, on helm-python-sdk's libhelm_c,
//! which `cargo xtask setup` installs beside the schema validator and puts first on PATH). It
//! lints clean; each render validates strictly against Kubernetes 1.31's schema (the oldest
//! Linkerd supports) and the newest the validator ships; it names its objects as linkerd-cni
//! does, which `linkerd check` reads, puts every value of linkerd2-cni's chart where linkerd-cni
//! puts it, and refuses what it cannot run; its values reference cannot drift from values.yaml;
//! the commands it runs are accepted by this build's command line and CNI plugin; and the OCI
//! image (`cargo xtask image`, whose path `cargo xtask test` passes in `INTERCEPTOR_IMAGE`) runs
//! the agent, the plugin and both iptables modes, and the DaemonSet's pod under podman.
use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    process::{Command, Stdio},
};

use interceptor_tests::{
    chart::{
        CHART, NAMESPACE, Rendered,
        args::{HOST_IP, agent_args, args_of, parse},
        container, helm, render,
        schemas::{newest_schemas, validate},
        try_render, workspace_root,
    },
    cni_network::{self, CniNetwork},
    command::run,
    node_image::{AgentPod, NodeImage},
    privileged, unique_name,
};
use serde_json::{Value, json};

/// Every value set to something other than its default.
const EVERY_VALUE: &str = "charts/interceptor/ci/every-value.yaml";
/// Each platform's values file, and the host's CNI plugin and configuration directories it
/// gives.
const PLATFORMS: [(&str, &str, &str); 2] = [
    (
        "charts/platforms/gke.yaml",
        "/home/kubernetes/bin",
        "/etc/cni/net.d",
    ),
    (
        "charts/platforms/k3s.yaml",
        "/var/lib/rancher/k3s/data/cni",
        "/var/lib/rancher/k3s/agent/etc/cni/net.d",
    ),
];

#[test]
fn the_chart_passes_helm_lint_strict() {
    let out = helm(&["lint", CHART]).output().unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The default render, the Namespace `linkerd install-cni`-style tools get, each platform's
/// and the one with every value set, against the oldest and the newest schemas: every object of
/// Kubernetes' own kinds passes (the ServiceMonitor's kind is the Prometheus Operator's, and has
/// no schema there).
#[test]
fn every_render_validates_against_kubernetes_1_31_and_the_newest_schemas_strictly() {
    let newest = newest_schemas();
    assert!(
        newest.as_str() > "1.31.0",
        "kubernetes-validate {newest} ships no schemas newer than 1.31"
    );
    let mut renders = vec![
        ("default".to_owned(), render(&[])),
        (
            "release service CLI".to_owned(),
            try_render(&[], Some("CLI")).unwrap(),
        ),
        (EVERY_VALUE.to_owned(), render(&[EVERY_VALUE])),
    ];
    for (file, _, _) in PLATFORMS {
        renders.push((file.to_owned(), render(&[file])));
    }
    let mut kinds = BTreeSet::new();
    for (what, rendered) in &renders {
        for version in ["1.31.0", newest.as_str()] {
            let out = validate(&rendered.yaml, version)
                .unwrap_or_else(|e| panic!("{what} against {version}: {e}"));
            for object in &rendered.objects {
                let kind = object["kind"].as_str().unwrap();
                let name = object["metadata"]["name"].as_str().unwrap();
                let line = if kind == "ServiceMonitor" {
                    "Couldn't find schema for kind ServiceMonitor".to_owned()
                } else {
                    format!("passed for resource {}/{name}", kind.to_lowercase())
                };
                assert!(
                    out.lines().any(|l| l.contains(&line)),
                    "{what}: {kind} {name} not validated against {version}: {out}"
                );
                kinds.insert(kind.to_owned());
            }
        }
    }
    assert_eq!(
        kinds,
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "DaemonSet",
            "Job",
            "Namespace",
            "ResourceQuota",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount",
            "ServiceMonitor",
        ]
        .map(String::from)
        .into()
    );

    // The same validator refuses what the schema does not know, so a pass means something.
    let bad = renders[0]
        .1
        .yaml
        .replace("hostPID: true", "hostPID: true\n      hostPIDs: true");
    assert_ne!(bad, renders[0].1.yaml);
    for version in ["1.31.0", newest.as_str()] {
        assert!(validate(&bad, version).is_err(), "{version}");
    }
}

/// What `linkerd check`'s linkerd-cni-plugin category GETs by name (linkerd/linkerd2
/// pkg/healthcheck/healthcheck.go: `linkerdCNIResourceName` and `linkerdCNIConfigMapName` at
/// :157-158, the six checks at :864-962): the ConfigMap, the ClusterRole, the ClusterRoleBinding,
/// the ServiceAccount and the DaemonSet (twice: it exists, and its ready pods equal its
/// scheduled ones), the namespaced ones in `--cni-namespace` (default linkerd-cni). And the
/// DaemonSet's selector, linkerd-cni's (charts/linkerd2-cni/templates/cni-plugin.yaml:199-201),
/// which cannot change: `helm upgrade linkerd2-cni` onto this chart replaces its pods in place.
#[test]
fn linkerd_check_finds_linkerd_cnis_objects_by_name_and_the_selector_is_linkerd_cnis() {
    const READ_BY_LINKERD_CHECK: [(&str, &str, bool); 5] = [
        ("ConfigMap", "linkerd-cni-config", true),
        ("ClusterRole", "linkerd-cni", false),
        ("ClusterRoleBinding", "linkerd-cni", false),
        ("ServiceAccount", "linkerd-cni", true),
        ("DaemonSet", "linkerd-cni", true),
    ];
    for values in [&[][..], &[EVERY_VALUE][..]] {
        let rendered = render(values);
        for (kind, name, namespaced) in READ_BY_LINKERD_CHECK {
            let object = rendered.find(kind, name);
            let namespace = &object["metadata"]["namespace"];
            if namespaced {
                assert_eq!(namespace, NAMESPACE, "{kind} {name}");
            } else {
                assert!(namespace.is_null(), "{kind} {name}");
            }
            // Part of the release (a hook is not kept by `helm upgrade` as an object).
            assert!(
                object["metadata"]["annotations"]["helm.sh/hook"].is_null(),
                "{kind} {name}"
            );
        }
        let daemonset = rendered.daemonset();
        assert_eq!(
            daemonset["spec"]["selector"],
            json!({"matchLabels": {"k8s-app": "linkerd-cni"}})
        );
        let template = &daemonset["spec"]["template"]["metadata"];
        assert_eq!(template["labels"]["k8s-app"], "linkerd-cni");
        // Linkerd's injector and control-plane lookups skip objects with linkerd-cni's resource
        // label; the agent and the installer tell the DaemonSet is still theirs by
        // app.kubernetes.io/name.
        for object in rendered.objects.iter().chain([template]) {
            let labels = if object["metadata"].is_object() {
                &object["metadata"]["labels"]
            } else {
                &object["labels"]
            };
            for (key, value) in [
                ("linkerd.io/cni-resource", "true"),
                ("app.kubernetes.io/name", "interceptor"),
                ("app.kubernetes.io/part-of", "interceptor"),
            ] {
                assert_eq!(labels[key], value, "{key} on {object}");
            }
        }
        assert_eq!(template["annotations"]["linkerd.io/inject"], "disabled");
    }
    // The one label the code reads off the DaemonSet, which commonLabels cannot replace.
    let rendered = render(&[r#"{"commonLabels": {"app.kubernetes.io/name": "other"}}"#]);
    assert_eq!(
        rendered.daemonset()["metadata"]["labels"]["app.kubernetes.io/name"],
        interceptor::kubernetes::OWN_LABEL.1
    );
}

#[test]
fn the_daemonset_runs_the_agent_and_the_installer_as_this_build_expects() {
    let rendered = render(&[]);
    let daemonset = rendered.daemonset();
    let config = rendered.config();
    let pod = &daemonset["spec"]["template"]["spec"];

    // Off the CNI chain it installs (its own ADD would wait for the agent it starts), on every
    // node whatever its taints, before ordinary pods, one node at a time.
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["hostPID"], true, "the listener adoption reads /proc");
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    assert_eq!(pod["tolerations"], json!([{"operator": "Exists"}]));
    assert_eq!(
        daemonset["spec"]["updateStrategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}})
    );
    assert_eq!(daemonset["spec"]["revisionHistoryLimit"], 10);
    assert_eq!(pod["nodeSelector"], json!({"kubernetes.io/os": "linux"}));
    assert!(pod.get("affinity").is_none(), "{pod}");
    // Admitted where system-node-critical is limited to quotas (GKE): one scoped to that class.
    let quota = rendered.find("ResourceQuota", "interceptor-critical-pods");
    assert_eq!(
        quota["spec"]["scopeSelector"]["matchExpressions"],
        json!([{"operator": "In", "scopeName": "PriorityClass", "values": ["system-node-critical"]}])
    );
    // The API access, for the DaemonSet's account: what the agent reads and writes, and get of
    // this DaemonSet, in its namespace, for the agent and the installer; nothing more.
    assert_eq!(pod["automountServiceAccountToken"], true);
    assert_eq!(pod["serviceAccountName"], "linkerd-cni");
    let account =
        json!([{"kind": "ServiceAccount", "name": "linkerd-cni", "namespace": NAMESPACE}]);
    let role = rendered.find("ClusterRole", "linkerd-cni");
    assert_eq!(
        role["rules"],
        json!([
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["services"], "resourceNames": ["kubernetes"], "verbs": ["get"]},
            {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
        ])
    );
    let binding = rendered.find("ClusterRoleBinding", "linkerd-cni");
    assert_eq!(binding["subjects"], account);
    assert_eq!(
        binding["roleRef"],
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "linkerd-cni"})
    );
    let role = rendered.find("Role", "linkerd-cni-own-daemonset");
    assert_eq!(role["metadata"]["namespace"], NAMESPACE);
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": ["apps"], "resources": ["daemonsets"], "resourceNames": ["linkerd-cni"], "verbs": ["get"]}])
    );
    let binding = rendered.find("RoleBinding", "linkerd-cni-own-daemonset");
    assert_eq!(binding["metadata"]["namespace"], NAMESPACE);
    assert_eq!(binding["subjects"], account);
    assert_eq!(
        binding["roleRef"],
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "linkerd-cni-own-daemonset"})
    );
    let own_daemonset = Some(interceptor::kubernetes::DaemonSetRef {
        namespace: NAMESPACE.to_owned(),
        name: "linkerd-cni".to_owned(),
    });

    // The agent: its flags parse, its metrics port is the named, scraped one, and /ready is the
    // readiness probe.
    let agent = container(daemonset, "agent");
    let (log_level, daemon) = agent_args(&rendered);
    assert!(daemon.kubernetes, "--kubernetes");
    // Repair registers a pod with what its ADD would have given: the plugin's linkerd block.
    let block: Value = serde_json::from_str(&rendered.linkerd_block()).unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&daemon.linkerd).unwrap(),
        block,
        "--linkerd"
    );
    assert_eq!(daemon.repair_interval, 10, "repair is on");
    assert_eq!(daemon.max_pods, interceptor_common::MAX_PODS);
    assert_eq!(
        daemon.mode,
        interceptor::cli::Mode::Auto,
        "eBPF where it loads, else iptables"
    );
    assert_eq!(
        daemon.iptables.iptables_mode,
        interceptor::iptables::IptablesMode::Nft,
        "Linkerd's default"
    );
    assert!(daemon.iptables.use_wait_flag);
    assert_eq!(log_level, "info");
    // On SIGTERM it asks the API whether this DaemonSet is going away.
    assert_eq!(daemon.daemonset, own_daemonset);
    // Ready only while the installer reports the plugin chained, in the directory both mount.
    let chain_report = Path::new("/run/interceptor/cni-chain.json");
    assert_eq!(daemon.cni_chain_report.as_deref(), Some(chain_report));
    assert_eq!(daemon.startup_taint, None, "no startupTaint");
    let metrics = daemon.metrics_addr.expect("--metrics-addr");
    // The node's own address only (status.hostIP), not every interface of the host.
    assert_eq!(metrics.ip().to_string(), HOST_IP, "{metrics}");
    assert_eq!(metrics.port(), 9990);
    assert_eq!(
        agent["ports"],
        json!([{"name": "metrics", "containerPort": metrics.port(), "protocol": "TCP"}])
    );
    let annotations = &daemonset["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/scrape"], "true");
    assert_eq!(
        annotations["prometheus.io/port"],
        metrics.port().to_string()
    );
    assert_eq!(
        agent["readinessProbe"]["httpGet"],
        json!({"path": "/ready", "port": "metrics"})
    );
    for probe in ["startupProbe", "livenessProbe"] {
        assert_eq!(
            agent[probe]["httpGet"],
            json!({"path": "/live", "port": "metrics"}),
            "{probe}"
        );
    }
    // No cgroup to configure: the kubelet's pod cgroup, found under the host's cgroup2 mount.
    assert_eq!(daemon.cgroup, None, "no --cgroup to get right");
    assert_eq!(
        daemon.kubepods_under.as_deref(),
        Some(Path::new("/host/sys/fs/cgroup"))
    );
    assert_eq!(
        agent["resources"],
        json!({"requests": {"cpu": "20m", "memory": "32Mi"}, "limits": {"memory": "256Mi"}})
    );
    assert!(rendered.get("Service", "linkerd-cni-metrics").is_none());

    // Not privileged: the capabilities it uses, AppArmor unconfined as Cilium's agent, the
    // runtime's seccomp profile, spc_t under SELinux.
    let security = &agent["securityContext"];
    assert_eq!(security.get("privileged"), None, "{security}");
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(
        security["capabilities"],
        json!({"drop": ["ALL"], "add": ["BPF", "PERFMON", "NET_ADMIN", "NET_RAW", "SYS_ADMIN", "SYS_PTRACE", "NET_BROADCAST"]})
    );
    assert_eq!(security["appArmorProfile"], json!({"type": "Unconfined"}));
    assert_eq!(
        security["seccompProfile"],
        json!({"type": "RuntimeDefault"})
    );
    assert_eq!(security["seLinuxOptions"]["type"], "spc_t");
    let mounts: BTreeMap<String, Value> = agent["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["mountPath"].as_str().unwrap().to_owned(), m.clone()))
        .collect();
    assert_eq!(mounts["/sys/fs/bpf"]["mountPropagation"], "HostToContainer");
    // The host's bpffs is mounted, where the node has none, by a privileged init container that
    // does nothing else.
    let init = pod["initContainers"].as_array().expect("initContainers");
    assert_eq!(init.len(), 1);
    let mount = &init[0];
    assert_eq!(mount["securityContext"], json!({"privileged": true}));
    assert_eq!(
        mount["volumeMounts"],
        json!([{"name": "bpffs", "mountPath": "/sys/fs/bpf", "mountPropagation": "Bidirectional"}])
    );
    let args = args_of(mount, &config, NAMESPACE);
    let interceptor::cli::Command::MountBpffs(bpffs) = parse(&args, "init container").command
    else {
        panic!("the init container runs {args:?}, not `mount-bpffs`");
    };
    assert_eq!(bpffs.path, Path::new("/sys/fs/bpf"));
    for netns in ["/run/netns", "/var/run/netns"] {
        assert_eq!(
            mounts[netns]["mountPropagation"], "HostToContainer",
            "{netns}"
        );
    }
    assert!(mounts.contains_key("/run/interceptor"), "the API socket");

    // The installer: its flags parse; it watches, and on SIGTERM asks the API for this very
    // DaemonSet with the pod's account; the plugin accepts the ConfigMap's linkerd block.
    let installer = container(daemonset, "install-cni");
    let args = args_of(installer, &config, NAMESPACE);
    let cli = parse(&args, "installer");
    assert_eq!(cli.log_level, "info", "logLevel");
    let interceptor::cli::Command::Cni(interceptor::cli::CniArgs {
        command:
            interceptor::cli::CniCommand::Install {
                watch,
                daemonset: owner,
                kubeconfig,
                linkerd,
                chain_report: report,
                ..
            },
        bin_dir,
        conf_dir,
    }) = cli.command
    else {
        panic!("the installer container runs {args:?}, not `cni install`");
    };
    assert!(watch, "--watch");
    assert_eq!(owner, own_daemonset);
    assert_eq!(kubeconfig, None, "the pod's service account");
    assert_eq!(
        serde_json::from_str::<Value>(&linkerd).unwrap(),
        block,
        "--linkerd"
    );
    // The host's CNI directories (destCNIBinDir, destCNINetDir), where it is told to write.
    let host_path = |mount_path: &Path| -> String {
        let mount = installer["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| Path::new(m["mountPath"].as_str().unwrap()) == mount_path)
            .unwrap_or_else(|| panic!("nothing mounted at {}", mount_path.display()));
        pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap()["hostPath"]["path"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(host_path(&bin_dir), "/opt/cni/bin");
    assert_eq!(host_path(&conf_dir), "/etc/cni/net.d");
    // Restores of the chain reach the agent: its socket where --agent-socket names it, in the
    // state directory, which the installer may write to.
    let socket = args
        .iter()
        .find_map(|a| a.strip_prefix("--agent-socket="))
        .expect("--agent-socket");
    let state = installer["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "state")
        .expect("the state directory in the installer");
    assert_eq!(
        Path::new(socket).parent().unwrap(),
        Path::new(state["mountPath"].as_str().unwrap())
    );
    assert_eq!(state.get("readOnly"), None, "{state}");
    assert_eq!(
        report.as_deref(),
        Some(chain_report),
        "the agent's --cni-chain-report"
    );
    let security = &installer["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(
        security["seccompProfile"],
        json!({"type": "RuntimeDefault"})
    );
    assert_eq!(security["seLinuxOptions"]["type"], "spc_t");
    for container in init.iter().chain(pod["containers"].as_array().unwrap()) {
        assert_eq!(container["image"], interceptor_tests::node_image::IMAGE);
        assert_eq!(container["imagePullPolicy"], "IfNotPresent");
    }

    // The block as linkerd2-cni renders it with its defaults
    // (charts/linkerd2-cni/templates/cni-plugin.yaml:164-183), which the plugin accepts.
    let linkerd = &rendered.linkerd_block();
    assert_eq!(
        keys_in_order(linkerd),
        [
            "incoming-proxy-port",
            "outgoing-proxy-port",
            "proxy-uid",
            "ports-to-redirect",
            "inbound-ports-to-ignore",
            "simulate",
            "use-wait-flag",
            "iptables-mode",
            "ipv6",
        ]
    );
    assert_eq!(
        serde_json::from_str::<Value>(linkerd).unwrap(),
        json!({
            "incoming-proxy-port": 4143,
            "outgoing-proxy-port": 4140,
            "proxy-uid": 2102,
            "ports-to-redirect": [],
            "inbound-ports-to-ignore": ["4191", "4190"],
            "simulate": false,
            "use-wait-flag": false,
            "iptables-mode": "nft",
            "ipv6": false,
        })
    );
    let settings = plugin_settings(linkerd);
    assert_eq!(settings.config.incoming_proxy_port, 4143);
    assert_eq!(settings.config.proxy_uid, Some(2102));
    assert!(settings.config.ports_to_redirect.is_empty(), "every port");
    // Linkerd's default proxy listens on IPv4 only (linkerd-cni writes "ipv6": false).
    assert!(!settings.config.ipv6, "the ConfigMap meshes IPv4 only");
    assert_eq!(daemon.mode, interceptor::cli::Mode::Auto);
    assert_eq!(
        daemon.iptables.iptables_mode,
        interceptor::iptables::IptablesMode::Nft
    );

    // Nothing in NOTES.txt about values this chart ignores: none was set.
    assert!(!rendered.notes.contains("ignored"), "{}", rendered.notes);
}

/// The keys of a JSON object's text, in the order written.
fn keys_in_order(json: &str) -> Vec<String> {
    json.lines()
        .filter_map(|line| {
            let line = line.trim_start().strip_prefix('"')?;
            let (key, rest) = line.split_once('"')?;
            rest.starts_with(':').then(|| key.to_owned())
        })
        .collect()
}

/// The plugin's settings from a ConfigMap's `linkerd` block, as its ADD computes them.
fn plugin_settings(linkerd: &str) -> interceptor::config::mesh::PodSettings {
    let linkerd: Value = serde_json::from_str(linkerd).unwrap();
    let conf: interceptor_cni::NetConf = serde_json::from_value(json!({
        "cniVersion": "1.0.0", "name": "k8s", "type": "interceptor-cni", "linkerd": linkerd,
    }))
    .unwrap();
    interceptor_cni::pod_settings(&conf, &Default::default())
        .unwrap_or_else(|e| panic!("the ConfigMap's linkerd block: {e}"))
}

/// charts/interceptor/ci/every-value.yaml sets each value of linkerd2-cni's chart (and ours) to
/// something other than its default; each lands where linkerd-cni puts it, or where this chart
/// says it does.
#[test]
fn every_value_lands_where_linkerd_cni_puts_it() {
    let rendered = render(&[EVERY_VALUE]);
    let daemonset = rendered.daemonset();
    let config = rendered.config();
    let template = &daemonset["spec"]["template"];
    let pod = &template["spec"];

    // The `linkerd` block, key by key and in order, as linkerd2-cni's chart renders it for the
    // same values (linkerd/linkerd2 charts/linkerd2-cni/templates/cni-plugin.yaml:164-183, the
    // lists split by charts/partials/templates/_helpers.tpl's partials.splitStringList):
    // proxy-gid only when >= 0, ports-to-redirect as written (numbers), inbound-ports-to-ignore
    // the admin port, the control port, then ignoreInboundPorts, outbound-ports-to-ignore only
    // when set, "ipv6" the opposite of disableIPv6.
    let linkerd = &rendered.linkerd_block();
    assert_eq!(
        keys_in_order(linkerd),
        [
            "incoming-proxy-port",
            "outgoing-proxy-port",
            "proxy-uid",
            "proxy-gid",
            "ports-to-redirect",
            "inbound-ports-to-ignore",
            "outbound-ports-to-ignore",
            "simulate",
            "use-wait-flag",
            "iptables-mode",
            "ipv6",
        ]
    );
    assert_eq!(
        serde_json::from_str::<Value>(linkerd).unwrap(),
        json!({
            "incoming-proxy-port": 4243,
            "outgoing-proxy-port": 4240,
            "proxy-uid": 2103,
            "proxy-gid": 2104,
            "ports-to-redirect": [80, 443],
            "inbound-ports-to-ignore": ["4291", "4290", "25", "8000-8080"],
            "outbound-ports-to-ignore": ["3306", "5432-5433"],
            "simulate": false,
            "use-wait-flag": true,
            "iptables-mode": "legacy",
            "ipv6": true,
        })
    );
    // And the plugin takes each as proxy-init would.
    let settings = plugin_settings(linkerd);
    let config_of = &settings.config;
    assert_eq!(config_of.incoming_proxy_port, 4243);
    assert_eq!(config_of.outgoing_proxy_port, 4240);
    assert_eq!(config_of.proxy_uid, Some(2103));
    assert_eq!(config_of.proxy_gid, Some(2104));
    assert_eq!(config_of.ports_to_redirect, [80, 443]);
    for port in [4291, 4290, 25, 8000, 8080] {
        assert!(config_of.inbound_ports_to_ignore.contains(port), "{port}");
    }
    assert!(!config_of.inbound_ports_to_ignore.contains(4190));
    for port in [3306, 5432, 5433] {
        assert!(config_of.outbound_ports_to_ignore.contains(port), "{port}");
    }
    assert!(config_of.ipv6);
    assert!(!settings.simulate);

    // The pods: podLabels and commonLabels, the priority class (not a system one: no quota),
    // the DaemonSet's history and strategy, tolerations, node affinity.
    for (key, value) in [
        ("team", "mesh"),
        ("owner", "platform"),
        ("k8s-app", "linkerd-cni"),
    ] {
        assert_eq!(template["metadata"]["labels"][key], value, "{key}");
    }
    for object in &rendered.objects {
        assert_eq!(
            object["metadata"]["labels"]["owner"], "platform",
            "{object}"
        );
    }
    assert_eq!(pod["priorityClassName"], "mesh-critical");
    assert!(
        !rendered
            .objects
            .iter()
            .any(|o| o["kind"] == "ResourceQuota"),
        "a quota only for the system-* classes"
    );
    assert_eq!(daemonset["spec"]["revisionHistoryLimit"], 3);
    assert_eq!(
        daemonset["spec"]["updateStrategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}})
    );
    assert_eq!(
        pod["tolerations"],
        json!([{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}])
    );
    assert_eq!(
        pod["affinity"],
        json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "mesh", "operator": "In", "values": ["true"]}]}
        ]}}})
    );
    // The image and its pull policy in every container of ours, the pull secrets on the
    // account, the extra init containers after mount-bpffs.
    let init = pod["initContainers"].as_array().unwrap();
    assert_eq!(init[0]["name"], "mount-bpffs");
    assert_eq!(
        init[1..],
        [json!({
            "name": "wait-for-primary-cni",
            "image": "registry.example.com/busybox:1.36",
            "command": ["sh", "-c", "until ls /host/etc/cni/net.d/*.conflist; do sleep 1; done"],
        })]
    );
    for container in init[..1]
        .iter()
        .chain(pod["containers"].as_array().unwrap())
    {
        assert_eq!(
            container["image"], "registry.example.com/mesh/interceptor:0.1.0-rc.1",
            "{}",
            container["name"]
        );
        assert_eq!(container["imagePullPolicy"], "Always");
    }
    assert_eq!(
        rendered.find("ServiceAccount", "linkerd-cni")["imagePullSecrets"],
        json!([{"name": "registry-login"}])
    );
    // agent.resources.*: the agent's; resources.*: install-cni's, as in linkerd-cni.
    assert_eq!(
        container(daemonset, "install-cni")["resources"],
        json!({
            "limits": {"cpu": "100m", "memory": "96Mi", "ephemeral-storage": "200Mi"},
            "requests": {"cpu": "10m", "memory": "16Mi", "ephemeral-storage": "20Mi"},
        })
    );
    assert_eq!(
        container(daemonset, "install-cni")["securityContext"]["privileged"],
        true,
        "privileged: install-cni, as linkerd-cni's"
    );
    assert_eq!(
        container(daemonset, "agent")["resources"],
        json!({
            "limits": {"cpu": "500m", "memory": "512Mi", "ephemeral-storage": "1Gi"},
            "requests": {"cpu": "50m", "memory": "64Mi", "ephemeral-storage": "100Mi"},
        })
    );
    // destCNIBinDir, destCNINetDir: the host's directories.
    let host_paths: BTreeMap<&str, &str> = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| Some((v["name"].as_str()?, v["hostPath"]["path"].as_str()?)))
        .collect();
    assert_eq!(host_paths["cni-bin-dir"], "/opt/custom/bin");
    assert_eq!(host_paths["cni-net-dir"], "/etc/custom/net.d");

    // Our own values: the agent's flags.
    let (log_level, daemon) = agent_args(&rendered);
    assert_eq!(
        daemon.startup_taint.as_deref(),
        Some("interceptor.linkerd.io/agent-not-ready")
    );
    assert_eq!(daemon.mode, interceptor::cli::Mode::Iptables);
    assert_eq!(
        daemon.iptables.iptables_mode,
        interceptor::iptables::IptablesMode::Legacy
    );
    assert_eq!(daemon.max_pods, 250);
    assert_eq!(daemon.repair_interval, 30);
    assert_eq!(daemon.metrics_addr.unwrap().port(), 9991);
    assert_eq!(log_level, "info,interceptor::ebpf=debug", "agentLogLevel");
    let installer = args_of(container(daemonset, "install-cni"), &config, NAMESPACE);
    assert_eq!(
        parse(&installer, "installer").log_level,
        "warn",
        "logLevel: warning, in tracing's word"
    );
    assert_eq!(
        container(daemonset, "agent")["ports"][0]["containerPort"],
        9991
    );
    assert_eq!(
        template["metadata"]["annotations"]["prometheus.io/port"],
        "9991"
    );
    // serviceMonitor.enabled: a headless Service on the pods' metrics port, and a ServiceMonitor
    // that selects it.
    let service = rendered.find("Service", "linkerd-cni-metrics");
    assert_eq!(service["spec"]["clusterIP"], "None");
    assert_eq!(
        service["spec"]["selector"],
        json!({"k8s-app": "linkerd-cni"})
    );
    assert_eq!(
        service["spec"]["ports"],
        json!([{"name": "metrics", "port": 9991, "targetPort": "metrics", "protocol": "TCP"}])
    );
    let monitor = rendered.find("ServiceMonitor", "linkerd-cni");
    for (key, value) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(&service["metadata"]["labels"][key], value, "{key}");
    }
    assert_eq!(
        monitor["spec"]["endpoints"],
        json!([{"port": "metrics", "path": "/metrics"}])
    );
    // createNamespaceMetadataJob: false.
    assert!(
        !rendered
            .objects
            .iter()
            .any(|o| o["metadata"]["name"] == "namespace-metadata"),
        "no namespace-metadata hook"
    );

    // The values with no meaning here are accepted, and NOTES.txt says why they do nothing.
    for value in [
        "enablePSP=true is ignored",
        "privileged=true runs install-cni privileged",
        "repairController.enabled=true is ignored",
    ] {
        assert!(
            rendered.notes.contains(value),
            "{value}: {}",
            rendered.notes
        );
    }
}

/// The Namespace `linkerd install-cni`-style tools render (`.Release.Service` "CLI"), and, for
/// Helm installs (`--create-namespace` makes it bare), the post-install and post-upgrade Job
/// that gives it the same labels and annotation, with an account that may touch only it.
#[test]
fn the_namespace_gets_linkerd_cnis_labels_whoever_installs() {
    assert!(
        render(&[]).get("Namespace", NAMESPACE).is_none(),
        "Helm creates the namespace"
    );
    let cli = try_render(&[], Some("CLI")).unwrap();
    let namespace = cli.find("Namespace", NAMESPACE);
    let labels = &namespace["metadata"]["labels"];
    // Neither sent to Linkerd's webhooks nor meshed (Linkerd reads inject as an annotation),
    // as linkerd-cni's namespace; privileged pods admitted.
    assert_eq!(labels["linkerd.io/cni-resource"], "true");
    assert_eq!(labels["config.linkerd.io/admission-webhooks"], "disabled");
    assert_eq!(labels["pod-security.kubernetes.io/enforce"], "privileged");
    assert_eq!(labels.get("linkerd.io/extension"), None, "only when asked");
    assert_eq!(labels.get("linkerd.io/inject"), None);
    assert_eq!(
        namespace["metadata"]["annotations"],
        json!({"linkerd.io/inject": "disabled"})
    );
    // What the Job below (`interceptor namespace-metadata`) gives a namespace Helm created.
    for (key, value, _) in interceptor::health::NAMESPACE_LABELS {
        assert_eq!(labels[key], *value, "{key}");
    }
    for (key, value, _) in interceptor::health::NAMESPACE_ANNOTATIONS {
        assert_eq!(namespace["metadata"]["annotations"][key], *value, "{key}");
    }

    let rendered = render(&[]);
    let hook = |kind: &str| {
        let object = rendered.find(kind, "namespace-metadata");
        let annotations = &object["metadata"]["annotations"];
        assert_eq!(
            annotations["helm.sh/hook"], "post-install,post-upgrade",
            "{kind}"
        );
        assert_eq!(
            annotations["helm.sh/hook-delete-policy"], "before-hook-creation,hook-succeeded",
            "{kind}"
        );
        assert_eq!(object["metadata"]["namespace"], NAMESPACE, "{kind}");
        object
    };
    let job = hook("Job");
    let role = hook("Role");
    let binding = hook("RoleBinding");
    hook("ServiceAccount");
    // Its account exists before it runs.
    assert!(
        job["metadata"]["annotations"]["helm.sh/hook-weight"]
            .as_str()
            .unwrap()
            > role["metadata"]["annotations"]["helm.sh/hook-weight"]
                .as_str()
                .unwrap()
    );
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": [""], "resources": ["namespaces"], "resourceNames": [NAMESPACE], "verbs": ["get", "patch"]}])
    );
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": "namespace-metadata", "namespace": NAMESPACE}])
    );
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "namespace-metadata");
    assert_eq!(
        job["spec"]["template"]["metadata"]["annotations"]["linkerd.io/inject"],
        "disabled"
    );
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    assert_eq!(containers[0]["image"], interceptor_tests::node_image::IMAGE);
    let args = args_of(&containers[0], &BTreeMap::new(), NAMESPACE);
    let interceptor::cli::Command::NamespaceMetadata(metadata) =
        parse(&args, "namespace-metadata Job").command
    else {
        panic!("the Job runs {args:?}, not `namespace-metadata`");
    };
    assert_eq!(metadata.namespace, NAMESPACE);
    assert_eq!(metadata.kubeconfig, None, "the pod's service account");
    assert_eq!(containers[0]["securityContext"]["runAsNonRoot"], true);
}

/// Linkerd's cni-plugin image is linkerd-cni's installer: a linkerd2-cni values file carried
/// over names it, and the chart refuses it, saying what to do.
#[test]
fn linkerds_cni_plugin_image_is_refused() {
    for name in [
        "cr.l5d.io/linkerd/cni-plugin",
        "registry.example.com/mirror/linkerd/cni-plugin",
        "cr.l5d.io/linkerd/cni-plugin:v1.7.0",
    ] {
        let values = json!({"image": {"name": name, "version": "v1.7.0-alpha.1"}}).to_string();
        let refused = try_render(&[&values], None)
            .err()
            .unwrap_or_else(|| panic!("{name} was rendered"));
        assert!(
            refused.contains(&format!("image.name={name} is Linkerd's cni-plugin image"))
                && refused.contains("unset image.name"),
            "{refused}"
        );
    }
    let rendered = render(&[r#"{"image": {"name": "registry.example.com/linkerd/interceptor"}}"#]);
    assert_eq!(
        container(rendered.daemonset(), "agent")["image"],
        format!(
            "registry.example.com/linkerd/interceptor:{}",
            env!("CARGO_PKG_VERSION")
        )
    );
}

/// Without image.name the image is interceptor's own as `cargo xtask image` names it: a
/// linkerd2-cni values file's image.version (a tag of linkerd-cni's image) and pullPolicy
/// Always, which would name or pull an image that exists nowhere, are ignored, and NOTES.txt
/// names each. With image.name, both apply.
#[test]
fn a_linkerd2_cni_image_version_and_pull_policy_are_ignored_without_image_name() {
    let images = |rendered: &Rendered| -> BTreeSet<(String, String)> {
        let job = rendered.find("Job", "namespace-metadata");
        [rendered.daemonset(), job]
            .into_iter()
            .flat_map(|o| {
                let pod = &o["spec"]["template"]["spec"];
                let init = pod["initContainers"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                init.into_iter()
                    .chain(pod["containers"].as_array().unwrap().iter().cloned())
            })
            .map(|c| {
                (
                    c["image"].as_str().unwrap().to_owned(),
                    c["imagePullPolicy"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    let local = BTreeSet::from([(
        interceptor_tests::node_image::IMAGE.to_owned(),
        "IfNotPresent".to_owned(),
    )]);
    let default = render(&[]);
    assert_eq!(images(&default), local);
    assert!(!default.notes.contains("is ignored"), "{}", default.notes);

    let carried = render(&[r#"{"image": {"version": "v1.6.3", "pullPolicy": "Always"}}"#]);
    assert_eq!(images(&carried), local);
    let notes = carried
        .notes
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    for value in ["image.version=v1.6.3", "image.pullPolicy=Always"] {
        assert!(
            notes.contains(&format!(
                "{value} is ignored: a linkerd2-cni values file sets it for linkerd-cni's image; \
                 without image.name the image is {}, imagePullPolicy IfNotPresent.",
                interceptor_tests::node_image::IMAGE
            )),
            "{value}: {notes}"
        );
    }
    // What fits a local image is kept, and not mentioned.
    let kept = render(&[
        &json!({"image": {"version": env!("CARGO_PKG_VERSION"), "pullPolicy": "Never"}})
            .to_string(),
    ]);
    assert_eq!(
        images(&kept),
        BTreeSet::from([(
            interceptor_tests::node_image::IMAGE.to_owned(),
            "Never".to_owned()
        )])
    );
    assert!(!kept.notes.contains("is ignored"), "{}", kept.notes);
    // With image.name, as given.
    let pushed = render(&[
        r#"{"image": {"name": "registry.example.com/interceptor", "version": "v1.6.3", "pullPolicy": "Always"}}"#,
    ]);
    assert_eq!(
        images(&pushed),
        BTreeSet::from([(
            "registry.example.com/interceptor:v1.6.3".to_owned(),
            "Always".to_owned()
        )])
    );
    assert!(!pushed.notes.contains("is ignored"), "{}", pushed.notes);
}

/// `linkerd check` warns on every run for a namespace labelled `linkerd.io/extension` whose
/// `linkerd-<name>` is not on its PATH: the label is given only when asked (linkerdExtension),
/// by the Namespace a CLI renders and by the hook Job alike.
#[test]
fn the_extension_label_is_set_only_when_asked() {
    for (values, label) in [
        (&[][..], None),
        (&[r#"{"linkerdExtension": false}"#][..], None),
        (&[r#"{"linkerdExtension": true}"#][..], Some("interceptor")),
    ] {
        let cli = try_render(values, Some("CLI")).unwrap();
        let labels = &cli.find("Namespace", NAMESPACE)["metadata"]["labels"];
        assert_eq!(
            labels.get("linkerd.io/extension").and_then(Value::as_str),
            label,
            "{values:?}"
        );
        let rendered = render(values);
        let job = rendered.find("Job", "namespace-metadata");
        let args = args_of(
            &job["spec"]["template"]["spec"]["containers"][0],
            &BTreeMap::new(),
            NAMESPACE,
        );
        let interceptor::cli::Command::NamespaceMetadata(metadata) =
            parse(&args, "namespace-metadata Job").command
        else {
            panic!("the Job runs {args:?}, not `namespace-metadata`");
        };
        assert_eq!(metadata.linkerd_extension, label.is_some(), "{values:?}");
        assert_eq!(
            rendered.notes.contains("put linkerd-interceptor on the"),
            label.is_some(),
            "{}",
            rendered.notes
        );
    }
}

/// A mode the agent does not have, or a value of the wrong type, is refused by the values'
/// schema before anything is rendered.
#[test]
fn a_bogus_mode_or_a_value_of_the_wrong_type_is_refused() {
    for (values, path) in [
        (r#"{"mode": "bogus"}"#, "/mode"),
        (r#"{"inboundProxyPort": "http"}"#, "/inboundProxyPort"),
        (r#"{"disableIPv6": "false"}"#, "/disableIPv6"),
        (r#"{"iptablesMode": "nftables"}"#, "/iptablesMode"),
        (r#"{"metrics": {"prot": 9990}}"#, "/metrics"),
    ] {
        let refused = try_render(&[values], None)
            .err()
            .unwrap_or_else(|| panic!("{values} was rendered"));
        assert!(
            refused.contains("values don't meet the specifications of the schema")
                && refused.contains(path),
            "{values}: {refused}"
        );
    }
    for mode in ["auto", "ebpf", "iptables"] {
        let values = json!({"mode": mode}).to_string();
        let (_, daemon) = agent_args(&render(&[&values]));
        assert_eq!(format!("{:?}", daemon.mode).to_lowercase(), mode);
    }
}

/// Each platform's values file moves the host's CNI directories (and linkerd-cni's ConfigMap
/// keys that name them), and changes nothing else: the same objects, the same containers,
/// mounted at the same paths in them.
#[test]
fn each_platform_file_moves_only_the_cni_directories() {
    let base = render(&[]);
    let volumes = |rendered: &Rendered| -> BTreeMap<String, Value> {
        rendered.daemonset()["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                (
                    v["name"].as_str().unwrap().to_owned(),
                    v["hostPath"]["path"].clone(),
                )
            })
            .collect()
    };
    let without_volumes = |rendered: &Rendered| -> Vec<Value> {
        rendered
            .objects
            .iter()
            .cloned()
            .map(|mut o| {
                // linkerd-cni's ConfigMap keys name the same directories.
                if o["kind"] == "ConfigMap" {
                    let data = o["data"].as_object_mut().unwrap();
                    data.remove("dest_cni_bin_dir");
                    data.remove("dest_cni_net_dir");
                }
                if o["kind"] == "DaemonSet" {
                    o["spec"]["template"]["spec"]
                        .as_object_mut()
                        .unwrap()
                        .remove("volumes");
                }
                o
            })
            .collect()
    };
    for (file, bin, conf) in PLATFORMS {
        let platform = render(&[file]);
        let mut expected = volumes(&base);
        expected.insert("cni-bin-dir".into(), json!(bin));
        expected.insert("cni-net-dir".into(), json!(conf));
        assert_eq!(volumes(&platform), expected, "{file}");
        assert_eq!(platform.config()["dest_cni_bin_dir"], bin, "{file}");
        assert_eq!(platform.config()["dest_cni_net_dir"], conf, "{file}");
        assert_eq!(without_volumes(&platform), without_volumes(&base), "{file}");
    }
}

/// The chart's values: each value's path (`image.name`), down to the values the schema
/// describes no further (a map of labels, a list of tolerations), with its default.
fn value_paths(values: &Value, schema: &Value, prefix: &str, out: &mut BTreeMap<String, Value>) {
    for (key, value) in values.as_object().unwrap() {
        let path = format!("{prefix}{key}");
        let node = &schema["properties"][key];
        if node["properties"].is_object() {
            value_paths(value, node, &format!("{path}."), out);
        } else {
            out.insert(path, value.clone());
        }
    }
}

/// The schema's values, as [`value_paths`] names them.
fn schema_paths(schema: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    for (key, node) in schema["properties"].as_object().unwrap() {
        let path = format!("{prefix}{key}");
        if node["properties"].is_object() {
            schema_paths(node, &format!("{path}."), out);
        } else {
            out.insert(path);
        }
    }
}

/// charts/interceptor/README.md's values table names every value of values.yaml and nothing
/// else, with its default; values.schema.json types every value and nothing else.
#[test]
fn the_values_reference_and_the_schema_cover_every_value() {
    let chart: Value = serde_json::from_str(&run(&mut helm(&["values", CHART]), None)).unwrap();
    let mut values = BTreeMap::new();
    value_paths(&chart["values"], &chart["schema"], "", &mut values);
    let mut typed = BTreeSet::new();
    schema_paths(&chart["schema"], "", &mut typed);
    assert_eq!(
        values.keys().cloned().collect::<BTreeSet<_>>(),
        typed,
        "values.yaml and values.schema.json"
    );

    let readme = std::fs::read_to_string(workspace_root().join(CHART).join("README.md")).unwrap();
    let table = readme.split_once("## Values").expect("a Values section").1;
    let rows: BTreeMap<String, String> = table
        .lines()
        .filter_map(|line| {
            let mut cells = line.strip_prefix("| `")?.splitn(3, '|');
            let name = cells.next()?.trim().strip_suffix('`')?.to_owned();
            Some((name, cells.next()?.trim().to_owned()))
        })
        .collect();
    assert_eq!(
        rows.keys().cloned().collect::<BTreeSet<_>>(),
        values.keys().cloned().collect::<BTreeSet<_>>(),
        "the README's values table and values.yaml"
    );
    // Where a default is one word, the table says that word.
    for (path, default) in &values {
        let word = match default {
            Value::String(s) if !s.is_empty() => format!("`{s}`"),
            Value::Number(n) => format!("`{n}`"),
            Value::Bool(b) => format!("`{b}`"),
            _ => continue,
        };
        assert!(
            rows[path].contains(&word),
            "{path}: {} is not {word}",
            rows[path]
        );
    }
}

#[test]
fn the_image_runs_the_agent_the_plugin_and_both_iptables_modes() {
    if !privileged() {
        return;
    }
    let Some(podman) = NodeImage::load() else {
        return;
    };

    let version = podman.run(&[], "/usr/local/bin/interceptor", &["--version"], None);
    assert_eq!(
        version.trim(),
        concat!("interceptor ", env!("CARGO_PKG_VERSION"))
    );
    let plugin = podman.run(
        &["--env", "CNI_COMMAND=VERSION"],
        "/usr/local/bin/interceptor-cni",
        &[],
        Some(r#"{"cniVersion": "1.0.0"}"#),
    );
    let plugin: Value = serde_json::from_str(&plugin).unwrap();
    assert!(
        plugin["supportedVersions"]
            .as_array()
            .unwrap()
            .contains(&json!("1.0.0"))
    );
    // proxy-init's rules need the owner match and the REDIRECT target, in both modes and
    // families (in the container's own network namespace).
    let caps = ["--cap-add", "NET_ADMIN,NET_RAW"];
    for binary in [
        "iptables-legacy",
        "ip6tables-legacy",
        "iptables-nft",
        "ip6tables-nft",
    ] {
        let path = format!("/usr/sbin/{binary}");
        for rule in [
            "-A OUTPUT -p tcp -m owner --uid-owner 2102 -j RETURN",
            "-A OUTPUT -p tcp -j REDIRECT --to-port 4140",
        ] {
            let mut args = vec!["-w", "-t", "nat"];
            args.extend(rule.split(' '));
            podman.run(&caps, &path, &args, None);
        }
    }
}

/// `linkerd-interceptor` (for `linkerd check`) comes out of the image as the docs say, with
/// podman (the image has no shell, so no `kubectl cp`), and runs on this host.
#[test]
fn linkerd_interceptor_copies_out_of_the_image_with_podman_create_and_cp() {
    if !privileged() {
        return;
    }
    let Some(podman) = NodeImage::load() else {
        return;
    };
    let image = container(render(&[]).daemonset(), "agent")["image"]
        .as_str()
        .unwrap()
        .to_owned();
    let name = unique_name("copy-out");
    let dir = std::env::temp_dir().join(&name);
    std::fs::create_dir_all(&dir).unwrap();
    run(
        &mut podman.command(&["create", "--name", &name, &image]),
        None,
    );
    run(
        podman
            .command(&["cp", &format!("{name}:/usr/local/bin/linkerd-interceptor")])
            .arg(&dir),
        None,
    );
    run(&mut podman.command(&["rm", &name]), None);
    let copied = dir.join("linkerd-interceptor");
    let help = run(Command::new(&copied).arg("--help"), None);
    assert!(help.contains("check"), "{help}");
    // What the docs say it is.
    let file = run(Command::new("file").arg("-L").arg(&copied), None);
    assert!(
        file.contains("ELF 64-bit")
            && file.contains("x86-64")
            && file.contains("dynamically linked"),
        "{file}"
    );
    let ldd = run(Command::new("ldd").arg(&copied), None);
    assert!(
        ldd.contains("libc.so.6") && !ldd.contains("not found"),
        "{ldd}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The DaemonSet's own pod, from the image, by podman: it chains the plugin into the primary
/// network placed there before; a pod added through that network is meshed from its first
/// connect; the agent's pod killed and played again leaves it meshed throughout; the pod
/// deleted (SIGTERM) takes the plugin out of the chain, leaving the primary network as it was
/// (the installer runs without `--daemonset` here: there is no API server to ask).
#[test]
fn the_daemonsets_pod_meshes_pods_and_keeps_them_meshed_through_a_replay() {
    if !privileged() {
        return;
    }
    let Some(podman) = NodeImage::load() else {
        return;
    };
    let fixture = interceptor_tests::PodFixture::new("kubeplay");
    let _servers = interceptor_tests::scenario::Servers::start(&fixture);
    let agent_pod = AgentPod::new(podman, &fixture.cgroup.path);
    agent_pod.play(false);
    assert!(agent_pod.network.bin_dir.join("interceptor-cni").is_file());
    // Not privileged: the agent runs with exactly the capabilities the DaemonSet lists
    // (CAP_NET_BROADCAST 11, NET_ADMIN 12, NET_RAW 13, SYS_PTRACE 19, SYS_ADMIN 21, PERFMON 38,
    // BPF 39), the installer with its two (DAC_OVERRIDE 1, FOWNER 3).
    let bits = |caps: &[u32]| caps.iter().fold(0u64, |all, cap| all | 1 << cap);
    assert_eq!(
        agent_pod.capabilities("agent"),
        bits(&[11, 12, 13, 19, 21, 38, 39])
    );
    assert_eq!(agent_pod.capabilities("install-cni"), bits(&[1, 3]));

    let result = agent_pod
        .network
        .add("web-1", &fixture.pod.path(), &cni_network::injected())
        .unwrap();
    assert_eq!(result["cniVersion"], "1.0.0", "{result}");
    let pods = interceptor::agent::api::call(
        &agent_pod.state_dir.join("agent.sock"),
        &interceptor::agent::api::Request::List,
    )
    .unwrap();
    assert_eq!(pods.len(), 1);
    assert_eq!(pods[0].meta.name.as_deref(), Some("web-1"));
    let app = fixture.in_pod().uid(interceptor_tests::scenario::APP_UID);
    assert!(matches!(
        app.connect(interceptor_tests::agent_home::UNREACHABLE),
        interceptor_tests::Landing::Proxy { orig: Ok(orig), .. }
            if orig.to_string() == interceptor_tests::agent_home::UNREACHABLE
    ));

    // Killed and played again while the app connects without pause: nothing around the proxy.
    let lines = std::thread::scope(|s| {
        let load = s.spawn(|| interceptor_tests::agent_home::check_load(&app, "4"));
        std::thread::sleep(std::time::Duration::from_millis(500));
        run(
            agent_pod
                .podman
                .command(&["pod", "kill"])
                .arg(agent_pod.pod_name()),
            None,
        );
        agent_pod.play(true);
        load.join().expect("load")
    });
    interceptor_tests::agent_home::all_reached_the_proxy(&lines);
    let pods = interceptor::agent::api::call(
        &agent_pod.state_dir.join("agent.sock"),
        &interceptor::agent::api::Request::List,
    )
    .unwrap();
    assert_eq!(pods.len(), 1, "the replayed agent took the pod back");

    // Deleted: stopped first (SIGTERM to the installer, which, run without --daemonset,
    // unchains the plugin), then removed when the test ends.
    run(
        agent_pod
            .podman
            .command(&["pod", "stop"])
            .arg(agent_pod.pod_name()),
        None,
    );
    assert_eq!(
        agent_pod.network.conflist(),
        CniNetwork::primary(),
        "{}",
        agent_pod.logs()
    );
    assert!(!agent_pod.network.bin_dir.join("interceptor-cni").exists());
}

/// What `kubectl logs` and log files get: plain lines without colour codes when stderr is not a
/// terminal, and one JSON object per line with `--log-format json`.
#[test]
fn logs_carry_no_colour_codes_off_a_terminal_and_json_is_one_object_per_line() {
    let dir = std::env::temp_dir().join(unique_name("logs"));
    let logged = |format: &str| {
        let out = Command::new(interceptor_tests::agent_home::interceptor_bin())
            .args(["--log-format", format, "cni", "uninstall"])
            .arg("--bin-dir")
            .arg(&dir)
            .arg("--conf-dir")
            .arg(&dir)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stderr).unwrap()
    };
    let plain = logged("plain");
    assert!(plain.contains("CNI plugin uninstalled"), "{plain}");
    assert!(!plain.contains('\u{1b}'), "{plain:?}");
    let json = logged("json");
    for line in json.lines() {
        let event: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(
            event["timestamp"].is_string() && event["level"].is_string(),
            "{line}"
        );
    }
    assert!(
        json.contains("\"message\":\"CNI plugin uninstalled\""),
        "{json}"
    );
}

/// The DaemonSet's init container, `interceptor mount-bpffs`: a bpffs on a directory that has
/// none, and nothing where one is mounted already (the node's own, or its previous run's).
#[test]
fn the_init_container_mounts_a_bpffs_only_where_there_is_none() {
    if !privileged() {
        return;
    }
    const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
    let dir = std::env::temp_dir().join(unique_name("mount-bpffs"));
    std::fs::create_dir_all(&dir).unwrap();
    let is_bpffs =
        |path: &Path| nix::sys::statfs::statfs(path).unwrap().filesystem_type().0 == BPF_FS_MAGIC;
    let mount_bpffs = || {
        let out = Command::new(interceptor_tests::agent_home::interceptor_bin())
            .arg("mount-bpffs")
            .arg(&dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stderr).unwrap()
    };
    assert!(!is_bpffs(&dir));
    let first = mount_bpffs();
    let mounted = is_bpffs(&dir);
    let second = mount_bpffs();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let count = mounts
        .lines()
        .filter(|l| l.contains(&format!(" {} ", dir.display())))
        .count();
    while nix::mount::umount(&dir).is_ok() {}
    let _ = std::fs::remove_dir(&dir);
    assert!(mounted, "{first}");
    assert!(first.contains("bpffs mounted"), "{first}");
    assert!(second.contains("already mounted"), "{second}");
    assert_eq!(count, 1, "mounted once: {mounts}");
}
