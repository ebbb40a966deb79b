//! What a program can fail to do: the rare failures that keep it from doing its job for one
//! socket. Decisions, the per-connection work, are counted instead.

/// A failure.
#[derive(Clone, Copy)]
pub enum Error {
    /// connect4/connect6 redirected a connect but could not record its original destination:
    /// the proxy's `SO_ORIGINAL_DST` finds nothing and the proxy refuses the connection.
    OrigDstNotRecorded,
    /// sock_ops could not index a redirected connection under the tuple the proxy sees: the
    /// same outcome.
    OrigDstNotIndexed,
    /// sock_ops could not ask for the state changes of a redirected connection's proxy-side
    /// socket: its original destination stays until evicted instead of going when it closes.
    CloseNotWatched,
    /// getsockopt found no TCP socket behind a TCP socket: the original destination is not
    /// answered.
    NoTcpSock,
    /// sock_ops could not remember the proxy's inbound listener: inbound connections to the pod
    /// are refused until the proxy listens again.
    ListenerNotRemembered,
    /// sk_lookup would steer a connection to the proxy, but the proxy has no inbound listener:
    /// the connection is refused.
    NoListener,
}
