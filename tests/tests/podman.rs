//! A real container runtime: podman with its CNI network backend, whose network's conflist
//! chains the plugin after the reference bridge. The container's very first connect is
//! intercepted: the CNI ADD, which registers its namespace with the agent, runs before any of
//! its processes.
//!
//! Network safety: the bridge has no gateway address and the containers no route beyond their
//! subnet, so a connect that is not intercepted fails at once inside the container.
use std::{
    path::Path,
    time::{Duration, Instant},
};

use interceptor_tests::{
    PodFixture, Probe, agent_home::AgentHome, podman::Podman, privileged, scenario::PROXY_UID,
};

#[test]
fn a_podman_containers_first_connect_is_intercepted() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("podman");
    let home = AgentHome::new(&fixture.cgroup.path);
    let _agent = home.agent().start();
    let mut podman = Podman::new(&home, &fixture.cgroup.path);
    // The app's first connect waits until the test has started the proxy in its namespace (a
    // proxy container would be there from the start).
    let id = podman.run(
        "app",
        "while [ ! -e /signal/proxy-ready ]; do sleep 0.1; done; nc 192.0.2.2 1404 </dev/null; echo rc=$?",
    );
    let netns = podman.ok(&[
        "inspect",
        &id,
        "--format",
        "{{.NetworkSettings.SandboxKey}}",
    ]);
    let pods = home.pods();
    assert_eq!(
        pods.len(),
        1,
        "ADD registered the container's namespace: {pods:#?}"
    );
    assert_eq!(pods[0]["netns"], netns);
    assert_eq!(pods[0]["meta"]["name"], "app");

    let _proxy = Probe::new()
        .netns(Path::new(&netns))
        .cgroup(&fixture.cgroup.path)
        .uid(PROXY_UID)
        .listen(&["proxy", "127.0.0.1:4140", "--name", "outbound"]);
    std::fs::write(podman.signal_dir().join("proxy-ready"), b"").unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let logs = loop {
        let logs = podman.ok(&["logs", &id]);
        if logs.contains("rc=") {
            break logs;
        }
        assert!(Instant::now() < deadline, "the app did not finish: {logs}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        logs.contains("who=proxy:outbound orig=192.0.2.2:1404 ") && logs.contains("rc=0"),
        "the container's first connect reached the proxy with its original destination: {logs}"
    );

    // Removing the container runs CNI DEL: the pod leaves the agent.
    podman.remove("app");
    assert!(home.pods().is_empty(), "{:#?}", home.pods());
}
