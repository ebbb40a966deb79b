use serde_json::json;

use super::*;

/// A conf directory and a bin directory of the test's own.
struct Dirs {
    root: PathBuf,
}

impl Dirs {
    fn new(tag: &str) -> Self {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let root =
            std::env::temp_dir().join(format!("icpt-install-{tag}-{}-{n}", std::process::id()));
        fs::create_dir_all(root.join("net.d")).unwrap();
        fs::create_dir_all(root.join("plugin")).unwrap();
        fs::write(root.join("plugin/interceptor-cni"), b"#!plugin").unwrap();
        Self { root }
    }

    fn conf(&self, name: &str) -> PathBuf {
        self.root.join("net.d").join(name)
    }

    fn installer(&self) -> Installer {
        Installer {
            bin_dir: self.root.join("bin"),
            conf_dir: self.root.join("net.d"),
            plugin: self.root.join("plugin/interceptor-cni"),
            entry: entry(
                json!({ "linkerd": { "proxy-uid": 2102 } })
                    .as_object()
                    .unwrap()
                    .clone(),
            ),
        }
    }

    /// The primary network's plugins, where the runtime finds them.
    fn binaries(&self, kinds: &[&str]) {
        fs::create_dir_all(self.root.join("bin")).unwrap();
        for kind in kinds {
            fs::write(self.root.join("bin").join(kind), b"#!primary").unwrap();
        }
    }

    /// Every file under the test's directories, with its bytes.
    fn snapshot(&self) -> Vec<(PathBuf, Vec<u8>)> {
        fn walk(dir: &Path, out: &mut Vec<(PathBuf, Vec<u8>)>) {
            for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    walk(&path, out);
                } else {
                    out.push((path.clone(), fs::read(&path).unwrap()));
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.root, &mut out);
        out.sort();
        out
    }

    fn files(&self) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(self.root.join("net.d"))
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        names.sort();
        names
    }
}

impl Drop for Dirs {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

fn calico() -> Value {
    json!({"name": "k8s-pod-network", "cniVersion": "0.3.1", "plugins": [
        {"type": "calico", "datastore_type": "kubernetes", "ipam": {"type": "calico-ipam"},
         "kubernetes": {"kubeconfig": "/etc/cni/net.d/calico-kubeconfig"}},
        {"type": "bandwidth", "capabilities": {"bandwidth": true}},
        {"type": "portmap", "snat": true, "capabilities": {"portMappings": true}}]})
}

fn flannel() -> Value {
    json!({"name": "cbr0", "cniVersion": "0.3.1", "plugins": [
        {"type": "flannel", "delegate": {"hairpinMode": true, "isDefaultGateway": true}},
        {"type": "portmap", "capabilities": {"portMappings": true}}]})
}

fn cilium_conf() -> Value {
    json!({"cniVersion": "0.3.1", "name": "cilium", "type": "cilium-cni",
           "enable-debug": false, "log-file": "/var/run/cilium/cilium-cni.log"})
}

fn read(path: &Path) -> Value {
    serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
}

#[test]
fn chains_after_calico_and_flannel_lists_once_and_uninstalls_exactly() {
    for (name, original) in [
        ("10-calico.conflist", calico()),
        ("10-flannel.conflist", flannel()),
    ] {
        let dirs = Dirs::new("list");
        dirs.binaries(&["calico", "bandwidth", "portmap", "flannel"]);
        fs::write(
            dirs.conf(name),
            serde_json::to_vec_pretty(&original).unwrap(),
        )
        .unwrap();
        // Another configuration later in the directory is not the primary one.
        fs::write(
            dirs.conf("99-loopback.conf"),
            br#"{"cniVersion":"0.3.1","name":"lo","type":"loopback"}"#,
        )
        .unwrap();
        let installer = dirs.installer();
        let primary_plugins = original["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["type"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(
            installer.install().unwrap(),
            Applied::Chained {
                conf: dirs.conf(name),
                primary_plugins
            }
        );
        assert_eq!(
            installer.install().unwrap(),
            Applied::Unchanged(dirs.conf(name))
        );
        let chained = read(&dirs.conf(name));
        let plugins = chained["plugins"].as_array().unwrap();
        assert_eq!(
            plugins.len(),
            original["plugins"].as_array().unwrap().len() + 1
        );
        assert_eq!(plugins.last().unwrap()["type"], PLUGIN_TYPE);
        // containerd passes the pod's annotations to a plugin that declares the capability.
        assert_eq!(
            plugins.last().unwrap()["capabilities"],
            json!({ "io.kubernetes.cri.pod-annotations": true })
        );
        assert_eq!(plugins.last().unwrap()["linkerd"]["proxy-uid"], 2102);
        assert_eq!(
            plugins[0], original["plugins"][0],
            "the primary plugin is untouched"
        );
        assert_eq!(
            fs::read(dirs.root.join("bin/interceptor-cni")).unwrap(),
            b"#!plugin"
        );

        installer.uninstall().unwrap();
        assert_eq!(read(&dirs.conf(name)), original, "{name}");
        assert!(!dirs.root.join("bin/interceptor-cni").exists());
        assert_eq!(dirs.files(), [name, "99-loopback.conf"]);
    }
}

#[test]
fn a_lone_conf_becomes_a_conflist_and_comes_back_on_uninstall() {
    let dirs = Dirs::new("conf");
    dirs.binaries(&["cilium-cni"]);
    fs::write(
        dirs.conf("05-cilium.conf"),
        serde_json::to_vec(&cilium_conf()).unwrap(),
    )
    .unwrap();
    let installer = dirs.installer();
    assert_eq!(
        installer.install().unwrap(),
        Applied::Chained {
            conf: dirs.conf("05-cilium.conflist"),
            primary_plugins: vec!["cilium-cni".into()]
        }
    );
    assert_eq!(
        dirs.files(),
        [".interceptor-cni-install.json", "05-cilium.conflist"]
    );
    let list = read(&dirs.conf("05-cilium.conflist"));
    assert_eq!(list["name"], "cilium");
    assert_eq!(list["plugins"][0], cilium_conf());
    assert_eq!(list["plugins"][1]["type"], PLUGIN_TYPE);

    installer.uninstall().unwrap();
    assert_eq!(dirs.files(), ["05-cilium.conf"]);
    assert_eq!(read(&dirs.conf("05-cilium.conf")), cilium_conf());
}

#[test]
fn a_rewrite_by_the_primary_cni_is_chained_again_and_our_entry_is_updated_in_place() {
    let dirs = Dirs::new("rewrite");
    dirs.binaries(&["calico", "bandwidth", "portmap"]);
    let path = dirs.conf("10-calico.conflist");
    fs::write(&path, serde_json::to_vec(&calico()).unwrap()).unwrap();
    let mut installer = dirs.installer();
    installer.install().unwrap();
    // Calico rewrites its file, dropping our entry.
    fs::write(&path, serde_json::to_vec(&calico()).unwrap()).unwrap();
    assert_eq!(
        installer.apply().unwrap(),
        Applied::Chained {
            conf: path.clone(),
            primary_plugins: vec!["calico".into(), "bandwidth".into(), "portmap".into()]
        }
    );
    assert_eq!(read(&path)["plugins"].as_array().unwrap().len(), 4);
    // A new configuration of ours replaces the entry, never adds a second.
    installer.entry = json!({ "type": PLUGIN_TYPE, "linkerd": { "proxy-uid": 3000 } });
    assert_eq!(installer.apply().unwrap(), Applied::Updated(path.clone()));
    let plugins = read(&path)["plugins"].as_array().unwrap().clone();
    assert_eq!(
        plugins.iter().filter(|p| p["type"] == PLUGIN_TYPE).count(),
        1
    );
    assert_eq!(plugins[3]["linkerd"]["proxy-uid"], 3000);
}

#[test]
fn no_primary_configuration_is_a_clear_error() {
    let dirs = Dirs::new("empty");
    let err = dirs.installer().install().unwrap_err();
    assert!(
        err.to_string().contains("install the primary CNI first"),
        "{err}"
    );
    fs::write(dirs.conf("10-bad.conflist"), b"{ not json").unwrap();
    let err = dirs.installer().install().unwrap_err();
    assert!(err.to_string().contains("10-bad.conflist"), "{err}");
}

/// The node files no installer can change.
#[path = "malformed_cases.rs"]
mod malformed_cases;

/// Every malformed file is refused by install, the watch's apply and uninstall alike, with an
/// error naming the file and what is wrong, and nothing is changed: not the file, not the state
/// file, not a binary (as if an earlier install had converted a `.conf`).
#[test]
fn a_malformed_node_configuration_is_refused_and_left_as_it_is() {
    for (name, text, reason) in malformed_cases::MALFORMED {
        let dirs = Dirs::new("malformed");
        dirs.binaries(&["loopback", PLUGIN_TYPE]);
        fs::write(dirs.conf(name), text).unwrap();
        fs::write(
            dirs.conf(STATE_FILE),
            json!({ "converted_from": "10-net.conf" }).to_string(),
        )
        .unwrap();
        let before = dirs.snapshot();
        let installer = dirs.installer();
        for (action, result) in [
            ("install", installer.install().map(drop)),
            ("apply", installer.apply().map(drop)),
            ("uninstall", installer.uninstall()),
        ] {
            let err = result.expect_err(&format!("{action} of {name} {text:?}"));
            assert!(
                matches!(&err, InstallError::BadConfig { path, .. } if *path == dirs.conf(name)),
                "{action} of {text:?}: {err:?}"
            );
            let message = err.to_string();
            assert!(
                message.contains(&dirs.conf(name).display().to_string())
                    && message.contains(reason)
                    && message.contains("left as it is"),
                "{action} of {text:?}: {reason:?} not in {message}"
            );
            assert_eq!(dirs.snapshot(), before, "{action} of {text:?} wrote");
        }
    }
}

/// Uninstalling where the primary is a lone `.conf` (never converted: nothing of ours in it)
/// removes only the binary.
/// Found by the `conflist` fuzz target: a conflist holding our entry twice kept both, so the
/// runtime ran the plugin twice for each pod.
#[test]
fn our_entry_found_twice_is_chained_once() {
    let dirs = Dirs::new("twice");
    dirs.binaries(&["flannel", "portmap"]);
    let installer = dirs.installer();
    let mut list = flannel();
    let plugins = list["plugins"].as_array_mut().unwrap();
    plugins.insert(1, installer.entry.clone());
    plugins.push(json!({"type": PLUGIN_TYPE, "linkerd": {"proxy-uid": 1}}));
    fs::write(
        dirs.conf("10-flannel.conflist"),
        serde_json::to_vec(&list).unwrap(),
    )
    .unwrap();
    assert_eq!(
        installer.install().unwrap(),
        Applied::Updated(dirs.conf("10-flannel.conflist"))
    );
    let types: Vec<Value> = read(&dirs.conf("10-flannel.conflist"))["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["type"].clone())
        .collect();
    assert_eq!(
        types,
        [json!("flannel"), json!(PLUGIN_TYPE), json!("portmap")]
    );
    assert_eq!(
        installer.apply().unwrap(),
        Applied::Unchanged(dirs.conf("10-flannel.conflist"))
    );
}

/// Found by the `conflist` fuzz target: a `.conf` without `name` came back from uninstalling
/// with `"name": null`, which the list made of it had.
#[test]
fn a_lone_conf_without_a_name_comes_back_without_one() {
    let dirs = Dirs::new("conf-no-name");
    dirs.binaries(&["cilium-cni"]);
    let mut conf = cilium_conf();
    conf.as_object_mut().unwrap().remove("name");
    fs::write(
        dirs.conf("05-cilium.conf"),
        serde_json::to_vec(&conf).unwrap(),
    )
    .unwrap();
    let installer = dirs.installer();
    installer.install().unwrap();
    installer.uninstall().unwrap();
    assert_eq!(dirs.files(), ["05-cilium.conf"]);
    assert_eq!(read(&dirs.conf("05-cilium.conf")), conf);
}

#[test]
fn uninstall_leaves_a_lone_conf_it_never_converted() {
    let dirs = Dirs::new("loneconf");
    dirs.binaries(&[PLUGIN_TYPE]);
    let path = dirs.conf("05-cilium.conf");
    let text = serde_json::to_vec(&cilium_conf()).unwrap();
    fs::write(&path, &text).unwrap();
    dirs.installer().uninstall().unwrap();
    assert_eq!(fs::read(&path).unwrap(), text);
    assert!(!dirs.root.join("bin").join(PLUGIN_TYPE).exists());
}

#[test]
fn a_primary_whose_plugins_are_not_in_the_bin_dir_is_refused_and_nothing_is_written() {
    let dirs = Dirs::new("missing");
    let path = dirs.conf("10-calico.conflist");
    fs::write(&path, serde_json::to_vec_pretty(&calico()).unwrap()).unwrap();
    let installer = dirs.installer();
    let before = dirs.snapshot();
    let err = installer.install().unwrap_err();
    let text = err.to_string();
    for expected in [
        path.display().to_string(),
        dirs.root.join("bin").display().to_string(),
        "calico, bandwidth, portmap".to_owned(),
        "--bin-dir".to_owned(),
        "/home/kubernetes/bin".to_owned(),
    ] {
        assert!(text.contains(&expected), "{expected:?} not in {text}");
    }
    assert_eq!(dirs.snapshot(), before, "nothing written");
    assert!(!dirs.root.join("bin").exists());
    // The watch's re-apply refuses the same way.
    assert!(matches!(
        installer.apply(),
        Err(InstallError::MissingPlugins { .. })
    ));
    assert_eq!(dirs.snapshot(), before);

    // One still missing is named alone.
    dirs.binaries(&["calico", "bandwidth"]);
    match installer.install() {
        Err(InstallError::MissingPlugins { missing, .. }) => assert_eq!(missing, ["portmap"]),
        other => panic!("{other:?}"),
    }
    assert!(!dirs.root.join("bin/interceptor-cni").exists());
    assert_eq!(read(&path), calico());
    dirs.binaries(&["portmap"]);
    assert!(matches!(installer.install().unwrap(), Applied::Chained { conf, .. } if conf == path));
    assert!(dirs.root.join("bin/interceptor-cni").is_file());
}

#[test]
fn a_lone_conf_whose_plugin_is_not_in_the_bin_dir_is_refused_and_nothing_is_written() {
    let dirs = Dirs::new("missingconf");
    fs::write(
        dirs.conf("05-cilium.conf"),
        serde_json::to_vec(&cilium_conf()).unwrap(),
    )
    .unwrap();
    let before = dirs.snapshot();
    let err = dirs.installer().install().unwrap_err();
    assert!(err.to_string().contains("cilium-cni"), "{err}");
    assert_eq!(dirs.snapshot(), before);
    assert_eq!(dirs.files(), ["05-cilium.conf"], "no state file either");
}

/// Three restores within ten minutes start an episode, reported once however long it lasts; it
/// ends when no restore was needed for ten minutes, and the next one is reported again.
#[test]
fn restores_are_reported_once_per_episode_of_three_within_ten_minutes() {
    let start = Instant::now();
    let at = |minutes: u64| start + Duration::from_secs(minutes * 60);
    let mut restores = Restores::default();
    assert!(!restores.record(at(0)));
    assert!(!restores.record(at(1)));
    assert!(restores.record(at(2)), "the third within ten minutes");
    assert!(!restores.record(at(3)), "once per episode");
    // Slower now, but never ten quiet minutes: the same episode.
    for minutes in [9, 16, 23, 24, 25] {
        assert!(!restores.record(at(minutes)), "at {minutes} min");
    }
    // Then a quiet half hour: the episode is over, and a new one is reported on its third.
    assert!(!restores.record(at(55)));
    assert!(!restores.record(at(56)));
    assert!(restores.record(at(57)));
    // Three spread over more than ten minutes are no episode.
    let mut spread = Restores::default();
    for minutes in [0, 6, 12, 18, 24] {
        assert!(!spread.record(at(minutes)), "at {minutes} min");
    }
}

#[test]
fn the_cause_of_rewrites_names_ciliums_setting_or_the_primarys_plugins() {
    let cilium = rewrite_cause(&["cilium-cni".into()]);
    assert!(
        cilium.contains("cni.exclusive=true")
            && cilium.contains("install Cilium with --set cni.exclusive=false"),
        "{cilium}"
    );
    let calico = rewrite_cause(&["calico".into(), "portmap".into()]);
    assert!(
        calico.contains("(plugins: calico, portmap) keeps rewriting"),
        "{calico}"
    );
    assert!(!calico.contains("Cilium"), "{calico}");
}
