//! The test kit, used by the integration tests in `tests/`, the demo and the bench
//! (`src/bin/`): uniquely named network namespaces, cgroups and pod processes, an agent of its
//! own, `interceptor run` in the background, a stand-in Kubernetes API server, a containerd node
//! and podman, each removed when dropped, so tests run in parallel and can be rerun after a crash.
//!
//! Failures panic with a message that says what failed: the tests need that, and the programs
//! turn it into an error line (see [`program`]).
//!
//! Network safety: every address used here lives inside namespaces these fixtures create. A pod
//! namespace has no route out of them, so a connect to anything else (192.0.2.0/24) can only
//! succeed by being intercepted.
pub mod agent_home;
pub mod chart;
pub mod cni_installer;
pub mod cni_network;
pub mod cni_node;
pub mod command;
pub mod containerd;
pub mod ebpf_backend;
pub mod fake_api;
pub mod fixture;
pub mod iptables_backend;
pub mod linkerd_check;
pub mod meshed;
pub mod node_image;
pub mod podman;
pub mod probe;
pub mod program;
pub mod proxy_init;
pub mod random;
pub mod scenario;
pub mod sockets;

pub use fixture::{Cgroup, Netns, PodFixture};
pub use probe::{Landing, Probe};

/// Whether the running privileged test can run. Without root it is skipped with a message,
/// unless `INTERCEPTOR_REQUIRE_PRIVILEGED=1` (set by `cargo xtask test` and CI), which turns
/// every skip into a failure: a green run must mean the kernel was exercised. The message names
/// the test from its thread, so a helper several tests share names the one that called it.
pub fn privileged() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    let test = test_name();
    if std::env::var("INTERCEPTOR_REQUIRE_PRIVILEGED").is_ok_and(|v| v == "1") {
        panic!("{test}: needs root, and INTERCEPTOR_REQUIRE_PRIVILEGED=1 forbids skipping it");
    }
    eprintln!("SKIPPED {test}: needs root (set INTERCEPTOR_REQUIRE_PRIVILEGED=1 to fail instead)");
    false
}

/// The running test's name: libtest runs each test on a thread named after it (its path in the
/// test binary, e.g. `ebpf::ipv4::loopback_is_exempt`). A thread it did not name, or the main
/// thread of a program, is "this test".
fn test_name() -> String {
    match std::thread::current().name() {
        Some(name) if name != "main" => name.to_owned(),
        _ => "this test".to_owned(),
    }
}

/// A name unique across parallel tests and reruns: tag, process id, counter.
pub fn unique_name(tag: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "icpt-{tag}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Polls `done` until it holds, for up to `within`, and fails naming `what` if it never does.
#[track_caller]
pub fn eventually(what: &str, within: std::time::Duration, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + within;
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {within:?}: {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Polls `read` until it returns `expected`, for up to 30 s (the kernel tests also run in slow
/// emulated guests), then asserts with the last value read. For what the kernel does after the
/// call that caused it returns, e.g. a map entry removed when a peer's close is processed.
#[track_caller]
pub fn eventually_eq<T: PartialEq + std::fmt::Debug>(
    what: &str,
    expected: T,
    mut read: impl FnMut() -> T,
) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let value = read();
        if value == expected || std::time::Instant::now() > deadline {
            assert_eq!(value, expected, "{what} (after waiting up to 30 s)");
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_test_name_is_the_running_tests() {
        let name = super::test_name();
        assert!(
            name.ends_with("the_test_name_is_the_running_tests"),
            "{name}"
        );
    }

    #[test]
    fn a_thread_libtest_did_not_name_is_this_test() {
        let name = std::thread::spawn(super::test_name).join().unwrap();
        assert_eq!(name, "this test");
    }
}
