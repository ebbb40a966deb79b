//! The node's OCI image (`cargo xtask image`, whose path `cargo xtask test` passes in
//! `INTERCEPTOR_IMAGE`), loaded into a podman image store of the test's own.
use std::{path::PathBuf, process::Command};

use crate::{command::run, fixture::runc_without_rlimits, unique_name};

mod agent_pod;

pub use agent_pod::AgentPod;

/// The image's name and tag once loaded: the workspace's version, as `cargo xtask image` tags it.
pub const IMAGE: &str = concat!("localhost/interceptor:", env!("CARGO_PKG_VERSION"));

/// The image's OCI archive, `INTERCEPTOR_IMAGE`; `None`, after saying why the test skips, when
/// it is not set, unless `INTERCEPTOR_REQUIRE_PRIVILEGED=1` forbids skipping.
pub fn archive() -> Option<PathBuf> {
    let Some(image) = std::env::var_os("INTERCEPTOR_IMAGE") else {
        assert!(
            std::env::var("INTERCEPTOR_REQUIRE_PRIVILEGED").as_deref() != Ok("1"),
            "INTERCEPTOR_IMAGE is not set: `cargo xtask test` builds the image and sets it"
        );
        eprintln!("SKIPPED: INTERCEPTOR_IMAGE is not set (build it with `cargo xtask image`)");
        return None;
    };
    Some(PathBuf::from(image))
}

/// A podman with an image store of the test's own, running containers with the tests' runc
/// wrapper (these machines withhold the rlimits podman asks for).
pub struct NodeImage {
    root: PathBuf,
}

impl NodeImage {
    /// The image loaded from `INTERCEPTOR_IMAGE`; `None`, after saying why the test skips, when
    /// it is not set, unless `INTERCEPTOR_REQUIRE_PRIVILEGED=1` forbids skipping.
    pub fn load() -> Option<Self> {
        let image = archive()?;
        let podman = Self {
            root: std::env::temp_dir().join(unique_name("image")),
        };
        let loaded = run(
            podman.command(&["load", "--quiet", "--input"]).arg(&image),
            None,
        );
        assert!(loaded.contains(IMAGE), "{loaded}");
        Some(podman)
    }

    /// podman on this image store with `args`.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("podman");
        cmd.arg("--root")
            .arg(self.root.join("storage"))
            .arg("--runroot")
            .arg(self.root.join("run"))
            .arg("--runtime")
            .arg(runc_without_rlimits())
            .args(args);
        cmd
    }

    /// `podman run --rm` of the image with `entrypoint` and `args`; its stdout.
    pub fn run(
        &self,
        extra: &[&str],
        entrypoint: &str,
        args: &[&str],
        input: Option<&str>,
    ) -> String {
        let mut cmd = self.command(&["run", "--rm", "-i", "--network", "none"]);
        cmd.args(extra)
            .args(["--entrypoint", entrypoint, IMAGE])
            .args(args);
        run(&mut cmd, input)
    }
}

impl Drop for NodeImage {
    fn drop(&mut self) {
        let _ = self.command(&["rmi", "--all", "--force"]).output();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
