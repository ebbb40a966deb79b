//! Builds the eBPF object (interceptor-ebpf, nightly, bpfel-unknown-none) and leaves it in
//! OUT_DIR for `include_bytes_aligned!`.
use std::{path::PathBuf, time::SystemTime};

use anyhow::{Context as _, bail};
use aya_build::{Package, Toolchain};

/// The nightly the eBPF programs are tested with (xtask/src/setup.rs's `TESTED_NIGHTLY`).
const TESTED_NIGHTLY: &str = "nightly-2026-05-19";
const EBPF_TOOLCHAIN_VAR: &str = "INTERCEPTOR_EBPF_TOOLCHAIN";

fn main() -> anyhow::Result<()> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let ebpf_dir = manifest_dir.join("../interceptor-ebpf");
    let ebpf_dir = ebpf_dir.to_str().context("non-UTF-8 workspace path")?;
    println!("cargo:rerun-if-changed=../interceptor-common/src");

    // `nightly` unless INTERCEPTOR_EBPF_TOOLCHAIN names another (xtask/src/setup.rs).
    println!("cargo:rerun-if-env-changed={EBPF_TOOLCHAIN_VAR}");
    let custom = std::env::var(EBPF_TOOLCHAIN_VAR).ok();
    let toolchain = custom
        .as_deref()
        .map_or(Toolchain::Nightly, Toolchain::Custom);

    let started = SystemTime::now();
    aya_build::build_ebpf(
        [Package {
            name: "interceptor-ebpf",
            root_dir: ebpf_dir,
            ..Default::default()
        }],
        toolchain,
    )
    .with_context(|| {
        format!(
            "building the eBPF programs with the {} toolchain failed: run `cargo xtask setup` \
             (rust-src, bpf-linker). They are tested with {TESTED_NIGHTLY} (they use \
             core_intrinsics, which nightlies change): if yours is another, `rustup toolchain \
             install {TESTED_NIGHTLY} --component rust-src` and build with \
             {EBPF_TOOLCHAIN_VAR}={TESTED_NIGHTLY}, after `cargo xtask setup` with it set",
            custom.as_deref().unwrap_or("nightly")
        )
    })?;

    // aya-build only forwards compiler output as warnings; make sure a fresh object exists so a
    // failed eBPF build can never ship a stale one.
    let object = PathBuf::from(std::env::var("OUT_DIR")?).join("interceptor-ebpf");
    let modified = std::fs::metadata(&object)
        .and_then(|m| m.modified())
        .with_context(|| format!("eBPF object {} was not produced", object.display()))?;
    if modified < started {
        bail!(
            "eBPF object {} is stale: the eBPF build did not produce it",
            object.display()
        );
    }
    Ok(())
}
