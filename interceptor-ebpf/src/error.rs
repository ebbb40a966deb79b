//! What a program can fail to do: the rare events worth a log line (aya-log). Decisions, the
//! per-connection work, are counted instead and never logged.
//!
//! The log is off unless userspace turns it on: `AYA_LOG_LEVEL` is a read-only global that the
//! loader sets before loading (0, off, unless the log is wanted), and the verifier then drops
//! the logging code as dead. A connection that succeeds never reaches it either way.
use aya_ebpf::EbpfContext;
use aya_log_ebpf::{debug, warn};

/// A failure, with the pod it happened in (its netns cookie). `errno` is the helper's negative
/// error number.
#[derive(Clone, Copy)]
pub enum Error {
    /// connect4/connect6 redirected a connect but could not record its original destination:
    /// the proxy's `SO_ORIGINAL_DST` finds nothing and the proxy refuses the connection.
    OrigDstNotRecorded { netns_cookie: u64, errno: i32 },
    /// sock_ops could not index a redirected connection under the tuple the proxy sees: the
    /// same outcome.
    OrigDstNotIndexed { netns_cookie: u64, errno: i32 },
    /// sock_ops could not ask for the state changes of a redirected connection's proxy-side
    /// socket: its original destination stays until evicted instead of going when it closes.
    CloseNotWatched { netns_cookie: u64, errno: i32 },
    /// getsockopt found no TCP socket behind a TCP socket: the original destination is not
    /// answered.
    NoTcpSock { netns_cookie: u64 },
    /// sock_ops could not remember the proxy's inbound listener: inbound connections to the pod
    /// are refused until the proxy listens again.
    ListenerNotRemembered { netns_cookie: u64, errno: i32 },
    /// sk_lookup would steer a connection to the proxy, but the proxy has no inbound listener:
    /// the connection is refused.
    NoListener { netns_cookie: u64, port: u32 },
}

impl Error {
    /// Logs it as coming from `program` (its name in `interceptor_common::names`).
    #[inline(always)]
    pub fn log<C: EbpfContext>(self, ctx: &C, program: &'static str) {
        match self {
            Self::OrigDstNotRecorded {
                netns_cookie,
                errno,
            } => warn!(
                ctx,
                target: program,
                "netns {}: redirected a connect whose original destination could not be recorded (error {}): the proxy will refuse it",
                netns_cookie,
                errno
            ),
            Self::OrigDstNotIndexed {
                netns_cookie,
                errno,
            } => warn!(
                ctx,
                target: program,
                "netns {}: the original destination of a redirected connection could not be stored for the proxy (error {}): the proxy will refuse it",
                netns_cookie,
                errno
            ),
            Self::CloseNotWatched {
                netns_cookie,
                errno,
            } => debug!(
                ctx,
                target: program,
                "netns {}: not told when a proxy-side socket closes (error {}): its original destination stays until evicted",
                netns_cookie,
                errno
            ),
            Self::NoTcpSock { netns_cookie } => warn!(
                ctx,
                target: program,
                "netns {}: SO_ORIGINAL_DST on a socket with no TCP state: not answered",
                netns_cookie
            ),
            Self::ListenerNotRemembered {
                netns_cookie,
                errno,
            } => warn!(
                ctx,
                target: program,
                "netns {}: the proxy's inbound listener could not be remembered (error {}): inbound connections will be refused",
                netns_cookie,
                errno
            ),
            Self::NoListener { netns_cookie, port } => warn!(
                ctx,
                target: program,
                "netns {}: inbound connection to port {} refused: the proxy has no inbound listener",
                netns_cookie,
                port
            ),
        }
    }
}
