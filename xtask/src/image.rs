//! `cargo xtask image`: the node agent's OCI image, `target/image/interceptor.oci.tar`, built
//! without pulling anything (no registry is reachable from where this is built and tested).
//!
//! The image is `FROM scratch` with a root filesystem assembled here: the release `interceptor`,
//! `interceptor-cni` and `linkerd-interceptor` binaries, the iptables binaries `--takeover-iptables` runs (legacy and
//! nft, with their extension modules), and exactly the shared libraries all of these load, as
//! `ldd` resolves them on this Debian system. Nothing else: no shell, no package manager. A
//! Debian base image would need a registry or a bootstrap tool and would carry far more than the
//! agent runs.
//!
//! The binaries are built in a target directory of their own, and checked to hold none of the
//! kill tests' crash points before they are copied in (see `crash_points`).

use std::{
    collections::BTreeSet,
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail, ensure};

use crate::{cmd, crash_points, setup, workspace_root};

/// Where the image and its build context go, under the workspace.
pub const IMAGE_DIR: &str = "target/image";
pub const IMAGE_FILE: &str = "interceptor.oci.tar";
/// The name the image is tagged with: the archive's `org.opencontainers.image.ref.name`, which
/// `ctr images import` and `podman load` name it by, and the chart's default reference.
pub const IMAGE_NAME: &str = "localhost/interceptor";

/// The iptables front ends proxy-init's modes run, each a name of one of the two multi-call
/// binaries (Debian's own layout, without its alternatives: plain `iptables` is nft here, as
/// it is by default on Debian and most current distributions).
const IPTABLES_LINKS: &[(&str, &str)] = &[
    ("iptables-legacy", "xtables-legacy-multi"),
    ("iptables-legacy-save", "xtables-legacy-multi"),
    ("iptables-legacy-restore", "xtables-legacy-multi"),
    ("ip6tables-legacy", "xtables-legacy-multi"),
    ("ip6tables-legacy-save", "xtables-legacy-multi"),
    ("ip6tables-legacy-restore", "xtables-legacy-multi"),
    ("iptables-nft", "xtables-nft-multi"),
    ("iptables-nft-save", "xtables-nft-multi"),
    ("iptables-nft-restore", "xtables-nft-multi"),
    ("ip6tables-nft", "xtables-nft-multi"),
    ("ip6tables-nft-save", "xtables-nft-multi"),
    ("ip6tables-nft-restore", "xtables-nft-multi"),
    ("iptables", "xtables-nft-multi"),
    ("iptables-save", "xtables-nft-multi"),
    ("iptables-restore", "xtables-nft-multi"),
    ("ip6tables", "xtables-nft-multi"),
    ("ip6tables-save", "xtables-nft-multi"),
    ("ip6tables-restore", "xtables-nft-multi"),
];
const XTABLES_MODULES: &str = "/usr/lib/x86_64-linux-gnu/xtables";
const HOST_TARGET: &str = "x86_64-unknown-linux-gnu";

/// Builds the image; returns the path of the OCI archive.
pub fn build() -> anyhow::Result<PathBuf> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    ensure!(
        euid == 0,
        "building the image runs podman as root: run it as root, e.g. sudo -E cargo xtask image"
    );
    let path = setup::run()?;
    let root = workspace_root();
    let build_dir = root.join("target").join("image-build");
    cmd::run(
        cmd::cargo()
            .current_dir(root)
            .args(["build", "--release", "-p", "interceptor", "--bins"])
            .arg("--target-dir")
            .arg(&build_dir)
            .env("PATH", &path),
    )?;
    // The plugin runs on the node, outside the image, next to whatever C library the node has:
    // linked statically (it resolves no names, so glibc's static limits do not matter). With
    // an explicit --target, the flags reach the plugin and not the build scripts.
    cmd::run(
        cmd::cargo()
            .current_dir(root)
            .args([
                "build",
                "--release",
                "-p",
                "interceptor-cni",
                "--bin",
                "interceptor-cni",
            ])
            .args(["--target", HOST_TARGET])
            .arg("--target-dir")
            .arg(&build_dir)
            .env("RUSTFLAGS", "-C target-feature=+crt-static")
            .env("PATH", &path),
    )?;
    let image_dir = root.join(IMAGE_DIR);
    let rootfs = image_dir.join("rootfs");
    if rootfs.exists() {
        fs::remove_dir_all(&rootfs).with_context(|| format!("removing {}", rootfs.display()))?;
    }
    // linkerd-interceptor is never run in the image: it is there to be copied out, for
    // `linkerd check` on the users' machines (docs/kubernetes.md says how).
    let binaries = [
        build_dir.join("release/interceptor"),
        build_dir.join(HOST_TARGET).join("release/interceptor-cni"),
        build_dir.join("release/linkerd-interceptor"),
    ];
    crash_points::check_binaries(&binaries)?;
    let bin = Path::new("/usr/local/bin");
    let mut elves = Vec::new();
    for binary in &binaries {
        elves.push(copy_into(&rootfs, binary, bin)?);
    }
    for multi in ["xtables-legacy-multi", "xtables-nft-multi"] {
        elves.push(copy_into(
            &rootfs,
            &Path::new("/usr/sbin").join(multi),
            Path::new("/usr/sbin"),
        )?);
    }
    for (name, target) in IPTABLES_LINKS {
        symlink(target, rootfs.join("usr/sbin").join(name))
            .with_context(|| format!("linking {name}"))?;
    }
    for module in fs::read_dir(XTABLES_MODULES)
        .with_context(|| format!("reading {XTABLES_MODULES}: is iptables installed?"))?
    {
        let module = module?.path();
        elves.push(copy_into(&rootfs, &module, Path::new(XTABLES_MODULES))?);
    }
    copy_libraries(&rootfs, &elves)?;
    // Writable places the agent and iptables use (the xtables lock, the agent's state).
    for dir in ["run", "tmp", "var/run", "etc", "proc", "sys"] {
        fs::create_dir_all(rootfs.join(dir))?;
    }
    fs::write(
        rootfs.join("etc/passwd"),
        "root:x:0:0:root:/:/usr/local/bin/interceptor\n",
    )?;
    fs::write(rootfs.join("etc/group"), "root:x:0:\n")?;

    let containerfile = image_dir.join("Containerfile");
    fs::write(
        &containerfile,
        "FROM scratch\nCOPY rootfs/ /\nENV PATH=/usr/local/bin:/usr/sbin\n\
         ENTRYPOINT [\"/usr/local/bin/interceptor\"]\nCMD [\"--help\"]\n",
    )?;
    let tag = format!("{IMAGE_NAME}:{}", env!("CARGO_PKG_VERSION"));
    // An image store of its own, so building leaves nothing in the machine's.
    let podman = |args: &[&str]| {
        let mut podman = Command::new("podman");
        podman
            .arg("--root")
            .arg(image_dir.join("storage"))
            .arg("--runroot")
            .arg(image_dir.join("runroot"))
            .args(args)
            .env("PATH", &path);
        podman
    };
    cmd::run(
        podman(&["build", "--quiet", "--no-cache", "--tag", &tag, "--file"])
            .arg(&containerfile)
            .arg(&image_dir),
    )?;
    let archive = image_dir.join(IMAGE_FILE);
    let _ = fs::remove_file(&archive);
    cmd::run(
        podman(&["save", "--format", "oci-archive", "--output"])
            .arg(&archive)
            .arg(&tag),
    )?;
    cmd::run(&mut podman(&["rmi", "--force", &tag]))?;
    let size = fs::metadata(&archive)?.len();
    println!(
        "image {tag}: {} ({:.1} MiB); on a containerd node, load it with \
         `ctr -n k8s.io images import {}` (docs/kubernetes.md for other runtimes)",
        archive.display(),
        size as f64 / (1024.0 * 1024.0),
        archive.display()
    );
    Ok(archive)
}

/// Copies `file` into `rootfs` under `dir` (the directory it has in the image); returns `file`,
/// for `ldd` to read the libraries the copy will load.
fn copy_into(rootfs: &Path, file: &Path, dir: &Path) -> anyhow::Result<PathBuf> {
    let name = file.file_name().context("a file name")?;
    let in_image = dir.join(name);
    let dest = rootfs.join(in_image.strip_prefix("/").unwrap_or(&in_image));
    fs::create_dir_all(dest.parent().expect("a parent"))?;
    fs::copy(file, &dest).with_context(|| format!("copying {}", file.display()))?;
    Ok(file.to_owned())
}

/// Copies every shared library the `elves` load (their `ldd` closure: ldd lists indirect
/// dependencies too) to the path the dynamic loader finds it at.
fn copy_libraries(rootfs: &Path, elves: &[PathBuf]) -> anyhow::Result<()> {
    let mut libraries = BTreeSet::new();
    for elf in elves {
        let out = Command::new("ldd")
            .arg(elf)
            .output()
            .with_context(|| format!("ldd {}", elf.display()))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let static_binary =
            |t: &str| t.contains("statically linked") || t.contains("not a dynamic executable");
        if static_binary(&text) || static_binary(&String::from_utf8_lossy(&out.stderr)) {
            continue;
        }
        if !out.status.success() {
            bail!(
                "ldd {}: {}",
                elf.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        for line in text.lines() {
            if line.contains("not found") {
                bail!(
                    "{} needs a library this system lacks: {line}",
                    elf.display()
                );
            }
            // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)` or
            // `/lib64/ld-linux-x86-64.so.2 (0x...)`; the vDSO has no path.
            let path = line
                .split("=>")
                .last()
                .and_then(|rest| rest.split_whitespace().next())
                .filter(|p| p.starts_with('/'));
            if let Some(path) = path {
                libraries.insert(PathBuf::from(path));
            }
        }
    }
    for library in libraries {
        let dest = rootfs.join(library.strip_prefix("/").expect("absolute"));
        fs::create_dir_all(dest.parent().expect("a parent"))?;
        // fs::copy follows the symlinks ldd may print (the loader), so the image gets the file.
        fs::copy(&library, &dest).with_context(|| format!("copying {}", library.display()))?;
    }
    Ok(())
}
