//! The agent never trusts a pin: what it finds pinned at its link and map paths is checked
//! against what it was asked to do. A link attached to another cgroup is moved (the new
//! attachment first), a defunct one replaced, a pod's sk_lookup link moved back to its namespace,
//! and anything that is not ours refused and left alone. Every test runs its own agent on its own
//! state directory, bpffs directory and cgroups, and asserts no connection around the proxy.
use std::{
    fs::File,
    os::{
        fd::{AsFd as _, OwnedFd},
        unix::fs::MetadataExt as _,
    },
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use interceptor_sys::{LinkTarget, bpf_attach_type, bpf_map_type};
use interceptor_tests::{
    Cgroup, Landing, Netns, PodFixture, Probe,
    agent_home::{AgentHome, UNREACHABLE, all_reached_the_proxy, check_load},
    ebpf_backend::foreign_program,
    privileged,
    scenario::{APP_UID, Servers},
};

/// The node's cgroup links.
const NODE_LINKS: [&str; 6] = [
    "link_icpt_connect4",
    "link_icpt_connect6",
    "link_icpt_sockops",
    "link_icpt_getsockopt",
    "link_icpt_peername4",
    "link_icpt_peername6",
];

fn pinned(path: &Path) -> OwnedFd {
    interceptor_sys::obj_get(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
        .unwrap_or_else(|| panic!("nothing pinned at {}", path.display()))
}

fn link_target(path: &Path) -> LinkTarget {
    interceptor_sys::link_info(pinned(path).as_fd())
        .unwrap()
        .target
}

fn inode(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().ino()
}

/// Waits (bounded) until `done`: the kernel releases a removed cgroup's or namespace's
/// attachments asynchronously.
fn eventually(what: &str, done: impl FnMut() -> bool) {
    interceptor_tests::eventually(what, Duration::from_secs(15), done);
}

/// The pod's app, in `cgroup`.
fn app_in(fixture: &PodFixture, cgroup: &Path) -> Probe {
    Probe::new()
        .netns(&fixture.pod.path())
        .cgroup(cgroup)
        .uid(APP_UID)
}

fn intercepted(app: &Probe) -> bool {
    matches!(app.connect(UNREACHABLE), Landing::Proxy { orig: Ok(orig), .. } if orig.to_string() == UNREACHABLE)
}

/// A kubelet whose cgroup changed: the agent is killed and restarted with `--cgroup` set to a
/// cgroup inside the old one. The pinned links still attached to the old cgroup are moved, the
/// new attachment made first: the app load, in the new cgroup (so covered by both), never reaches
/// its destination around the proxy; afterwards the old cgroup's own processes no longer run our
/// programs, and the log says what moved from where to where.
#[test]
fn a_restart_with_another_cgroup_moves_the_links_there_first() {
    if !privileged() {
        return;
    }
    let mut fixture = PodFixture::new("pinsmove");
    let old = Cgroup::new_in(&fixture.cgroup.path, "old");
    let new = Cgroup::new_in(&old.path, "new");
    // The proxy too: its SO_ORIGINAL_DST is answered by our getsockopt program.
    fixture.set_processes_cgroup(&new.path);
    let _servers = Servers::start(&fixture);
    let mut home = AgentHome::new(&old.path);
    let agent = home.agent().meshing(&fixture.pod.path(), &[]).start();
    let (in_old, in_new) = (app_in(&fixture, &old.path), app_in(&fixture, &new.path));
    for app in [&in_old, &in_new] {
        assert_eq!(
            app.connect(UNREACHABLE).proxy_orig().to_string(),
            UNREACHABLE,
            "before"
        );
    }
    agent.kill();

    home.cgroup = new.path.clone();
    let log = home.log_path();
    let (lines, agent) = std::thread::scope(|s| {
        // Longer than the agent's start with its links moved, also on a busy machine (3 s
        // ended first there once).
        let load = s.spawn(|| check_load(&in_new, "6"));
        std::thread::sleep(Duration::from_millis(300));
        let agent = home.agent().log_to(&log).start();
        assert!(!load.is_finished(), "the load outlasts the switch");
        (load.join().expect("load"), agent)
    });
    all_reached_the_proxy(&lines);
    assert!(intercepted(&in_new), "an app in the new cgroup");
    assert_eq!(
        in_old.connect(UNREACHABLE),
        Landing::Failed("connect:ECONNREFUSED".into()),
        "the old cgroup's own processes are no longer intercepted"
    );
    for name in NODE_LINKS {
        assert_eq!(
            link_target(&home.bpffs.join(name)),
            LinkTarget::Cgroup {
                id: inode(&new.path)
            },
            "{name}"
        );
    }
    let old_cgroup = File::open(&old.path).unwrap();
    eventually("the old cgroup runs none of our programs", || {
        interceptor_sys::prog_query(
            old_cgroup.as_fd(),
            bpf_attach_type::BPF_CGROUP_INET4_CONNECT,
        )
        .unwrap()
        .is_empty()
    });
    agent.stop();
    let log = std::fs::read_to_string(&log).unwrap();
    let moved = log
        .lines()
        .find(|l| l.contains("moved a pinned link") && l.contains("link_icpt_connect4"))
        .unwrap_or_else(|| panic!("no line says the link moved:\n{log}"));
    assert!(
        moved.contains(&old.path.display().to_string())
            && moved.contains(&new.path.display().to_string()),
        "the line names both cgroups: {moved}"
    );
}

/// The cgroup the pinned links were attached to is removed while no agent runs: the links are
/// defunct, and the next agent (another `--cgroup`) replaces them and starts, also removing a
/// temporary pin of ours that a crash in the middle of a replacement would leave.
#[test]
fn a_restart_after_the_old_cgroup_was_removed_replaces_the_defunct_links() {
    if !privileged() {
        return;
    }
    let mut fixture = PodFixture::new("pinsdefunct");
    let old = Cgroup::new_in(&fixture.cgroup.path, "old");
    let new = Cgroup::new_in(&fixture.cgroup.path, "new");
    fixture.set_processes_cgroup(&new.path);
    let _servers = Servers::start(&fixture);
    let mut home = AgentHome::new(&old.path);
    let agent = home.agent().meshing(&fixture.pod.path(), &[]).start();
    agent.kill();
    let connect4 = home.bpffs.join("link_icpt_connect4");
    let leftover = home.bpffs.join("link_icpt_connect4_new");
    interceptor_sys::obj_pin(pinned(&connect4).as_fd(), &leftover).unwrap();
    drop(old);
    eventually("the links are defunct", || {
        link_target(&connect4) == LinkTarget::Cgroup { id: 0 }
    });

    home.cgroup = new.path.clone();
    let _agent = home.agent().start();
    let app = app_in(&fixture, &new.path);
    all_reached_the_proxy(&check_load(&app, "1"));
    for name in NODE_LINKS {
        assert_eq!(
            link_target(&home.bpffs.join(name)),
            LinkTarget::Cgroup {
                id: inode(&new.path)
            },
            "{name}"
        );
    }
    assert!(!leftover.exists(), "the temporary pin is removed");
}

/// `interceptor daemon` on `home`, which must fail: its stderr.
fn daemon_fails(home: &AgentHome) -> String {
    // Killed on drop if it started after all.
    let mut agent = home.agent().log(Stdio::piped()).spawn();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = agent.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the agent started");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success(), "the agent exits non-zero");
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut agent.child.stderr.take().unwrap(), &mut stderr).unwrap();
    stderr
}

/// Something that is not ours where the agent pins a link or a map: the agent refuses to start,
/// names the path and says what to do, and leaves the object pinned.
#[test]
fn foreign_objects_at_our_pin_paths_are_refused_and_left_alone() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("pinsforeign");
    let cgroup = File::open(&fixture.cgroup.path).unwrap();
    let program = foreign_program();
    let foreign_link = interceptor_sys::link_create(
        program.as_fd(),
        cgroup.as_fd(),
        bpf_attach_type::BPF_CGROUP_INET4_CONNECT,
    )
    .unwrap();
    let map = interceptor_sys::map_create(bpf_map_type::BPF_MAP_TYPE_HASH, 4, 4, 1, "foreign_map")
        .unwrap();
    let pods_map = format!("maps-v{}/ICPT_PODS", interceptor_common::MAP_LAYOUT_VERSION);
    let cases: [(&str, &OwnedFd, &str); 3] = [
        ("link_icpt_connect4", &map, "a bpf map"),
        ("link_icpt_connect4", &foreign_link, "foreign_allow"),
        (&pods_map, &map, "foreign_map"),
    ];
    for (at, object, found) in cases {
        let home = AgentHome::new(&fixture.cgroup.path);
        let path = home.bpffs.join(at);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        interceptor_sys::obj_pin(object.as_fd(), &path).unwrap();
        let stderr = daemon_fails(&home);
        for part in [&path.display().to_string(), found, "another --bpffs"] {
            assert!(stderr.contains(part), "{at}: {part} not in {stderr}");
        }
        let still = pinned(&path);
        assert_eq!(
            interceptor_sys::object_kind(still.as_fd()).unwrap(),
            interceptor_sys::object_kind(object.as_fd()).unwrap(),
            "{at}: still pinned"
        );
        std::fs::remove_file(&path).unwrap();
    }
}

/// Pins, in place of the link at `path`, a link of the same program attached to `netns`; the
/// old link is released.
fn repin_to(path: &Path, netns: &Path) {
    let old = pinned(path);
    let info = interceptor_sys::link_info(old.as_fd()).unwrap();
    let program = interceptor_sys::prog_fd_by_id(info.prog_id).unwrap();
    let netns = File::open(netns).unwrap();
    let link = interceptor_sys::link_create(
        program.as_fd(),
        netns.as_fd(),
        bpf_attach_type::BPF_SK_LOOKUP,
    )
    .unwrap();
    std::fs::remove_file(path).unwrap();
    interceptor_sys::obj_pin(link.as_fd(), path).unwrap();
}

/// A pod's sk_lookup link found attached to another namespace, then one found defunct (its
/// namespace gone): restoring the pod puts a link on the pod's own namespace both times.
#[test]
fn a_pods_sk_lookup_link_attached_elsewhere_or_defunct_is_replaced_on_restore() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("pinspod");
    let _servers = Servers::start(&fixture);
    let home = AgentHome::new(&fixture.cgroup.path);
    let agent = home.agent().meshing(&fixture.pod.path(), &[]).start();
    let cookie = home.pods()[0]["netns_cookie"].as_u64().unwrap();
    let path: PathBuf = home.bpffs.join(format!("link_icpt_sk_lookup_{cookie}"));
    let pod_netns = LinkTarget::Netns {
        inode: inode(&fixture.pod.path()) as u32,
    };
    assert_eq!(link_target(&path), pod_netns);
    let app = app_in(&fixture, &fixture.cgroup.path);
    let restored = |when: &str| {
        assert_eq!(link_target(&path), pod_netns, "{when}");
        let landing = fixture.on_remote().connect("10.77.0.1:80");
        assert!(
            matches!(&landing, Landing::Proxy { name, .. } if name == "inbound"),
            "{when}: {landing:?}"
        );
        all_reached_the_proxy(&check_load(&app, "1"));
    };

    agent.kill();
    let other = Netns::new("pinsother");
    repin_to(&path, &other.path());
    let agent = home.agent().start();
    restored("attached elsewhere");
    let other_ns = File::open(other.path()).unwrap();
    eventually("the other namespace runs none of our programs", || {
        interceptor_sys::prog_query(other_ns.as_fd(), bpf_attach_type::BPF_SK_LOOKUP)
            .unwrap()
            .is_empty()
    });

    agent.kill();
    let doomed = Netns::new("pinsdoomed");
    repin_to(&path, &doomed.path());
    drop(doomed);
    eventually("the link is defunct", || {
        link_target(&path) == LinkTarget::Netns { inode: 0 }
    });
    let _agent = home.agent().start();
    restored("defunct");
}

/// The read-only check `status` uses: nothing wrong where the links were attached, each link
/// attached elsewhere for another cgroup, and a missing link, named.
#[test]
fn link_problems_names_links_missing_or_attached_elsewhere() {
    if !privileged() {
        return;
    }
    use interceptor::ebpf::{EbpfNode, LinkProblem, LoadOptions};
    let parent = Cgroup::new("pinsproblems");
    let (a, b) = (
        Cgroup::new_in(&parent.path, "a"),
        Cgroup::new_in(&parent.path, "b"),
    );
    let dir = Path::new(interceptor::state::BPFFS_ROOT)
        .join("interceptor-tests")
        .join(interceptor_tests::unique_name("problems"));
    let maps = dir.join("maps");
    let mut node: EbpfNode = EbpfNode::load(LoadOptions {
        links_dir: dir.clone(),
        persistent: true,
        ..LoadOptions::new(&maps)
    })
    .unwrap();
    node.attach(&a.path).unwrap();
    assert_eq!(node.link_problems(&a.path), vec![]);

    let elsewhere = node.link_problems(&b.path);
    assert_eq!(elsewhere.len(), NODE_LINKS.len(), "{elsewhere:?}");
    for problem in &elsewhere {
        assert!(
            matches!(problem, LinkProblem::Elsewhere { .. }),
            "{problem}"
        );
        let text = problem.to_string();
        assert!(
            text.contains(&a.path.display().to_string())
                && text.contains(&b.path.display().to_string()),
            "{text}"
        );
    }

    std::fs::remove_file(dir.join("link_icpt_connect6")).unwrap();
    assert_eq!(
        node.link_problems(&a.path),
        vec![LinkProblem::Missing {
            path: dir.join("link_icpt_connect6")
        }]
    );
    drop(node);
    for entry in std::fs::read_dir(&maps).unwrap() {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
    }
    std::fs::remove_dir(&maps).unwrap();
    for entry in std::fs::read_dir(&dir).unwrap() {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
    }
    std::fs::remove_dir(&dir).unwrap();
}

fn link_id(path: &Path) -> u32 {
    interceptor_sys::link_info(pinned(path).as_fd()).unwrap().id
}

/// Pins removed while the agent runs (by hand, by a cleanup script) leave the attachments held by
/// the agent process alone: its periodic check pins the same links again, so interception still
/// outlives the process, as a SIGKILL right after shows.
#[test]
fn pins_removed_while_the_agent_runs_are_pinned_again() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("pinsgone");
    let _servers = Servers::start(&fixture);
    let home = AgentHome::new(&fixture.cgroup.path);
    let agent = home.agent().start();
    home.mesh(&fixture.pod.path(), &[]);
    let cookie = home.pods()[0]["netns_cookie"].as_u64().unwrap();
    let mut links: Vec<PathBuf> = NODE_LINKS.iter().map(|l| home.bpffs.join(l)).collect();
    links.push(home.bpffs.join(format!("link_icpt_sk_lookup_{cookie}")));
    let ids: Vec<u32> = links.iter().map(|l| link_id(l)).collect();

    for link in &links {
        std::fs::remove_file(link).unwrap();
    }
    eventually("the links are pinned again", || {
        links.iter().all(|l| l.exists())
    });
    assert_eq!(
        links.iter().map(|l| link_id(l)).collect::<Vec<_>>(),
        ids,
        "the same links, not new attachments"
    );
    assert_eq!(home.problems(), Vec::<String>::new());

    agent.kill();
    let app = fixture.in_pod().uid(APP_UID);
    assert!(intercepted(&app));
    let landing = fixture.on_remote().connect("10.77.0.1:80");
    assert!(
        matches!(&landing, Landing::Proxy { name, .. } if name == "inbound"),
        "{landing:?}"
    );
}
