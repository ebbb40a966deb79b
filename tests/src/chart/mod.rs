//! The Helm chart `charts/interceptor`, rendered by Helm's own code (tests/helm_render.py, on
//! helm-python-sdk's libhelm_c, which `cargo xtask setup` installs and puts first on PATH).
use std::{collections::BTreeMap, path::Path, process::Command};

use serde_json::Value;

pub mod args;
pub mod linkerd2_cni;
pub mod schemas;

/// The workspace's root, where the chart's paths start.
pub fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the workspace")
}

/// The chart, and the namespace users install it in (`-n linkerd-cni`, where `linkerd check`
/// looks).
pub const CHART: &str = "charts/interceptor";
pub const NAMESPACE: &str = "linkerd-cni";

/// tests/helm_render.py with `args`, run by the test tools' Python (first on PATH).
pub fn helm(args: &[&str]) -> Command {
    let mut cmd = Command::new("python3");
    cmd.arg(workspace_root().join("tests/helm_render.py"))
        .args(args)
        .current_dir(workspace_root());
    cmd
}

/// A render of the chart: its objects (hooks included), the same as manifests, and NOTES.txt.
pub struct Rendered {
    pub objects: Vec<Value>,
    pub yaml: String,
    pub notes: String,
}

impl Rendered {
    /// The object of `kind` named `name`, if the chart rendered one.
    pub fn get(&self, kind: &str, name: &str) -> Option<&Value> {
        self.objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
    }

    /// The object of `kind` named `name`, which the chart must render.
    pub fn find(&self, kind: &str, name: &str) -> &Value {
        self.get(kind, name)
            .unwrap_or_else(|| panic!("no {kind} {name} in the chart's objects"))
    }

    /// The agent's DaemonSet, named as linkerd-cni's.
    pub fn daemonset(&self) -> &Value {
        self.find("DaemonSet", "linkerd-cni")
    }

    /// The plugin's `linkerd` block as the ConfigMap's `cni_network_config` (linkerd-cni's
    /// conflist entry) carries it, as written.
    pub fn linkerd_block(&self) -> String {
        let entry = &self.config()["cni_network_config"];
        let block = entry
            .split_once("\"linkerd\":")
            .unwrap_or_else(|| panic!("no linkerd block in {entry}"))
            .1;
        block
            .trim_end()
            .strip_suffix('}')
            .unwrap()
            .trim()
            .to_owned()
    }

    /// The ConfigMap's data: linkerd-cni's keys (our containers read none of them).
    pub fn config(&self) -> BTreeMap<String, String> {
        serde_json::from_value(self.find("ConfigMap", "linkerd-cni-config")["data"].clone())
            .unwrap()
    }
}

/// The chart rendered by Helm as `helm install linkerd2-cni charts/interceptor -n linkerd-cni`
/// would, with `values` (values files, from the workspace's root, or JSON objects) merged in
/// order, as a `.Release.Service` of `release_service` when given; Helm's refusal otherwise.
pub fn try_render(values: &[&str], release_service: Option<&str>) -> Result<Rendered, String> {
    let mut cmd = helm(&["render", CHART, NAMESPACE]);
    for values in values {
        cmd.arg("--values").arg(values);
    }
    if let Some(service) = release_service {
        cmd.args(["--release-service", service]);
    }
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    if !out.status.success() {
        return Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let out: Value = serde_json::from_slice(&out.stdout).unwrap();
    Ok(Rendered {
        objects: out["objects"].as_array().unwrap().clone(),
        yaml: out["yaml"].as_str().unwrap().to_owned(),
        notes: out["notes"].as_str().unwrap().to_owned(),
    })
}

/// [`try_render`] as the users' `helm install`, which must not refuse `values`.
pub fn render(values: &[&str]) -> Rendered {
    try_render(values, None).unwrap_or_else(|e| panic!("rendering with {values:?}: {e}"))
}

/// The DaemonSet's container `name`.
pub fn container<'a>(daemonset: &'a Value, name: &str) -> &'a Value {
    daemonset["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}
