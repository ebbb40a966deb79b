//! Named points on the agent's write paths where the kill tests crash it with SIGKILL, to check
//! that every state a crash can leave behind restarts into a consistent one; and named faults
//! the fault tests make happen at a boundary with the kernel (a netlink dump that fails), to
//! check the agent fails closed.
//!
//! Built only with the `failpoints` feature (the tests crate turns it on) and armed with the
//! `fail` crate's `FAILPOINTS` variable: `FAILPOINTS='pod-switched=2*off->return'` lets the point
//! pass twice and kills the process the third time. Without the feature a point is nothing.

/// Crashes the process here when the kill tests armed this point.
macro_rules! crash_point {
    ($name:literal) => {
        #[cfg(feature = "failpoints")]
        if fail::eval($name, |_| ()).is_some() {
            $crate::crash_points::crash($name);
        }
    };
}
pub(crate) use crash_point;

/// Whether the fault tests armed the fault `$name` here (`FAILPOINTS='netns-route-dump-fails=return'`):
/// the caller then fails as the kernel would have. Always false without the feature.
macro_rules! fault {
    ($name:literal) => {{
        #[cfg(feature = "failpoints")]
        let armed = fail::eval($name, |_| ()).is_some();
        #[cfg(not(feature = "failpoints"))]
        let armed = false;
        armed
    }};
}
pub(crate) use fault;

/// The error the fault tests armed the fault `$name` to fail with here, as the kernel would
/// have failed (`FAILPOINTS='pod-map-update-fails=return(ENOMEM)'`: see [`errno`]). Always
/// `None` without the feature.
macro_rules! fault_error {
    ($name:literal) => {{
        #[cfg(feature = "failpoints")]
        let error = fail::eval($name, $crate::crash_points::errno);
        #[cfg(not(feature = "failpoints"))]
        let error: Option<std::io::Error> = None;
        error
    }};
}
pub(crate) use fault_error;

/// Every point, for the tests.
pub const POINTS: &[&str] = &[
    "pod-inbound-attached",
    "pod-entries-written",
    "pod-switched",
    "pod-config-removed",
    "pod-inbound-detached",
    "addresses-written",
    "agent-before-record",
    "agent-before-record-removal",
    "restore-pod",
    "migration-built",
    "migration-switched",
];

/// Every fault, for the tests.
pub const FAULTS: &[&str] = &[
    "netns-address-dump-fails",
    "netns-route-dump-fails",
    "netns-dump-unknown-message",
    "userns-id-maps-unreadable",
    // Armed as `sleep(MS)`: a registration waits between reading the pod's namespace and
    // writing it, the window a change made then must not fall into.
    "registration-after-read",
    // Armed as `return(ERRNO)`: the pod map's update fails as the kernel fails it (`E2BIG` or
    // `ENOSPC`: the map is full; `ENOMEM`).
    "pod-map-update-fails",
    // Armed as `return(ERRNO)`: writing a pod's record fails (`ENOSPC`, `EROFS`).
    "pod-record-write-fails",
];

/// Reads `FAILPOINTS` once, at start-up. The configuration lives as long as the process.
pub fn arm() {
    #[cfg(feature = "failpoints")]
    std::mem::forget(fail::FailScenario::setup());
}

/// The error a fault armed as `return(ERRNO)` fails with: `E2BIG`, `ENOSPC`, `ENOMEM` or
/// `EROFS`; `EIO` for anything else.
#[cfg(feature = "failpoints")]
pub fn errno(name: Option<String>) -> std::io::Error {
    let errno = match name.as_deref() {
        Some("E2BIG") => libc::E2BIG,
        Some("ENOSPC") => libc::ENOSPC,
        Some("ENOMEM") => libc::ENOMEM,
        Some("EROFS") => libc::EROFS,
        _ => libc::EIO,
    };
    std::io::Error::from_raw_os_error(errno)
}

/// SIGKILL to ourselves: no destructor, no flush, as when the node kills the agent.
#[cfg(feature = "failpoints")]
pub fn crash(point: &str) -> ! {
    eprintln!("crash point {point}: killing the agent");
    let _ = nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGKILL);
    std::process::abort()
}
