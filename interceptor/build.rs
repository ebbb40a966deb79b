//! Builds the eBPF object (interceptor-ebpf, nightly, bpfel-unknown-none) and leaves it in
//! OUT_DIR for `include_bytes_aligned!`.
use std::{path::PathBuf, time::SystemTime};

use anyhow::{Context as _, bail};
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let ebpf_dir = manifest_dir.join("../interceptor-ebpf");
    let ebpf_dir = ebpf_dir.to_str().context("non-UTF-8 workspace path")?;
    println!("cargo:rerun-if-changed=../interceptor-common/src");

    let started = SystemTime::now();
    aya_build::build_ebpf(
        [Package {
            name: "interceptor-ebpf",
            root_dir: ebpf_dir,
            ..Default::default()
        }],
        Toolchain::default(),
    )
    .context("building the eBPF programs failed: run `cargo xtask setup` (rust-src, bpf-linker)")?;

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
