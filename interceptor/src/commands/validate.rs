//! `interceptor validate`: the network validator a mesh runs in a pod before its app starts
//! (what Linkerd's `linkerd-network-validator` does): listen on the outbound proxy port, connect
//! to an address that cannot be reached, and expect to read back a random token that our own
//! listener wrote, which proves the connect was redirected. Exit 0 when it was, 95 when not
//! (Linkerd's repair controller watches for 95), with a one-line reason either way.
use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    time::{Duration, Instant},
};

use anyhow::Context as _;

use crate::cli::ValidateArgs;

/// The exit code of a failed validation, as Linkerd's validator uses it.
pub const NOT_INTERCEPTED: u8 = 95;

pub fn validate(args: ValidateArgs) -> anyhow::Result<()> {
    if let Some(netns) = &args.netns {
        let ns = crate::netns::PodNetns::open(netns)?;
        nix::sched::setns(ns.file(), nix::sched::CloneFlags::CLONE_NEWNET)
            .with_context(|| format!("entering network namespace {}", netns.display()))?;
    }
    let listener = TcpListener::bind(args.listen_addr).with_context(|| {
        format!(
            "listening on {} (the outbound proxy port)",
            args.listen_addr
        )
    })?;
    let token = random_token()?;
    let served = token.clone();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let _ = stream.write_all(served.as_bytes());
        }
    });
    match exchange(args.connect_addr, args.timeout()) {
        Ok(reply) if reply == token => {
            println!(
                "interception works: the connect to {} reached this validator's listener on {}",
                args.connect_addr, args.listen_addr
            );
            Ok(())
        }
        Ok(reply) => fail(&format!(
            "the connect to {} was answered by something else ({} bytes that are not our token): traffic is not redirected to {}",
            args.connect_addr,
            reply.len(),
            args.listen_addr
        )),
        Err(e) => fail(&format!(
            "the connect to {} failed ({e}): traffic is not redirected to {}",
            args.connect_addr, args.listen_addr
        )),
    }
}

fn fail(reason: &str) -> anyhow::Result<()> {
    println!("interception does NOT work: {reason}");
    Err(super::Exit {
        code: NOT_INTERCEPTED,
    }
    .into())
}

fn exchange(target: SocketAddr, timeout: Duration) -> std::io::Result<String> {
    let deadline = Instant::now() + timeout;
    let stream = TcpStream::connect_timeout(&target, timeout)?;
    stream.set_read_timeout(Some(
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1)),
    ))?;
    let mut reply = Vec::new();
    stream.take(64).read_to_end(&mut reply)?;
    Ok(String::from_utf8_lossy(&reply).into_owned())
}

fn random_token() -> anyhow::Result<String> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("reading /dev/urandom")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
