//! The kill tests' crash points reach the binaries the tests run, and only those: the
//! `failpoints` feature is a dev-dependency's (tests/Cargo.toml), so test builds have it and a
//! `cargo build` never does (`cargo xtask test` checks the release builds and the image's
//! binaries for the same strings: xtask/src/crash_points.rs).
use interceptor::crash_points::{FAULTS, POINTS};

#[test]
fn the_binary_under_test_has_every_crash_point_and_fault() {
    let path = env!("CARGO_BIN_EXE_interceptor-under-test");
    let binary = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let has = |marker: &str| binary.windows(marker.len()).any(|w| w == marker.as_bytes());
    for marker in POINTS
        .iter()
        .chain(FAULTS)
        .chain(&["FAILPOINTS", "killing the agent"])
    {
        assert!(has(marker), "{marker:?} is not in {path}");
    }
}
