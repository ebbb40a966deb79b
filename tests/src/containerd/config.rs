//! containerd's configuration file for a node of the tests.
use std::path::Path;

use crate::fixture::runc_without_rlimits;

use super::pause_image::PAUSE_IMAGE;

/// containerd's configuration: every path under `dir`, CRI's CNI directories the test's, runc
/// through the wrapper that drops rlimits this machine's containers cannot have, cgroupfs.
pub(super) fn containerd_config(
    dir: &Path,
    socket: &Path,
    conf_dir: &Path,
    bin_dir: &Path,
) -> String {
    format!(
        r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  netns_mounts_under_state_dir = true

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{runtime}"
        Root = "{runc_root}"
        SystemdCgroup = false

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{bin_dir}"
    conf_dir = "{conf_dir}"
    max_conf_num = 1
"#,
        root = dir.join("root").display(),
        state = dir.join("state").display(),
        opt = dir.join("opt").display(),
        runtime = runc_without_rlimits().display(),
        runc_root = dir.join("runc").display(),
        socket = socket.display(),
        bin_dir = bin_dir.display(),
        conf_dir = conf_dir.display(),
    )
}
