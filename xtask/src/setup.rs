//! `cargo xtask setup`: installs what the workspace needs beyond the Rust toolchains.
//! Every step checks first, so a second run installs nothing and takes a few seconds.

use std::{
    env,
    ffi::{OsStr, OsString},
    fs,
    os::unix::fs::{PermissionsExt as _, symlink},
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail, ensure};

use crate::cmd;

/// The nightly the eBPF programs are built and tested with (rustc 1.97.0-nightly e50aa6fba, LLVM
/// 22). They use `core_intrinsics`, which nightlies change: another nightly may fail to build
/// them. Also named in interceptor/build.rs's error.
pub const TESTED_NIGHTLY: &str = "nightly-2026-05-19";
/// Names the toolchain the eBPF programs build with, instead of `nightly` (interceptor/build.rs
/// reads it too).
pub const EBPF_TOOLCHAIN_VAR: &str = "INTERCEPTOR_EBPF_TOOLCHAIN";

/// The toolchain the eBPF programs build with: `nightly` (whichever is installed), or the one
/// [`EBPF_TOOLCHAIN_VAR`] names.
pub fn ebpf_toolchain() -> String {
    env::var(EBPF_TOOLCHAIN_VAR).unwrap_or_else(|_| "nightly".to_owned())
}

/// How to build with the tested nightly, for a message.
pub fn tested_nightly_hint() -> String {
    format!(
        "the eBPF programs are tested with {TESTED_NIGHTLY}: install it with `rustup toolchain \
         install {TESTED_NIGHTLY} --component rust-src` and build with \
         {EBPF_TOOLCHAIN_VAR}={TESTED_NIGHTLY} (then `cargo xtask setup` again: bpf-linker \
         must match its LLVM)"
    )
}

/// The bpf-linker verified with this workspace's aya and nightly.
const BPF_LINKER_VERSION: &str = "0.13.0";

/// Binaries the kernel tests run (on PATH, or at an absolute path), and the Debian packages
/// that provide them.
const DEBIAN_PACKAGES: &[(&str, &str)] = &[
    ("iptables-legacy", "iptables"),
    ("iptables-nft", "iptables"),
    ("ip", "iproute2"),
    ("nsenter", "util-linux"),
    // The reference CNI plugins the CNI plugin's tests chain after, as a runtime does.
    ("/usr/lib/cni/bridge", "containernetworking-plugins"),
    ("/usr/lib/cni/host-local", "containernetworking-plugins"),
    // A real container runtime with its CNI backend, and a static busybox to make an image of
    // (no registry is reachable from these machines).
    ("podman", "podman"),
    ("runc", "runc"),
    ("/bin/busybox", "busybox-static"),
    // podman's pod infra process, for `podman kube play` of the DaemonSet's pod.
    ("catatonit", "catatonit"),
    // containerd with its CRI plugin, driven over CRI as the kubelet drives it; protoc builds
    // the CRI client's protobuf definitions.
    ("containerd", "containerd"),
    ("ctr", "containerd"),
    ("protoc", "protobuf-compiler"),
];

/// Installs whatever is missing and returns the `PATH` child cargo commands must use:
/// the eBPF build finds bpf-linker through it.
pub fn run() -> anyhow::Result<OsString> {
    let install_root = cargo_install_root()?;
    let path = path_with(&install_root.join("bin"))?;
    debian_packages(DEBIAN_PACKAGES, &path)?;
    rust_src()?;
    nightly_version();
    bpf_linker(&install_root, &path)?;
    path_with_dir(&chart_tools()?, &path)
}

/// The Kubernetes schema validator the chart's tests run: 1.37.0 ships the schemas of
/// Kubernetes 1.25 to 1.37, so the tests validate against 1.31 (the oldest Linkerd supports)
/// and 1.37, the newest it has. It validates offline: the schemas ship with it.
const KUBERNETES_VALIDATE_VERSION: &str = "1.37.0";
/// Helm's Go SDK as a Python library (a bundled libhelm_c, no helm binary): the chart's tests
/// render and lint the chart with it (tests/helm_render.py).
const HELM_PYTHON_SDK_VERSION: &str = "0.2.2";

/// The chart's test tools, in one virtual environment of the workspace's: the validator, and
/// Helm beside it (its helper also reads YAML with the validator's PyYAML). Returns its `bin`
/// directory, whose `python3` the tests run.
fn chart_tools() -> anyhow::Result<PathBuf> {
    let bin = python_tool(
        "kubernetes-validate",
        "kubernetes-validate",
        KUBERNETES_VALIDATE_VERSION,
    )?;
    python_library(
        &bin,
        "helm-python-sdk",
        "helm_python",
        HELM_PYTHON_SDK_VERSION,
    )?;
    Ok(bin)
}

/// `package` at `version` from PyPI into the virtual environment of `bin`, unless its module
/// `module` (which has no command to ask) already reports that `__version__`.
fn python_library(bin: &Path, package: &str, module: &str, version: &str) -> anyhow::Result<()> {
    let installed = Command::new(bin.join("python3"))
        .arg("-c")
        .arg(format!("import {module}; print({module}.__version__)"))
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == version);
    if installed {
        println!("{package} {version}: present");
        return Ok(());
    }
    println!("{package} {version}: installing into {}...", bin.display());
    cmd::run(
        Command::new(bin.join("pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .arg(format!("{package}=={version}")),
    )
    .with_context(|| format!("installing {package} from PyPI"))
}

/// `package` at `version` from PyPI in a virtual environment of its own under `target/tools`,
/// installed unless `bin/<command> --version` already reports that version. Returns its `bin`
/// directory.
pub fn python_tool(package: &str, command: &str, version: &str) -> anyhow::Result<PathBuf> {
    let venv = crate::workspace_root()
        .join("target")
        .join("tools")
        .join(package);
    let bin = venv.join("bin");
    let installed = Command::new(bin.join(command))
        .arg("--version")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains(version));
    if installed {
        println!("{package} {version}: present");
        return Ok(bin);
    }
    println!("{package} {version}: installing into {}...", venv.display());
    cmd::run(Command::new("python3").args(["-m", "venv"]).arg(&venv)).with_context(|| {
        format!("creating a Python virtual environment (python3 -m venv) for {package}")
    })?;
    cmd::run(
        Command::new(bin.join("pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .arg(format!("{package}=={version}")),
    )
    .with_context(|| format!("installing {package} from PyPI"))?;
    Ok(bin)
}

/// Installs with apt-get the packages of `wanted` (binary on PATH or absolute path, Debian
/// package) whose binary is missing.
pub fn debian_packages(wanted: &[(&str, &str)], path: &OsStr) -> anyhow::Result<()> {
    let missing = |path| -> Vec<&str> {
        wanted
            .iter()
            .map(|(bin, _)| *bin)
            .filter(|bin| {
                if bin.starts_with('/') {
                    !Path::new(bin).exists()
                } else {
                    find_on_path(bin, path).is_none()
                }
            })
            .collect()
    };
    let bins = missing(path);
    if bins.is_empty() {
        let all: Vec<&str> = wanted.iter().map(|(bin, _)| *bin).collect();
        println!("{}: present", all.join(", "));
        return Ok(());
    }
    let mut packages: Vec<&str> = wanted
        .iter()
        .filter(|(bin, _)| bins.contains(bin))
        .map(|(_, package)| *package)
        .collect();
    packages.dedup();
    let (bins, packages_list) = (bins.join(", "), packages.join(" "));
    if find_on_path("apt-get", path).is_none() {
        bail!(
            "{bins} missing and there is no apt-get: install them (Debian packages: {packages_list})"
        );
    }
    println!("{bins}: missing, installing {packages_list} with apt-get...");
    let apt_hint = || {
        format!(
            "installing {packages_list} failed: run as root, or run `apt-get install {packages_list}` yourself"
        )
    };
    // Only now: apt-get update is slow, but a fresh machine's package lists are empty.
    cmd::run(Command::new("apt-get").args(["update", "-qq"])).with_context(apt_hint)?;
    cmd::run(
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&packages)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
    .with_context(apt_hint)?;
    let still = missing(path);
    ensure!(
        still.is_empty(),
        "installed {packages_list}, but {} still not on PATH (is /usr/sbin on it?)",
        still.join(", ")
    );
    Ok(())
}

/// aya-build compiles the eBPF crate with `-Z build-std`, which needs the nightly's std sources.
fn rust_src() -> anyhow::Result<()> {
    let toolchain = ebpf_toolchain();
    let installed = cmd::output(Command::new("rustup").args([
        "component",
        "list",
        "--toolchain",
        &toolchain,
        "--installed",
    ]))
    .with_context(|| format!("the eBPF programs build with the {toolchain} toolchain: install it with `rustup toolchain install {toolchain}`"))?;
    if installed.lines().any(|line| line.trim() == "rust-src") {
        println!("rust-src ({toolchain}): present");
        return Ok(());
    }
    println!("rust-src ({toolchain}): installing...");
    cmd::run(Command::new("rustup").args([
        "component",
        "add",
        "rust-src",
        "--toolchain",
        &toolchain,
    ]))
    .with_context(|| format!("could not add rust-src to the {toolchain} toolchain"))
}

/// Says which nightly the eBPF programs will build with, and, when it is not the tested one,
/// which is and how to use it should their build fail.
fn nightly_version() {
    let toolchain = ebpf_toolchain();
    let version = Command::new("rustc")
        .arg(format!("+{toolchain}"))
        .arg("--version")
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .unwrap_or_default();
    let date = TESTED_NIGHTLY.trim_start_matches("nightly-");
    if toolchain == TESTED_NIGHTLY || version.contains(date) {
        println!("{toolchain}: {version}, the nightly the eBPF programs are tested with");
    } else {
        println!(
            "{toolchain}: {version}, not the nightly the eBPF programs are tested with; if their \
             build fails, {}",
            tested_nightly_hint()
        );
    }
}

fn bpf_linker(install_root: &Path, path: &OsStr) -> anyhow::Result<()> {
    match bpf_linker_version(path) {
        Some(version) if version == BPF_LINKER_VERSION => {
            println!("bpf-linker {BPF_LINKER_VERSION}: present");
            return Ok(());
        }
        Some(version) => println!(
            "bpf-linker {BPF_LINKER_VERSION}: found {version}, installing {BPF_LINKER_VERSION} (about 75 s)..."
        ),
        None => println!("bpf-linker {BPF_LINKER_VERSION}: installing (about 75 s)..."),
    }

    // bpf-linker must link the LLVM that `rustc +nightly` emits bitcode for. The nightly
    // ships it as a shared library without the `libLLVM.so` name `-lLLVM` looks for, so
    // LLVM_PREFIX points at a directory of symlinks. bpf-linker records that directory as
    // its RUNPATH and loads libLLVM from it at every run, so it must outlive the build: it
    // sits in the cargo install root next to the binary, not in target/ where `cargo clean`
    // would break bpf-linker.
    let (llvm_major, libllvm) = nightly_libllvm()?;
    let prefix = install_root.join("bpf-linker-llvm");
    link_libllvm(&prefix.join("lib"), &libllvm)?;
    cmd::run(
        cmd::cargo()
            .arg("install")
            .arg(format!("bpf-linker@{BPF_LINKER_VERSION}"))
            .args(["--locked", "--no-default-features", "--features"])
            .arg(format!("llvm-{llvm_major}"))
            .arg("--root")
            .arg(install_root)
            // cargo skips a version it has recorded as installed even when that binary no
            // longer starts (e.g. the nightly it linked was updated), so reinstall regardless.
            .arg("--force")
            .env("LLVM_PREFIX", &prefix),
    )
    .context("building bpf-linker failed; the cargo output above says why")?;

    let installed = bpf_linker_version(path);
    ensure!(
        installed.as_deref() == Some(BPF_LINKER_VERSION),
        "installed bpf-linker {BPF_LINKER_VERSION} into {}, but `bpf-linker --version` reports {installed:?}",
        install_root.join("bin").display()
    );
    Ok(())
}

/// The version `bpf-linker --version` reports, or `None` when it is absent or does not start.
fn bpf_linker_version(path: &OsStr) -> Option<String> {
    let out = Command::new("bpf-linker")
        .arg("--version")
        .env("PATH", path)
        .output()
        .ok()?;
    let stdout = String::from_utf8(out.stdout).ok()?;
    let version = stdout.trim().strip_prefix("bpf-linker ")?;
    out.status.success().then(|| version.to_owned())
}

/// The nightly's LLVM major version (which picks bpf-linker's `llvm-N` feature) and its libLLVM.
fn nightly_libllvm() -> anyhow::Result<(String, PathBuf)> {
    let toolchain = ebpf_toolchain();
    let rustc_hint = || {
        format!(
            "the eBPF programs build with the {toolchain} toolchain: install it with `rustup toolchain install {toolchain}`"
        )
    };
    let plus = format!("+{toolchain}");
    let version =
        cmd::output(Command::new("rustc").args([&plus, "-vV"])).with_context(rustc_hint)?;
    let llvm_major = version
        .lines()
        .find_map(|line| line.strip_prefix("LLVM version: "))
        .and_then(|llvm| llvm.split('.').next())
        .with_context(|| format!("`rustc {plus} -vV` printed no `LLVM version: N.x` line"))?
        .to_owned();

    let sysroot = cmd::output(Command::new("rustc").args([&plus, "--print", "sysroot"]))
        .with_context(rustc_hint)?;
    let lib_dir = Path::new(sysroot.trim()).join("lib");
    let libs: Vec<PathBuf> = fs::read_dir(&lib_dir)
        .with_context(|| format!("could not list {}", lib_dir.display()))?
        .filter_map(|entry| entry.ok())
        .filter(|entry| {
            entry
                .file_name()
                .to_string_lossy()
                .starts_with("libLLVM.so.")
        })
        .map(|entry| entry.path())
        .collect();
    match libs.as_slice() {
        [libllvm] => Ok((llvm_major, libllvm.clone())),
        _ => bail!(
            "expected exactly one libLLVM.so.* in {}, found {libs:?}",
            lib_dir.display()
        ),
    }
}

/// Makes `lib_dir` hold `libLLVM.so` (for linking) and libLLVM's own name (for loading),
/// both pointing at `libllvm`.
fn link_libllvm(lib_dir: &Path, libllvm: &Path) -> anyhow::Result<()> {
    // Start empty: links left from an earlier nightly would point at a removed library.
    if lib_dir.exists() {
        fs::remove_dir_all(lib_dir)
            .with_context(|| format!("could not remove {}", lib_dir.display()))?;
    }
    fs::create_dir_all(lib_dir)
        .with_context(|| format!("could not create {}", lib_dir.display()))?;
    let soname = libllvm
        .file_name()
        .expect("read_dir entries have file names");
    for name in [OsStr::new("libLLVM.so"), soname] {
        let link = lib_dir.join(name);
        symlink(libllvm, &link)
            .with_context(|| format!("could not create the symlink {}", link.display()))?;
    }
    Ok(())
}

/// Where `cargo install` puts binaries under `bin/`, by cargo's own rules (CARGO_INSTALL_ROOT,
/// then CARGO_HOME, then ~/.cargo); passed to it as `--root` so the two always agree.
fn cargo_install_root() -> anyhow::Result<PathBuf> {
    if let Some(root) = env::var_os("CARGO_INSTALL_ROOT").or_else(|| env::var_os("CARGO_HOME")) {
        return Ok(root.into());
    }
    let home = env::var_os("HOME").context("neither CARGO_HOME nor HOME is set: set CARGO_HOME")?;
    Ok(Path::new(&home).join(".cargo"))
}

/// `PATH` with `bin` first, so the bpf-linker installed there wins over any other one.
fn path_with(bin: &Path) -> anyhow::Result<OsString> {
    path_with_dir(bin, &env::var_os("PATH").unwrap_or_default())
}

/// `path` with `dir` first.
pub fn path_with_dir(dir: &Path, path: &OsStr) -> anyhow::Result<OsString> {
    env::join_paths(std::iter::once(dir.to_owned()).chain(env::split_paths(path)))
        .with_context(|| format!("{} cannot go on PATH", dir.display()))
}

pub fn find_on_path(name: &str, path: &OsStr) -> Option<PathBuf> {
    env::split_paths(path)
        .map(|dir| dir.join(name))
        .find(|file| {
            file.metadata()
                .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        })
}
