//! `linkerd-interceptor check` as `linkerd check` runs it (the flags of linkerd2
//! `cli/cmd/check.go:261-278`, `--output=json`), and the other commands that read the cluster,
//! run as real binaries against the kit's stand-in API server through `--kubeconfig`.
use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use serde_json::Value;

use crate::{fake_api::FakeApi, probe::sibling_binary, unique_name};

pub mod objects;
pub mod output;

/// The flags `linkerd check` passes every extension when none of its own is given
/// (`getExtensionCheckFlags`: each flag whose value prints non-empty, the string array
/// `--as-group` printing `[]`), and `--output=json` last.
pub const LINKERD_FLAGS: &[&str] = &[
    "--as-group=[]",
    "--linkerd-namespace=linkerd",
    "--verbose=false",
    "--proxy=false",
    "--wait=5m0s",
    "--output=json",
];

/// The `linkerd-interceptor` binary built with this package (see [`sibling_binary`]).
pub fn linkerd_interceptor_bin() -> PathBuf {
    sibling_binary("linkerd-interceptor-under-test")
}

/// The stand-in API with its objects, and a kubeconfig for it in a directory removed on drop.
pub struct Cluster {
    pub api: FakeApi,
    kubeconfig: PathBuf,
    dir: PathBuf,
}

impl Cluster {
    pub fn start(objects: Vec<Value>) -> Self {
        let api = FakeApi::start(objects);
        let dir = std::env::temp_dir().join(unique_name("extension-check"));
        let kubeconfig = api.kubeconfig(&dir);
        Self {
            api,
            kubeconfig,
            dir,
        }
    }

    /// `binary` with `args` then `--kubeconfig`.
    pub fn run(&self, binary: &Path, args: &[&str]) -> Output {
        let output = Command::new(binary)
            .args(args)
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .output()
            .unwrap();
        eprintln!(
            "{} {args:?}: {}\nstdout:\n{}\nstderr:\n{}",
            binary.display(),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        output
    }

    /// `linkerd-interceptor check` as `linkerd check` runs it, plus `extra` (which come later
    /// and so win).
    pub fn linkerd_check(&self, extra: &[&str]) -> (Output, Value) {
        let args: Vec<&str> = ["check"]
            .iter()
            .chain(LINKERD_FLAGS)
            .chain(extra)
            .copied()
            .collect();
        let output = self.run(&linkerd_interceptor_bin(), &args);
        let json = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}): {}",
                String::from_utf8_lossy(&output.stdout)
            )
        });
        (output, json)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
