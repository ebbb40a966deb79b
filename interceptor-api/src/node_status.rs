//! What a node's agent publishes about itself on its Node object, for `linkerd-interceptor
//! check` (and anyone with `kubectl get node -o yaml`): one annotation holding this JSON.
//!
//! The agent writes it when something in it changes (never on a timer), so its `updated` time
//! is when it last changed, not a heartbeat: whether the agent is up right now is its pod's
//! readiness, which the check reads from the API beside this.
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::Backend;

/// The Node annotation that holds a [`NodeStatus`] as JSON.
pub const NODE_STATUS_ANNOTATION: &str = "interceptor.linkerd.io/status";

/// At most this many pods are named in each list of a [`NodeStatus`] (the totals count all):
/// an annotation is part of an object every node's kubelet reads.
pub const MAX_PODS_NAMED: usize = 20;

/// A node's agent, as it last described itself.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// The agent's version (`CARGO_PKG_VERSION`).
    pub version: String,
    /// The backend it meshes pods with.
    pub backend: Backend,
    /// The eBPF program variant at each hook, as `hook=variant` (`interceptor kernel`'s
    /// words); empty with the iptables backend.
    #[serde(default)]
    pub variants: Vec<String>,
    /// Whether it can mesh a new pod: its programs attached where it was asked (or its iptables
    /// backend usable) and the CNI plugin chained. What the DaemonSet pod's readiness means.
    pub can_mesh: bool,
    /// Why it cannot, when it cannot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
    /// Whether the CNI plugin is chained into the node's primary network, as the installer last
    /// reported; `None` when the installer has not reported (or does not run beside it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chained: Option<bool>,
    /// Pods it meshes.
    pub meshed: u32,
    /// Pods Linkerd injected, running on the node, that the agent could not mesh (repair gave
    /// up on them), at most [`MAX_PODS_NAMED`].
    #[serde(default)]
    pub not_meshed: Vec<PodProblem>,
    #[serde(default)]
    pub not_meshed_total: u32,
    /// Meshed pods whose interception is not in force as configured and that repair could not
    /// put right, at most [`MAX_PODS_NAMED`].
    #[serde(default)]
    pub drifted: Vec<PodProblem>,
    #[serde(default)]
    pub drifted_total: u32,
    /// When this status last changed, RFC 3339 (UTC).
    pub updated: String,
}

/// A pod named in a [`NodeStatus`], and what is wrong with it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodProblem {
    pub namespace: String,
    pub name: String,
    pub reason: String,
}

/// The file, in the agent's state directory, where the watching CNI installer (`cni install
/// --watch --chain-report`) keeps its [`ChainReport`]; the agent reads it (`--cni-chain-report`)
/// when asked whether it is ready.
pub const CHAIN_REPORT_FILE: &str = "cni-chain.json";

/// Whether the CNI plugin is chained into the node's primary network configuration, as the
/// installer last found it: rewritten when that changes, removed with the plugin.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainReport {
    pub chained: bool,
    /// The configuration it is chained into, when it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conf: Option<PathBuf>,
    /// Why it is not (the installer's error: no primary network yet, its plugins missing from
    /// the bin directory, ...), when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl ChainReport {
    pub fn chained(conf: &Path) -> Self {
        Self {
            chained: true,
            conf: Some(conf.to_owned()),
            reason: None,
        }
    }

    pub fn not_chained(reason: impl Into<String>) -> Self {
        Self {
            chained: false,
            conf: None,
            reason: Some(reason.into()),
        }
    }

    /// The report as written at `path`, or why there is none to go by (not written yet, not a
    /// report).
    pub fn read(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => format!(
                "the CNI installer has not reported whether the plugin is chained (no {})",
                path.display()
            ),
            _ => format!("reading the CNI installer's report {}: {e}", path.display()),
        })?;
        serde_json::from_str(&text).map_err(|e| {
            format!(
                "the CNI installer's report {} is not one: {e}",
                path.display()
            )
        })
    }

    /// What keeps new pods from being meshed, by the report at `path`: `None` while it says
    /// chained.
    pub fn problem_at(path: &Path) -> Option<String> {
        match Self::read(path) {
            Ok(report) if report.chained => None,
            Ok(report) => Some(format!(
                "the CNI plugin is not chained: {}",
                report
                    .reason
                    .as_deref()
                    .unwrap_or("the installer gave no reason")
            )),
            Err(e) => Some(e),
        }
    }

    /// Writes the report at `path` whole: a reader sees the previous one or this one, never
    /// part of it (a temporary file beside it, renamed over it).
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let json = serde_json::to_vec(self).map_err(std::io::Error::other)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let temporary = path.with_file_name(format!(".{name}.{}", std::process::id()));
        std::fs::write(&temporary, json)
            .and_then(|()| std::fs::rename(&temporary, path))
            .inspect_err(|_| {
                let _ = std::fs::remove_file(&temporary);
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_report_reads_back_and_says_what_keeps_pods_from_being_meshed() {
        let dir = std::env::temp_dir().join(format!("icpt-chain-report-{}", std::process::id()));
        let path = dir.join(CHAIN_REPORT_FILE);
        let missing = ChainReport::problem_at(&path).unwrap();
        assert!(missing.contains("has not reported"), "{missing}");

        let chained = ChainReport::chained(Path::new("/etc/cni/net.d/10-calico.conflist"));
        chained.write(&path).unwrap();
        assert_eq!(ChainReport::read(&path).unwrap(), chained);
        assert_eq!(ChainReport::problem_at(&path), None);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            r#"{"chained":true,"conf":"/etc/cni/net.d/10-calico.conflist"}"#
        );
        // Only the report is left in the directory: the temporary file was renamed.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);

        ChainReport::not_chained("no primary network configuration in /etc/cni/net.d")
            .write(&path)
            .unwrap();
        assert_eq!(
            ChainReport::problem_at(&path).unwrap(),
            "the CNI plugin is not chained: no primary network configuration in /etc/cni/net.d"
        );
        // A newer installer's field is ignored; what is not a report is a problem, not ready.
        std::fs::write(&path, r#"{"chained":true,"since":"now"}"#).unwrap();
        assert_eq!(ChainReport::problem_at(&path), None);
        for bad in ["", "chained", r#"{"conf":"/x"}"#] {
            std::fs::write(&path, bad).unwrap();
            let problem = ChainReport::problem_at(&path).unwrap();
            assert!(problem.contains("is not one"), "{bad:?}: {problem}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_status_reads_back_as_written_and_unknown_fields_are_ignored() {
        let status = NodeStatus {
            version: "0.1.0".into(),
            backend: Backend::Ebpf,
            variants: vec!["connect4=icpt_connect4".into()],
            can_mesh: true,
            problems: vec![],
            chained: Some(true),
            meshed: 3,
            not_meshed: vec![PodProblem {
                namespace: "default".into(),
                name: "web-1".into(),
                reason: "no proxy listener".into(),
            }],
            not_meshed_total: 1,
            drifted: vec![],
            drifted_total: 0,
            updated: "2026-11-27T23:40:00Z".into(),
        };
        let json = serde_json::to_string(&status).unwrap();
        assert_eq!(serde_json::from_str::<NodeStatus>(&json).unwrap(), status);
        // A newer agent's field is ignored by an older check, not an error.
        let newer = json.replacen('{', r#"{"from_the_future":1,"#, 1);
        assert_eq!(serde_json::from_str::<NodeStatus>(&newer).unwrap(), status);
    }
}
