//! What ships: the Kubernetes manifests (`deploy/kubernetes`, rendered by `kubectl kustomize`)
//! validate against Kubernetes 1.31's schema, strictly, and say what the agent needs; the
//! commands they run are accepted by this build's command line and CNI plugin; and the OCI image
//! (`cargo xtask image`, whose path `cargo xtask test` passes in `INTERCEPTOR_IMAGE`) runs the
//! agent, the plugin and both iptables modes.
use std::{
    collections::BTreeMap,
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use clap::Parser as _;
use interceptor_tests::{
    cni_network::{self, CniNetwork},
    privileged, unique_name,
};
use serde_json::{Value, json};

fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the workspace")
}

fn run(cmd: &mut Command, input: Option<&str>) -> String {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    if let Some(input) = input {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The kustomizations users apply: the base and each platform's overlay.
const KUSTOMIZATIONS: [&str; 3] = [
    "deploy/kubernetes",
    "deploy/overlays/gke",
    "deploy/overlays/k3s",
];

/// The base's rendered manifests, and the same as JSON objects.
fn rendered() -> (String, Vec<Value>) {
    rendered_from("deploy/kubernetes")
}

/// A kustomization's rendered manifests, and the same as JSON objects (through the validator's
/// own PyYAML: `cargo xtask setup` puts its virtual environment first on PATH).
fn rendered_from(kustomization: &str) -> (String, Vec<Value>) {
    let yaml = run(
        Command::new("kubectl")
            .arg("kustomize")
            .arg(workspace_root().join(kustomization)),
        None,
    );
    let json = run(
        Command::new("python3").args([
            "-c",
            "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(sys.stdin))))",
        ]),
        Some(&yaml),
    );
    (yaml, serde_json::from_str(&json).unwrap())
}

fn find<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in the manifests"))
}

fn container<'a>(daemonset: &'a Value, name: &str) -> &'a Value {
    daemonset["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// The node address `status.hostIP` gives in [`args_of`].
const HOST_IP: &str = "fd00::7";

/// A container's arguments, with `$(VAR)` replaced by the ConfigMap value its env names, the
/// pod's `namespace` for a `metadata.namespace` field reference, or [`HOST_IP`] for
/// `status.hostIP`, as the kubelet does.
fn args_of(container: &Value, config: &BTreeMap<String, String>, namespace: &str) -> Vec<String> {
    let env: BTreeMap<String, String> = container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let from = &e["valueFrom"];
            // Another field reference (NODE_NAME) is not in an argument.
            let value = match from["configMapKeyRef"]["key"].as_str() {
                Some(key) => config[key].clone(),
                None if from["fieldRef"]["fieldPath"] == "metadata.namespace" => {
                    namespace.to_owned()
                }
                // An IPv6 node's address, as the kubelet expands it (no brackets).
                None if from["fieldRef"]["fieldPath"] == "status.hostIP" => HOST_IP.to_owned(),
                None => return None,
            };
            Some((e["name"].as_str().unwrap().to_owned(), value))
        })
        .collect();
    container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let mut arg = a.as_str().unwrap().to_owned();
            for (name, value) in &env {
                arg = arg.replace(&format!("$({name})"), value);
            }
            arg
        })
        .collect()
}

#[test]
fn the_manifests_validate_against_kubernetes_1_31_strictly() {
    for kustomization in KUSTOMIZATIONS {
        let (yaml, _) = rendered_from(kustomization);
        let file = std::env::temp_dir().join(format!("{}.yaml", unique_name("manifests")));
        std::fs::write(&file, &yaml).unwrap();
        let out = run(
            Command::new("kubernetes-validate")
                .args(["--strict", "--kubernetes-version", "1.31.0"])
                .arg(&file),
            None,
        );
        let _ = std::fs::remove_file(&file);
        for kind in [
            "namespace",
            "serviceaccount",
            "role",
            "rolebinding",
            "clusterrole",
            "clusterrolebinding",
            "configmap",
            "resourcequota",
            "daemonset",
        ] {
            assert!(
                out.lines()
                    .any(|l| l.contains("passed") && l.contains(&format!("resource {kind}/"))),
                "{kustomization}: {kind} not validated: {out}"
            );
        }
    }

    let (yaml, _) = rendered();
    // The same validator refuses what the schema does not know, so a pass means something.
    let bad = yaml.replace("hostPID: true", "hostPID: true\n      hostPIDs: true");
    let bad_file = std::env::temp_dir().join(format!("{}.yaml", unique_name("bad-manifests")));
    std::fs::write(&bad_file, bad).unwrap();
    let refused = Command::new("kubernetes-validate")
        .args(["--strict", "--quiet", "--kubernetes-version", "1.31.0"])
        .arg(&bad_file)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&bad_file);
    assert!(!refused.status.success());
}

#[test]
fn the_daemonset_runs_the_agent_and_the_installer_as_this_build_expects() {
    let (_, objects) = rendered();
    let daemonset = find(&objects, "DaemonSet");
    let config: BTreeMap<String, String> =
        serde_json::from_value(find(&objects, "ConfigMap")["data"].clone()).unwrap();
    let pod = &daemonset["spec"]["template"]["spec"];

    // Off the CNI chain it installs (its own ADD would wait for the agent it starts), on every
    // node whatever its taints, before ordinary pods, one node at a time.
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["hostPID"], true, "the listener adoption reads /proc");
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    assert!(
        pod["tolerations"]
            .as_array()
            .unwrap()
            .contains(&json!({"operator": "Exists"}))
    );
    assert_eq!(
        daemonset["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"],
        1
    );
    assert_eq!(pod["nodeSelector"], json!({"kubernetes.io/os": "linux"}));
    // Admitted where system-node-critical is limited to quotas (GKE): one scoped to that class.
    let quota = find(&objects, "ResourceQuota");
    assert_eq!(
        quota["spec"]["scopeSelector"]["matchExpressions"],
        json!([{"operator": "In", "scopeName": "PriorityClass", "values": ["system-node-critical"]}])
    );
    // Neither meshed nor sent to Linkerd's webhooks, as linkerd-cni's namespace.
    let labels = &find(&objects, "Namespace")["metadata"]["labels"];
    assert_eq!(labels["linkerd.io/inject"], "disabled");
    assert_eq!(labels["config.linkerd.io/admission-webhooks"], "disabled");
    // The API access, for the DaemonSet's account: pods get/list/watch, namespaces get and the
    // `kubernetes` Service for the agent, and get of this DaemonSet, in its namespace, for the
    // installer; nothing more.
    assert_eq!(pod["automountServiceAccountToken"], true);
    let namespace = daemonset["metadata"]["namespace"].as_str().unwrap();
    let account = json!([{"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": namespace}]);
    let role = find(&objects, "ClusterRole");
    assert_eq!(
        role["rules"],
        json!([
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["services"], "resourceNames": ["kubernetes"], "verbs": ["get"]},
        ])
    );
    let binding = find(&objects, "ClusterRoleBinding");
    assert_eq!(binding["subjects"], account);
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    let role = find(&objects, "Role");
    assert_eq!(role["metadata"]["namespace"], namespace);
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": ["apps"], "resources": ["daemonsets"], "resourceNames": [daemonset["metadata"]["name"]], "verbs": ["get"]}])
    );
    let binding = find(&objects, "RoleBinding");
    assert_eq!(binding["metadata"]["namespace"], namespace);
    assert_eq!(binding["subjects"], account);
    assert_eq!(
        binding["roleRef"],
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]})
    );

    // The agent: its flags parse, its metrics port is the named, scraped one, and /ready is the
    // readiness probe.
    let agent = container(daemonset, "agent");
    let args = args_of(agent, &config, namespace);
    let cli = interceptor::cli::Cli::try_parse_from(
        std::iter::once("interceptor".to_owned()).chain(args.clone()),
    )
    .unwrap_or_else(|e| panic!("the agent's arguments {args:?}: {e}"));
    let interceptor::cli::Command::Daemon(daemon) = cli.command else {
        panic!("the agent container runs {args:?}, not `daemon`");
    };
    assert!(daemon.kubernetes, "--kubernetes");
    // Repair registers a pod with what its ADD would have given: the plugin's linkerd block.
    assert_eq!(daemon.linkerd, config["linkerd"], "--linkerd");
    assert!(daemon.repair_interval > 0, "repair is on");
    assert_eq!(
        daemon.mode,
        interceptor::cli::Mode::Auto,
        "eBPF where it loads, else iptables"
    );
    let metrics = daemon.metrics_addr.expect("--metrics-addr");
    // The node's own address only (status.hostIP), not every interface of the host.
    assert_eq!(metrics.ip().to_string(), HOST_IP, "{metrics}");
    assert_eq!(
        agent["ports"][0],
        json!({"name": "metrics", "containerPort": metrics.port(), "protocol": "TCP"})
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
    let init = daemonset["spec"]["template"]["spec"]["initContainers"]
        .as_array()
        .expect("initContainers");
    assert_eq!(init.len(), 1);
    let mount = &init[0];
    assert_eq!(mount["securityContext"], json!({"privileged": true}));
    assert_eq!(
        mount["volumeMounts"],
        json!([{"name": "bpffs", "mountPath": "/sys/fs/bpf", "mountPropagation": "Bidirectional"}])
    );
    let args = args_of(mount, &config, namespace);
    let cli = interceptor::cli::Cli::try_parse_from(
        std::iter::once("interceptor".to_owned()).chain(args.clone()),
    )
    .unwrap_or_else(|e| panic!("the init container's arguments {args:?}: {e}"));
    let interceptor::cli::Command::MountBpffs(bpffs) = cli.command else {
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
    let args = args_of(installer, &config, namespace);
    let cli = interceptor::cli::Cli::try_parse_from(
        std::iter::once("interceptor".to_owned()).chain(args.clone()),
    )
    .unwrap_or_else(|e| panic!("the installer's arguments {args:?}: {e}"));
    let interceptor::cli::Command::Cni(interceptor::cli::CniArgs {
        command:
            interceptor::cli::CniCommand::Install {
                watch,
                daemonset: owner,
                kubeconfig,
                ..
            },
        ..
    }) = cli.command
    else {
        panic!("the installer container runs {args:?}, not `cni install`");
    };
    assert!(watch, "--watch");
    assert_eq!(
        owner,
        Some(interceptor::kubernetes::DaemonSetRef {
            namespace: namespace.to_owned(),
            name: daemonset["metadata"]["name"].as_str().unwrap().to_owned(),
        })
    );
    assert_eq!(kubeconfig, None, "the pod's service account");
    // Restores of the chain reach the agent: its socket where --agent-socket names it.
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
    let security = &installer["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(
        security["seccompProfile"],
        json!({"type": "RuntimeDefault"})
    );
    assert_eq!(security["seLinuxOptions"]["type"], "spc_t");
    let linkerd: Value = serde_json::from_str(&config["linkerd"]).unwrap();
    let conf: interceptor_cni::NetConf = serde_json::from_value(json!({
        "cniVersion": "1.0.0", "name": "k8s", "type": "interceptor-cni", "linkerd": linkerd,
    }))
    .unwrap();
    let settings = interceptor_cni::pod_settings(&conf, &Default::default())
        .unwrap_or_else(|e| panic!("the ConfigMap's linkerd block: {e}"));
    assert_eq!(settings.config.incoming_proxy_port, 4143);
    assert_eq!(settings.config.proxy_uid, Some(2102));
    // Linkerd's default proxy listens on IPv4 only (linkerd-cni writes "ipv6": false).
    assert!(!settings.config.ipv6, "the ConfigMap meshes IPv4 only");
}

/// Each platform's overlay moves the host's CNI directories, and changes nothing else: the
/// same containers, mounted at the same paths in them.
#[test]
fn each_platform_overlay_moves_only_the_cni_directories() {
    let (_, base) = rendered();
    for (kustomization, bin, conf) in [
        (
            "deploy/overlays/gke",
            "/home/kubernetes/bin",
            "/etc/cni/net.d",
        ),
        (
            "deploy/overlays/k3s",
            "/var/lib/rancher/k3s/data/cni",
            "/var/lib/rancher/k3s/agent/etc/cni/net.d",
        ),
    ] {
        let (_, overlay) = rendered_from(kustomization);
        let volumes = |objects: &[Value]| -> BTreeMap<String, Value> {
            find(objects, "DaemonSet")["spec"]["template"]["spec"]["volumes"]
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
        let mut expected = volumes(&base);
        expected.insert("cni-bin".into(), json!(bin));
        expected.insert("cni-conf".into(), json!(conf));
        assert_eq!(volumes(&overlay), expected, "{kustomization}");
        let without_volumes = |objects: &[Value]| -> Vec<Value> {
            objects
                .iter()
                .cloned()
                .map(|mut o| {
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
        assert_eq!(
            without_volumes(&overlay),
            without_volumes(&base),
            "{kustomization}"
        );
    }
}

/// A podman with an image store of the test's own, running containers with the tests' runc
/// wrapper (these machines withhold the rlimits podman asks for).
struct Podman {
    root: PathBuf,
}

impl Podman {
    fn new() -> Self {
        Self {
            root: std::env::temp_dir().join(unique_name("image")),
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("podman");
        cmd.arg("--root")
            .arg(self.root.join("storage"))
            .arg("--runroot")
            .arg(self.root.join("run"))
            .args(["--runtime", env!("CARGO_BIN_EXE_runc-without-rlimits")])
            .args(args);
        cmd
    }

    /// `podman run --rm` of the image with `entrypoint` and `args`; its stdout.
    fn run(&self, extra: &[&str], entrypoint: &str, args: &[&str], input: Option<&str>) -> String {
        let mut cmd = self.command(&["run", "--rm", "-i", "--network", "none"]);
        cmd.args(extra)
            .args(["--entrypoint", entrypoint, "localhost/interceptor:0.1.0"])
            .args(args);
        run(&mut cmd, input)
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self.command(&["rmi", "--all", "--force"]).output();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

#[test]
fn the_image_runs_the_agent_the_plugin_and_both_iptables_modes() {
    if !privileged("the_image_runs_the_agent_the_plugin_and_both_iptables_modes") {
        return;
    }
    let Some(podman) = load_image() else {
        return;
    };

    let version = podman.run(&[], "/usr/local/bin/interceptor", &["--version"], None);
    assert_eq!(version.trim(), "interceptor 0.1.0");
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

/// The DaemonSet's pod as a real runtime runs it: its template from the rendered manifests,
/// its host paths redirected into a root of the test's own (never the machine's `/etc/cni`,
/// `/opt/cni` or default bpffs directory), `--cgroup` the test's cgroup, run from the image
/// with `podman kube play`.
struct AgentPod {
    podman: Podman,
    network: CniNetwork,
    yaml: PathBuf,
    configmap: PathBuf,
    state_dir: PathBuf,
    bpffs: PathBuf,
}

impl AgentPod {
    fn new(podman: Podman, cgroup: &Path) -> Self {
        // The node's primary network before the agent comes: loopback only (nothing leaves).
        let network = CniNetwork::new("kubeplay");
        let state_dir = network.root.join("state");
        std::fs::create_dir_all(&state_dir).unwrap();
        let bpffs = Path::new("/sys/fs/bpf/interceptor-tests").join(unique_name("kubeplay"));
        std::fs::create_dir_all(&bpffs).unwrap();

        let (_, objects) = rendered();
        let mut config = find(&objects, "ConfigMap").clone();
        // The pods here connect over both families (the proxies listen on both): the one line
        // a cluster whose Linkerd runs with disableIPv6=false changes.
        let linkerd = config["data"]["linkerd"].as_str().unwrap();
        assert!(linkerd.contains(r#""ipv6": false"#), "{linkerd}");
        config["data"]["linkerd"] = json!(linkerd.replace(r#""ipv6": false"#, r#""ipv6": true"#));
        let daemonset = find(&objects, "DaemonSet");
        let namespace = daemonset["metadata"]["namespace"].as_str().unwrap();
        let mut spec = daemonset["spec"]["template"]["spec"].clone();
        // The host's cgroup2 mount is the test's own cgroup: no kubelet pod cgroup is found
        // under it, so the agent attaches there, never at the machine's root.
        let host_paths = [
            ("/sys/fs/bpf", bpffs.clone()),
            ("/sys/fs/cgroup", cgroup.to_owned()),
            ("/run/interceptor", state_dir.clone()),
            ("/opt/cni/bin", network.bin_dir.clone()),
            ("/etc/cni/net.d", network.conf_dir.clone()),
        ];
        for volume in spec["volumes"].as_array_mut().unwrap() {
            let path = volume["hostPath"]["path"].as_str().unwrap().to_owned();
            if let Some((_, ours)) = host_paths.iter().find(|(p, _)| *p == path) {
                volume["hostPath"]["path"] = json!(ours.display().to_string());
            }
        }
        let socket = state_dir.join("agent.sock");
        let metrics = free_port();
        let data: BTreeMap<String, String> =
            serde_json::from_value(config["data"].clone()).unwrap();
        let mut containers = spec["initContainers"].as_array().unwrap().clone();
        containers.extend(spec["containers"].as_array().unwrap().iter().cloned());
        for container in &mut containers {
            // The kubelet expands `$(VAR)` in arguments; podman 4 does not.
            let mut args = args_of(container, &data, namespace);
            // No API server here to ask whether the DaemonSet is being deleted: without
            // --daemonset the installer unchains the plugin on SIGTERM, as deleting the
            // DaemonSet does (tests/cni_install_kube.rs covers --daemonset against a stand-in
            // API server).
            args.retain(|a| !a.starts_with("--daemonset="));
            container["args"] = json!(args);
            // podman refuses port declarations on the host's network (Kubernetes takes them as
            // documentation there); nothing is published either way.
            container.as_object_mut().unwrap().remove("ports");
            // The kubelet resolves `fieldRef`s; podman 4 does not support these.
            for env in container["env"].as_array_mut().into_iter().flatten() {
                let value = match env["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                    Some("spec.nodeName") => "test-node",
                    Some("metadata.namespace") => namespace,
                    Some("status.hostIP") => "127.0.0.1",
                    _ => continue,
                };
                *env = json!({"name": env["name"], "value": value});
            }
            for arg in container["args"].as_array_mut().unwrap() {
                let text = arg.as_str().unwrap();
                // The plugin runs on this host: it reaches the agent where the host sees the
                // socket. The node's port 9990 may be taken: the metrics go elsewhere.
                if text.starts_with("--agent-socket=") {
                    *arg = json!(format!("--agent-socket={}", socket.display()));
                } else if text.starts_with("--metrics-addr=") {
                    *arg = json!(format!("--metrics-addr=127.0.0.1:{metrics}"));
                }
            }
        }
        let init = spec["initContainers"].as_array().unwrap().len();
        spec["containers"] = json!(containers.split_off(init));
        spec["initContainers"] = json!(containers);
        let name = unique_name("interceptor");
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": {"app.kubernetes.io/name": "interceptor"},
                // Podman 4.3 removes a finished init container ("once", the default) racing
                // its exit (containers/podman#18477); "always" keeps it, as the kubelet does.
                "annotations": {"io.podman.annotations.init.container.type": "always"},
            },
            "spec": spec,
        });
        let yaml = network.root.join("pod.json");
        let configmap = network.root.join("configmap.json");
        std::fs::write(&yaml, pod.to_string()).unwrap();
        std::fs::write(&configmap, config.to_string()).unwrap();
        Self {
            podman,
            network,
            yaml,
            configmap,
            state_dir,
            bpffs,
        }
    }

    /// `podman kube play` (again, after removing the pod, with `replace`); returns once the
    /// agent answers its API and the installer has chained the plugin.
    fn play(&self, replace: bool) {
        if replace {
            self.remove_pod();
        }
        let mut cmd = self.podman.command(&["kube", "play", "--configmap"]);
        cmd.arg(&self.configmap);
        run(cmd.arg(&self.yaml), None);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while interceptor::agent::api::call(
            &self.state_dir.join("agent.sock"),
            &interceptor::agent::api::Request::List,
        )
        .is_err()
            || self.network.chained() != 1
        {
            if std::time::Instant::now() > deadline {
                panic!(
                    "the agent's pod did not come up (chained {}): {}",
                    self.network.chained(),
                    self.logs()
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// `podman pod rm -f`, tried again while podman's own clean-up of a killed container still
    /// holds its `shm` mount: removal then fails with EBUSY (podman's known "unlinkat/EBUSY"
    /// race, containers/podman#11594, #17216), as `kube play --replace` did once in CI.
    fn remove_pod(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let out = self
                .podman
                .command(&["pod", "rm", "--force", "--time", "0"])
                .arg(self.pod_name())
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            if out.status.success() {
                return;
            }
            if !stderr.contains("device or resource busy") || std::time::Instant::now() > deadline {
                panic!("podman pod rm: {stderr}");
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    fn logs(&self) -> String {
        let logs = self
            .podman
            .command(&["pod", "logs"])
            .arg(self.pod_name())
            .output()
            .unwrap();
        format!(
            "{}{}",
            String::from_utf8_lossy(&logs.stdout),
            String::from_utf8_lossy(&logs.stderr)
        )
    }

    /// The effective capabilities of a container's process, from the kernel (`CapEff`).
    fn capabilities(&self, container: &str) -> u64 {
        let pid = run(
            self.podman
                .command(&["inspect", "--format", "{{.State.Pid}}"])
                .arg(format!("{}-{container}", self.pod_name())),
            None,
        );
        let status = std::fs::read_to_string(format!("/proc/{}/status", pid.trim())).unwrap();
        let hex = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .unwrap()
            .trim();
        u64::from_str_radix(hex, 16).unwrap()
    }

    fn pod_name(&self) -> String {
        let pod: Value = serde_json::from_slice(&std::fs::read(&self.yaml).unwrap()).unwrap();
        pod["metadata"]["name"].as_str().unwrap().to_owned()
    }
}

impl Drop for AgentPod {
    fn drop(&mut self) {
        let _ = self
            .podman
            .command(&["kube", "down"])
            .arg(&self.yaml)
            .output();
        // What the agent pinned and recorded: its programs detach here.
        let _ = Command::new(interceptor_tests::agent_home::interceptor_bin())
            .arg("uninstall")
            .arg("--bpffs")
            .arg(self.bpffs.join("interceptor"))
            .arg("--state-dir")
            .arg(&self.state_dir)
            .output();
        let _ = std::fs::remove_dir(self.bpffs.join("interceptor"));
        // Where `--mode auto` probed (the probe removes its own directory in it).
        let _ = std::fs::remove_dir(self.bpffs.join("interceptor-probe"));
        let _ = std::fs::remove_dir(&self.bpffs);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn load_image() -> Option<Podman> {
    let Some(image) = std::env::var_os("INTERCEPTOR_IMAGE") else {
        assert!(
            std::env::var("INTERCEPTOR_REQUIRE_PRIVILEGED").as_deref() != Ok("1"),
            "INTERCEPTOR_IMAGE is not set: `cargo xtask test` builds the image and sets it"
        );
        eprintln!("SKIPPED: INTERCEPTOR_IMAGE is not set (build it with `cargo xtask image`)");
        return None;
    };
    let podman = Podman::new();
    let loaded = run(
        podman.command(&["load", "--quiet", "--input"]).arg(&image),
        None,
    );
    assert!(loaded.contains("localhost/interceptor:0.1.0"), "{loaded}");
    Some(podman)
}

/// The DaemonSet's own pod, from the image, by podman: it chains the plugin into the primary
/// network placed there before; a pod added through that network is meshed from its first
/// connect; the agent's pod killed and played again leaves it meshed throughout; the pod
/// deleted (SIGTERM) takes the plugin out of the chain, leaving the primary network as it was
/// (the installer runs without `--daemonset` here: there is no API server to ask).
#[test]
fn the_daemonsets_pod_meshes_pods_and_keeps_them_meshed_through_a_replay() {
    if !privileged("the_daemonsets_pod_meshes_pods_and_keeps_them_meshed_through_a_replay") {
        return;
    }
    let Some(podman) = load_image() else {
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
    if !privileged("the_init_container_mounts_a_bpffs_only_where_there_is_none") {
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
