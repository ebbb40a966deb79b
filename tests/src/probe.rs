//! Running `netprobe` (the pod's app, proxy and servers) and reading what it saw.
use std::{
    io::{BufRead as _, BufReader},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

/// Where the `netprobe` binary of this package is (see [`sibling_binary`]).
pub fn netprobe_path() -> PathBuf {
    sibling_binary("netprobe")
}

/// A binary built with this package (its own, or `interceptor`): beside the running program,
/// which is a test binary in the profile's `deps/` folder or one of the package's binaries (the
/// demo, the bench) in the profile's folder itself.
pub fn sibling_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the running program's path");
    let dir = exe.parent().expect("the program's folder");
    let dir = if dir.ends_with("deps") {
        dir.parent().expect("the profile's folder")
    } else {
        dir
    };
    dir.join(name)
}

/// A netprobe invocation: where it runs (netns, cgroup, credentials) and what it does.
#[derive(Clone, Default)]
pub struct Probe {
    context: Vec<String>,
}

impl Probe {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn netns(mut self, path: &Path) -> Self {
        self.context
            .extend(["--netns".into(), path.display().to_string()]);
        self
    }

    pub fn cgroup(mut self, path: &Path) -> Self {
        self.context
            .extend(["--cgroup".into(), path.display().to_string()]);
        self
    }

    pub fn uid(mut self, uid: u32) -> Self {
        self.context.extend(["--uid".into(), uid.to_string()]);
        self
    }

    pub fn gid(mut self, gid: u32) -> Self {
        self.context.extend(["--gid".into(), gid.to_string()]);
        self
    }

    /// Supplementary groups (none unless given).
    pub fn groups(mut self, groups: &[u32]) -> Self {
        let list: Vec<String> = groups.iter().map(u32::to_string).collect();
        self.context.extend(["--groups".into(), list.join(",")]);
        self
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(netprobe_path());
        cmd.args(&self.context).args(args);
        cmd
    }

    /// Starts a listener (`proxy ADDR ...` or `server ADDR ...`) and waits until it listens.
    pub fn listen(&self, args: &[&str]) -> Listener {
        let mut child = self
            .command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn netprobe");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().expect("stdout"))
            .read_line(&mut line)
            .ok();
        if line.trim() != "ready" {
            let _ = child.kill();
            let out = child.wait_with_output().expect("netprobe output");
            panic!(
                "netprobe {args:?} did not start: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Listener { child }
    }

    /// Runs a command to completion and returns its stdout lines.
    pub fn run(&self, args: &[&str]) -> Vec<String> {
        succeeded(args, self.command(args).output().expect("run netprobe"))
    }

    /// Runs a command to completion with `input` on its stdin; returns its stdout lines.
    pub fn run_with_input(&self, args: &[&str], input: &str) -> Vec<String> {
        use std::io::Write as _;
        let mut child = self
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn netprobe");
        // Written from a thread: the child's output could fill its pipe before it reads all.
        let mut stdin = child.stdin.take().expect("stdin");
        let input = input.to_owned();
        let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
        let out = child.wait_with_output().expect("netprobe output");
        let _ = writer.join();
        succeeded(args, out)
    }

    /// One connection, kept open until [`Held::peer_now`] asks about it again.
    pub fn hold(&self, target: &str) -> Held {
        let mut child = self
            .command(&["hold", target])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn netprobe");
        let mut line = String::new();
        // The first line only: the rest is read once stdin closes.
        let stdout = child.stdout.as_mut().expect("stdout");
        let mut byte = [0u8; 1];
        while std::io::Read::read(stdout, &mut byte).unwrap_or(0) == 1 && byte[0] != b'\n' {
            line.push(char::from(byte[0]));
        }
        Held { child, line }
    }

    /// One connection: where it landed.
    pub fn connect(&self, target: &str) -> Landing {
        self.connect_with(target, &[])
    }

    pub fn connect_with(&self, target: &str, extra: &[&str]) -> Landing {
        self.connect_seen(target, extra).0
    }

    /// One connection: where it landed, and what the app's socket reports as its peer
    /// (`getpeername()`), when it connected.
    pub fn connect_seen(&self, target: &str, extra: &[&str]) -> (Landing, Option<String>) {
        let mut args = vec!["connect", target];
        args.extend_from_slice(extra);
        let lines = self.run(&args);
        let line = lines.first().map_or("", String::as_str);
        let app_peer = line
            .split(' ')
            .find_map(|kv| kv.strip_prefix("app_peer="))
            .map(str::to_owned);
        (Landing::parse(line), app_peer)
    }
}

/// A connection [`Probe::hold`] keeps open.
pub struct Held {
    child: Child,
    /// The peer's line with the app's `getpeername()` (`app_peer=`), as it connected.
    pub line: String,
}

impl Held {
    /// Where it landed when it connected.
    pub fn landing(&self) -> Landing {
        Landing::parse(&self.line)
    }

    /// Closes the probe's stdin: it asks `getpeername()` again, on the connection still open,
    /// and exits. Returns that answer.
    pub fn peer_now(mut self) -> String {
        drop(self.child.stdin.take());
        let out = self.child.wait_with_output().expect("netprobe hold output");
        let stdout = String::from_utf8_lossy(&out.stdout);
        stdout
            .lines()
            .find_map(|l| l.strip_prefix("app_peer_after="))
            .unwrap_or_else(|| {
                panic!(
                    "netprobe hold: no app_peer_after= in {stdout:?}: {}",
                    String::from_utf8_lossy(&out.stderr)
                )
            })
            .to_owned()
    }
}

/// A running listener, killed on drop.
pub struct Listener {
    child: Child,
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where a connection ended up, as reported by the peer that answered it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Landing {
    /// A proxy answered; `orig` is what its SO_ORIGINAL_DST returned (`Err(errno)` on failure,
    /// `Err(0)` for a proxy started with `--no-orig`, which does not ask).
    Proxy {
        name: String,
        orig: Result<SocketAddr, i32>,
        peer: String,
        local: String,
    },
    /// A plain server answered.
    Server {
        name: String,
        peer: String,
        local: String,
    },
    /// The connection failed (e.g. `connect:ENETUNREACH`).
    Failed(String),
}

impl Landing {
    pub fn parse(line: &str) -> Self {
        if let Some(error) = line.strip_prefix("error=") {
            return Self::Failed(error.to_owned());
        }
        let field = |key: &str| {
            line.split(' ')
                .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
                .unwrap_or_else(|| panic!("no {key} in {line:?}"))
                .to_owned()
        };
        let who = field("who");
        let (role, name) = who
            .split_once(':')
            .unwrap_or_else(|| panic!("bad who in {line:?}"));
        match role {
            "proxy" => {
                let orig = field("orig");
                let orig = match orig.strip_prefix("errno:") {
                    _ if orig == "-" => Err(0),
                    Some(errno) => Err(errno.parse().expect("errno")),
                    None => Ok(orig
                        .parse()
                        .unwrap_or_else(|_| panic!("bad orig in {line:?}"))),
                };
                Self::Proxy {
                    name: name.into(),
                    orig,
                    peer: field("peer"),
                    local: field("local"),
                }
            }
            "server" => Self::Server {
                name: name.into(),
                peer: field("peer"),
                local: field("local"),
            },
            _ => panic!("unknown role in {line:?}"),
        }
    }

    /// The original destination a proxy saw, or panics with what happened instead.
    pub fn proxy_orig(&self) -> SocketAddr {
        match self {
            Self::Proxy { orig: Ok(orig), .. } => *orig,
            other => {
                panic!("expected to land on the proxy with an original destination, got {other:?}")
            }
        }
    }

    pub fn server_name(&self) -> &str {
        match self {
            Self::Server { name, .. } => name,
            other => panic!("expected to reach a real server, got {other:?}"),
        }
    }
}

/// The stdout lines of a netprobe command that must have succeeded.
fn succeeded(args: &[&str], out: std::process::Output) -> Vec<String> {
    assert!(
        out.status.success(),
        "netprobe {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}
