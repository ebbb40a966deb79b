//! What a probe's connection came to, in the terms the backends must agree on.
use std::net::SocketAddr;

/// Where the connection landed and what the app saw of its peer. Only what the contract fixes:
/// not the local address of an inbound proxy's socket (sk_lookup keeps the original, REDIRECT
/// rewrites it to the proxy port) nor the source an outbound proxy sees (the proxy reads the
/// original destination, not the source, of the app's connection).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// `proxy:NAME orig=...`, `server:NAME local=... from=IP` or `error=...`.
    pub landing: String,
    /// The app's `getpeername()` once connected.
    pub app_peer: Option<String>,
    /// ... and after the peer closed its side (end of stream).
    pub app_peer_after: Option<String>,
}

impl Outcome {
    /// From a line of `netprobe probes`.
    pub fn parse(line: &str) -> Self {
        if line.starts_with("error=") {
            return Self {
                landing: line.to_owned(),
                app_peer: None,
                app_peer_after: None,
            };
        }
        let field = |key: &str| {
            line.split(' ')
                .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
                .map(str::to_owned)
        };
        let get = |key: &str| field(key).unwrap_or_else(|| "?".into());
        // The client's address, without its ephemeral port.
        let from = field("peer")
            .and_then(|p| p.parse::<SocketAddr>().ok())
            .map_or_else(|| "?".into(), |p| p.ip().to_canonical().to_string());
        let who = get("who");
        let landing = match who.as_str() {
            "proxy:outbound" => format!("{who} orig={}", get("orig")),
            "proxy:inbound" => format!("{who} orig={} from={from}", get("orig")),
            _ => format!("{who} local={} from={from}", get("local")),
        };
        Self {
            landing,
            app_peer: field("app_peer"),
            app_peer_after: field("app_peer_after"),
        }
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.landing)?;
        if let Some(peer) = &self.app_peer {
            write!(f, ", app's getpeername {peer}")?;
        }
        if let Some(after) = &self.app_peer_after {
            write!(f, ", after the peer's close {after}")?;
        }
        Ok(())
    }
}
