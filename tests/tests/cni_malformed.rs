//! A node's CNI configuration is written by other programs and may be malformed. `interceptor cni
//! install`, `cni uninstall` and the watching installer read it as input: each refuses a file it
//! cannot change with an error naming the file and what is wrong (never a panic, exit code 101),
//! and leaves every file as it was. The watching installer logs it and keeps watching.
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use interceptor_tests::{cni_network::chained, unique_name};
use serde_json::json;

const INTERCEPTOR: &str = env!("CARGO_BIN_EXE_interceptor-under-test");
const PLUGIN: &str = env!("CARGO_BIN_EXE_interceptor-cni-under-test");

/// The node files no installer can change, as the installer's own tests run them.
use interceptor_test_cases::malformed_cases::MALFORMED;

/// A node's conf and bin directories holding `file` with `text`, as an earlier install left
/// them: our binary, the primary's, and the state of a `.conf` converted (so uninstall has
/// everything to get wrong).
struct Node {
    root: PathBuf,
    conf_dir: PathBuf,
    bin_dir: PathBuf,
    file: PathBuf,
}

impl Node {
    fn new(file: &str, text: &str) -> Self {
        let root = std::env::temp_dir().join(unique_name("cnimalformed"));
        let (conf_dir, bin_dir) = (root.join("net.d"), root.join("bin"));
        std::fs::create_dir_all(&conf_dir).unwrap();
        std::fs::create_dir_all(&bin_dir).unwrap();
        for binary in ["loopback", "interceptor-cni"] {
            std::fs::write(bin_dir.join(binary), b"#!/bin/false\n").unwrap();
        }
        std::fs::write(
            conf_dir.join(".interceptor-cni-install.json"),
            json!({ "converted_from": "10-net.conf" }).to_string(),
        )
        .unwrap();
        let file = conf_dir.join(file);
        std::fs::write(&file, text).unwrap();
        Self {
            root,
            conf_dir,
            bin_dir,
            file,
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(INTERCEPTOR);
        command
            .arg("cni")
            .args(args)
            .arg("--conf-dir")
            .arg(&self.conf_dir)
            .arg("--bin-dir")
            .arg(&self.bin_dir);
        command
    }

    fn install(&self, extra: &[&str]) -> Command {
        let mut install = self.command(&["install", "--plugin", PLUGIN]);
        install
            .args(extra)
            .arg("--agent-socket")
            .arg(self.root.join("agent.sock"));
        install
    }

    /// Every file under the node's conf and bin directories, with its bytes.
    fn snapshot(&self) -> Vec<(PathBuf, Vec<u8>)> {
        fn walk(dir: &Path, files: &mut Vec<(PathBuf, Vec<u8>)>) {
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    walk(&path, files);
                } else {
                    files.push((path.clone(), std::fs::read(&path).unwrap()));
                }
            }
        }
        let mut files = Vec::new();
        walk(&self.conf_dir, &mut files);
        walk(&self.bin_dir, &mut files);
        files.sort();
        files
    }

    /// Asserts that a command refused this node's file: exit code 1 (not a panic's 101), an
    /// error naming the file and `reason`, no panic message.
    fn assert_refused(&self, what: &str, code: Option<i32>, log: &str, reason: &str) {
        assert_eq!(code, Some(1), "{what}: exit code (101 is a panic): {log}");
        assert!(!log.contains("panicked"), "{what}: {log}");
        for expected in [&self.file.display().to_string(), reason, "left as it is"] {
            assert!(log.contains(expected), "{what}: {expected:?} not in {log}");
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// A watching installer, killed when the test ends early.
struct Watching(Child);

impl Drop for Watching {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn run(mut command: Command) -> Output {
    command.stdin(Stdio::null()).output().unwrap()
}

#[test]
fn install_and_uninstall_refuse_a_malformed_configuration_and_leave_it_as_it_is() {
    for (file, text, reason) in MALFORMED {
        let node = Node::new(file, text);
        let before = node.snapshot();
        for (what, command) in [
            ("cni install", node.install(&[])),
            ("cni uninstall", node.command(&["uninstall"])),
        ] {
            let out = run(command);
            let what = format!("{what} of {file} {text:?}");
            node.assert_refused(
                &what,
                out.status.code(),
                &String::from_utf8_lossy(&out.stderr),
                reason,
            );
            assert_eq!(node.snapshot(), before, "{what} changed a file");
        }
    }
}

/// The watching installer logs the malformed file and keeps watching without chaining into it;
/// once the primary CNI writes a valid file, it chains. Stopped while the file is malformed, it
/// refuses to uninstall with the same error and leaves everything as it is.
#[test]
fn the_watching_installer_logs_a_malformed_configuration_and_keeps_watching() {
    let watched: Vec<_> = MALFORMED
        .iter()
        .map(|(file, text, reason)| {
            let node = Node::new(file, text);
            let log = node.root.join("install.log");
            let watching = Watching(
                node.install(&["--watch", "--check-ms", "100"])
                    .stdout(Stdio::null())
                    .stderr(std::fs::File::create(&log).unwrap())
                    .spawn()
                    .unwrap(),
            );
            let before = node.snapshot();
            (node, log, watching, before, *text, *reason)
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    for (i, (node, log, mut watching, before, text, reason)) in watched.into_iter().enumerate() {
        let watching = &mut watching.0;
        let logged = || std::fs::read_to_string(&log).unwrap();
        assert!(
            watching.try_wait().unwrap().is_none(),
            "{text:?}: the watching installer exited: {}",
            logged()
        );
        let logs = logged();
        assert!(
            logs.contains(&node.file.display().to_string()) && logs.contains(reason),
            "{text:?}: {reason:?} not in {logs}"
        );
        assert!(!logs.contains("panicked"), "{logs}");
        assert_eq!(
            node.snapshot(),
            before,
            "{text:?}: the watch changed a file"
        );
        if i % 2 == 0 {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(watching.id() as i32, libc::SIGTERM) };
            let status = watching.wait().unwrap();
            node.assert_refused(
                &format!("stopping the watch on {text:?}"),
                status.code(),
                &logged(),
                reason,
            );
            assert_eq!(node.snapshot(), before, "{text:?}: stopping changed a file");
            continue;
        }
        // The primary CNI writes its file again, valid this time.
        let primary = node.conf_dir.join("10-net.conflist");
        let valid = json!({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "loopback"}]});
        std::fs::remove_file(&node.file).unwrap();
        std::fs::write(&primary, valid.to_string()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while chained(&primary) != 1 {
            assert!(
                Instant::now() < deadline,
                "{text:?}: not chained once the file is valid: {}",
                logged()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // SAFETY: signalling our own child.
        unsafe { libc::kill(watching.id() as i32, libc::SIGTERM) };
        assert!(watching.wait().unwrap().success(), "{}", logged());
    }
}
