//! The eBPF backend, driven in-process through the same library calls `interceptor run` makes.
use std::sync::{
    Arc, Mutex,
    atomic::{AtomicBool, Ordering},
};

use interceptor::{
    config::InterceptionConfig,
    ebpf::{EbpfPods, LoadOptions},
    netns::PodNetns,
    node::Wanted,
};

use crate::{Netns, PodFixture, scenario::Backend};

pub struct Ebpf;

impl Backend for Ebpf {
    fn attach(&self, fixture: &PodFixture, config: &InterceptionConfig) -> Box<dyn std::any::Any> {
        let mut node = load(options());
        register(&mut node, &fixture.pod, config);
        attach(&mut node, &fixture.cgroup.path);
        Box::new(node)
    }

    fn inbound_keeps_local_address(&self) -> bool {
        true
    }
}

/// Default options with a pin directory of this test's own (the node removes it when dropped).
pub fn options() -> LoadOptions {
    let bpffs = std::path::Path::new(interceptor::state::BPFFS_ROOT);
    interceptor::state::ensure_bpffs(bpffs).expect("a bpffs on /sys/fs/bpf");
    LoadOptions::new(
        bpffs
            .join("interceptor-tests")
            .join(crate::unique_name("pins")),
    )
}

/// The node's programs and maps, with an empty pod table.
pub fn load(options: LoadOptions) -> EbpfPods {
    EbpfPods::load(options).unwrap_or_else(|e| panic!("load eBPF: {e}"))
}

/// Registers the pod, as `interceptor run` does; returns its netns cookie.
pub fn register(
    node: &mut EbpfPods,
    netns: &Netns,
    config: &InterceptionConfig,
) -> interceptor_common::NetnsCookie {
    let path = netns.path();
    let pod = PodNetns::open(&path).expect("open pod netns");
    let (cookie, local) = pod
        .cookie_and_local()
        .expect("netns cookie, pod addresses and local routes");
    let wanted = Wanted {
        netns: &pod,
        config,
        host_ids: pod
            .users()
            .expect("the pod's user namespace")
            .host_ids(config)
            .unwrap_or_else(|e| panic!("{e}")),
        local: &local,
    };
    node.add(cookie, &path, &wanted, ())
        .unwrap_or_else(|e| panic!("register pod: {e}"));
    cookie
}

pub fn attach(node: &mut EbpfPods, cgroup: &std::path::Path) {
    node.attach(cgroup)
        .unwrap_or_else(|e| panic!("attach: {e}"));
}

/// A connect4 program of someone else's, as another product would load it.
pub fn foreign_program() -> std::os::fd::OwnedFd {
    use interceptor_sys::{ProgLoad, bpf_attach_type, bpf_prog_type, insn};
    let insns = [insn(0xb7, 0, 0, 0, 1), insn(0x95, 0, 0, 0, 0)];
    interceptor_sys::prog_load(&ProgLoad {
        prog_type: bpf_prog_type::BPF_PROG_TYPE_CGROUP_SOCK_ADDR,
        expected_attach_type: Some(bpf_attach_type::BPF_CGROUP_INET4_CONNECT),
        name: "foreign_allow",
        insns: &insns,
        license: c"GPL",
    })
    .expect("load the foreign program")
}

/// The eBPF backend as `interceptor run` (or the node agent) keeps pods: it follows each pod's
/// addresses and local routes by netlink events (`PodNetns::local_changes`) and puts what
/// changed in force (`set_local`), so a route added after a pod is meshed is learnt. Stops
/// following and detaches when dropped.
pub struct Following {
    node: Arc<Mutex<EbpfPods>>,
    cookies: Vec<interceptor_common::NetnsCookie>,
    stop: Arc<AtomicBool>,
    watchers: Vec<std::thread::JoinHandle<()>>,
}

impl Following {
    /// One node for `pods`, its programs attached to the first pod's cgroup (where the others'
    /// processes run too, as pods share a node's cgroup).
    pub fn attach(pods: &[(&PodFixture, &InterceptionConfig)]) -> Self {
        let mut node = load(options());
        let cookies: Vec<_> = pods
            .iter()
            .map(|(fixture, config)| register(&mut node, &fixture.pod, config))
            .collect();
        attach(&mut node, &pods[0].0.cgroup.path);
        let node = Arc::new(Mutex::new(node));
        let stop = Arc::new(AtomicBool::new(false));
        let watchers = pods
            .iter()
            .zip(&cookies)
            .map(|((fixture, _), cookie)| {
                let netns = PodNetns::open(&fixture.pod.path()).expect("open pod netns");
                let changes = netns
                    .local_changes()
                    .unwrap_or_else(|e| panic!("follow the pod's addresses and routes: {e}"));
                let (node, stop, cookie) = (Arc::clone(&node), Arc::clone(&stop), *cookie);
                std::thread::spawn(move || follow(&netns, changes, &node, cookie, &stop))
            })
            .collect();
        Self {
            node,
            cookies,
            stop,
            watchers,
        }
    }

    /// The `local` routes the entry of the `index`th pod holds now.
    pub fn local_routes(&self, index: usize) -> Vec<ipnet::IpNet> {
        let node = self.node.lock().expect("the node's lock");
        node.get(self.cookies[index])
            .map(|entry| entry.pod.local.routes.clone())
            .unwrap_or_default()
    }
}

/// `interceptor run`'s loop: on every event, the namespace's addresses and local routes again.
fn follow(
    netns: &PodNetns,
    mut changes: interceptor::netns::LocalChanges,
    node: &Mutex<EbpfPods>,
    cookie: interceptor_common::NetnsCookie,
    stop: &AtomicBool,
) {
    use interceptor::netns::Change;
    use std::os::fd::{AsFd as _, AsRawFd as _};
    while !stop.load(Ordering::Relaxed) {
        let mut pollfd = libc::pollfd {
            fd: changes.as_fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; a tenth of a second, to see `stop` soon after it is set.
        if unsafe { libc::poll(&mut pollfd, 1, 100) } != 1 {
            continue;
        }
        match changes.wait() {
            Ok(Change::Local | Change::Lost) => {}
            Ok(Change::Other) => continue,
            Err(_) => return,
        }
        let local = netns
            .local_destinations()
            .unwrap_or_else(|e| panic!("the pod's addresses and local routes: {e}"));
        node.lock()
            .expect("the node's lock")
            .set_local(cookie, &local)
            .unwrap_or_else(|e| panic!("set the pod's addresses and local routes: {e}"));
    }
}

impl Drop for Following {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for watcher in self.watchers.drain(..) {
            if watcher.join().is_err() && !std::thread::panicking() {
                panic!("following a pod's addresses and routes failed (its panic is above)");
            }
        }
    }
}
