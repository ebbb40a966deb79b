//! The kill tests' crash points (`interceptor/src/crash_points.rs`, the `failpoints` feature)
//! must never reach a user's binary. Two checks: the binaries the image ships hold none of their
//! names, and the feature resolution of the release builds users run (a root `cargo build
//! --release`; the demo's and the bench's build) leaves the feature off. The second reads what
//! cargo would build (`cargo tree` resolves features as `cargo build` does, dev-dependencies
//! aside) rather than building: a root release build is several minutes of a CI run.

use std::{ffi::OsStr, fs, path::PathBuf};

use anyhow::{Context as _, ensure};

use crate::{cmd, workspace_root};

/// Where the points are named, read here so the check cannot drift from them.
const POINTS_SOURCE: &str = "interceptor/src/crash_points.rs";

/// Strings only a binary built with crash points holds: the `fail` crate's variable that arms
/// them, the message of a crash, and the name of every point and fault.
fn markers() -> anyhow::Result<Vec<String>> {
    let path = workspace_root().join(POINTS_SOURCE);
    let source =
        fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let list = |name| {
        points(&source, name).with_context(|| format!("no {name} list in {}", path.display()))
    };
    Ok(["FAILPOINTS".to_owned(), "killing the agent".to_owned()]
        .into_iter()
        .chain(list("POINTS")?)
        .chain(list("FAULTS")?)
        .collect())
}

/// The string literals of `pub const {name}: &[&str] = &[...];` in `source`.
fn points(source: &str, name: &str) -> Option<Vec<String>> {
    let list = source
        .split_once(&format!("pub const {name}: &[&str] = &["))?
        .1;
    let list = list.split_once("];")?.0;
    let points: Vec<String> = list
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    (!points.is_empty()).then_some(points)
}

/// Fails naming each of `binaries` that holds a crash point's marker.
pub fn check_binaries(binaries: &[PathBuf]) -> anyhow::Result<()> {
    let markers = markers()?;
    for binary in binaries {
        let bytes = fs::read(binary).with_context(|| format!("reading {}", binary.display()))?;
        let found = found_in(&bytes, &markers);
        ensure!(
            found.is_empty(),
            "{} was built with the kill tests' crash points ({}): a user's binary must never be; \
             something turned on interceptor's `failpoints` feature for this build",
            binary.display(),
            found.join(", ")
        );
        println!("no crash points in {}", binary.display());
    }
    Ok(())
}

fn found_in<'a>(bytes: &[u8], markers: &'a [String]) -> Vec<&'a str> {
    markers
        .iter()
        .filter(|m| bytes.windows(m.len()).any(|w| w == m.as_bytes()))
        .map(String::as_str)
        .collect()
}

/// The release builds users run, as cargo arguments selecting their packages.
const USER_BUILDS: &[(&str, &[&str])] = &[
    ("a root `cargo build --release`", &[]),
    (
        "the demo's and the bench's `cargo build --release`",
        crate::kit::DEMO_AND_BENCH_PACKAGES,
    ),
    ("`cargo install --path interceptor`", &["-p", "interceptor"]),
];

/// Fails when a release build users run would turn on the `failpoints` feature.
pub fn check_user_builds(path: &OsStr) -> anyhow::Result<()> {
    for (build, packages) in USER_BUILDS {
        let tree = cmd::output(
            cmd::cargo()
                .current_dir(workspace_root())
                .args(["tree", "--edges", "normal,build", "--prefix", "none"])
                .args(["--format", "{p} [{f}]"])
                .args(*packages)
                .env("PATH", path),
        )?;
        let with: Vec<&str> = tree
            .lines()
            .filter(|line| line.contains("failpoints"))
            .collect();
        ensure!(
            with.is_empty(),
            "{build} would compile the kill tests' crash points in: {}; keep `failpoints` to \
             dev-dependencies (tests/Cargo.toml)",
            with.join("; ")
        );
    }
    println!("no crash points in the release builds users run (cargo tree)");
    Ok(())
}

/// That the markers are in a binary built with crash points: tests/tests/crash_points.rs.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_points_are_read_from_their_source() {
        let markers = markers().unwrap();
        assert!(markers.iter().any(|m| m == "pod-switched"), "{markers:?}");
        assert!(
            markers.iter().any(|m| m == "netns-route-dump-fails"),
            "{markers:?}"
        );
        assert!(markers.len() > 5, "{markers:?}");
        assert_eq!(
            points(
                "pub const POINTS: &[&str] = &[\n    \"a-b\",\n    \"c\",\n];",
                "POINTS"
            ),
            Some(vec!["a-b".to_owned(), "c".to_owned()])
        );
        assert_eq!(points("pub const POINTS: &[&str] = &[];", "POINTS"), None);
    }

    #[test]
    fn a_marker_anywhere_in_the_bytes_is_found() {
        let markers = vec!["FAILPOINTS".to_owned(), "pod-switched".to_owned()];
        assert_eq!(
            found_in(b"\x7fELF..\0pod-switched\0..", &markers),
            ["pod-switched"]
        );
        assert!(found_in(b"\x7fELF..pod-switch", &markers).is_empty());
    }
}
