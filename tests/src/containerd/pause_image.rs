//! The sandbox ("pause") image, built from Debian's busybox-static since no registry is
//! reachable, and imported into the node's containerd.
use std::{path::Path, process::Command};

use serde_json::json;

/// The sandbox image, in the node's containerd's own store.
pub(super) const PAUSE_IMAGE: &str = "localhost/interceptor-test/pause:1";

/// Builds the sandbox image (busybox's sleep as its entrypoint) as a docker archive in `dir`
/// and imports it through `socket` into containerd's `k8s.io` namespace, where the CRI plugin
/// looks.
pub(super) fn import(dir: &Path, socket: &Path) {
    let image = dir.join("image");
    let rootfs = image.join("rootfs");
    std::fs::create_dir_all(rootfs.join("bin")).unwrap();
    std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).unwrap();
    std::os::unix::fs::symlink("busybox", rootfs.join("bin/sleep")).unwrap();
    run_ok(
        Command::new("tar")
            .arg("-C")
            .arg(&rootfs)
            .arg("-cf")
            .arg(image.join("layer.tar"))
            .arg("."),
    );
    let digest = run_ok(Command::new("sha256sum").arg(image.join("layer.tar")));
    let digest = digest.split_whitespace().next().expect("a digest");
    let config = json!({
        "architecture": "amd64",
        "os": "linux",
        "config": { "Entrypoint": ["/bin/sleep", "2147483647"] },
        "rootfs": { "type": "layers", "diff_ids": [format!("sha256:{digest}")] },
    });
    std::fs::write(image.join("config.json"), config.to_string()).unwrap();
    let manifest = json!([{
        "Config": "config.json",
        "RepoTags": [PAUSE_IMAGE],
        "Layers": ["layer.tar"],
    }]);
    std::fs::write(image.join("manifest.json"), manifest.to_string()).unwrap();
    run_ok(
        Command::new("tar")
            .arg("-C")
            .arg(&image)
            .arg("-cf")
            .arg(dir.join("pause.tar"))
            .args(["manifest.json", "config.json", "layer.tar"]),
    );
    run_ok(
        Command::new("ctr")
            .arg("--address")
            .arg(socket)
            .args(["--namespace", "k8s.io", "images", "import"])
            .arg(dir.join("pause.tar")),
    );
}

/// Runs `command`, which must succeed; its output.
fn run_ok(command: &mut Command) -> String {
    let out = command.output().expect("run a command");
    assert!(
        out.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
