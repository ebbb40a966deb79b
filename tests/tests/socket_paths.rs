//! Every socket path an app can open a TCP connection with is intercepted, in every address
//! family, by both backends: blocking and non-blocking connect(2), io_uring's
//! IORING_OP_CONNECT, TCP Fast Open (`sendto(MSG_FASTOPEN)` without a connect(2), and
//! `TCP_FASTOPEN_CONNECT`), and Multipath TCP sockets. The kernel runs the connect4/connect6
//! hooks in the one function the TCP paths go through (`__inet_stream_connect`), and on the first
//! subflow of an MPTCP socket; these tests pin that down. On every path the app's
//! `getpeername()` reports the address it dialled, as with NAT.
use interceptor::iptables::IptablesMode;
use interceptor_tests::{
    PodFixture,
    ebpf_backend::Ebpf,
    iptables_backend::Iptables,
    privileged,
    scenario::{APP_UID, Backend, Family, Servers, linkerd_config},
};

/// An address only interception can reach (the remote refuses it).
const UNREACHABLE: &str = "192.0.2.2:1404";

fn redirected_on_every_backend_and_family(via: &str) {
    if !privileged() {
        return;
    }
    let backends: [(&str, &dyn Backend); 2] = [
        ("ebpf", &Ebpf),
        ("iptables-legacy", &Iptables(IptablesMode::Legacy)),
    ];
    for (name, backend) in backends {
        let fixture = PodFixture::new("via");
        let _servers = Servers::start(&fixture);
        let mut config = linkerd_config();
        config.ipv6 = true;
        let _attached = backend.attach(&fixture, &config);
        let app = fixture.in_pod().uid(APP_UID);
        for family in [Family::Ipv4, Family::Ipv4MappedOnIpv6, Family::Ipv6] {
            let target = family.target(UNREACHABLE);
            let want = match family {
                Family::Ipv6 => target.clone(),
                _ => UNREACHABLE.to_owned(),
            };
            let (landing, app_peer) = app.connect_seen(&target, &["--via", via]);
            assert_eq!(
                landing.proxy_orig().to_string(),
                want,
                "{name}, {family:?}, --via {via}: {landing:?}"
            );
            // And the app sees the address it dialled as its socket's peer, as with NAT.
            let dialled: std::net::SocketAddr = target.parse().unwrap();
            assert_eq!(
                app_peer,
                Some(dialled.to_string()),
                "{name}, {family:?}, --via {via}: getpeername()"
            );
        }
    }
}

#[test]
fn a_blocking_connect_is_redirected() {
    redirected_on_every_backend_and_family("connect");
}

#[test]
fn a_non_blocking_connect_is_redirected() {
    redirected_on_every_backend_and_family("nonblocking");
}

#[test]
fn an_io_uring_connect_is_redirected() {
    redirected_on_every_backend_and_family("io-uring");
}

#[test]
fn a_fast_open_sendto_without_connect_is_redirected() {
    redirected_on_every_backend_and_family("fastopen-sendto");
}

#[test]
fn a_fast_open_connect_is_redirected() {
    redirected_on_every_backend_and_family("fastopen-connect");
}

#[test]
fn a_multipath_tcp_connect_is_redirected() {
    redirected_on_every_backend_and_family("mptcp");
}
