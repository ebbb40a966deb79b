//! `interceptor cni install` as the DaemonSet's `install-cni` container runs it: the real binary
//! against a [`CniNetwork`] of the test's own, its log lines kept as they come, stopped with
//! SIGTERM as the kubelet stops the container (killed if the test ends first).
use std::{
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Arc, Mutex},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

use crate::{agent_home::interceptor_bin, cni_network::CniNetwork, cni_network::plugin_bin};

/// A running installer and its log.
pub struct Installer {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
    reader: Option<JoinHandle<()>>,
}

impl Installer {
    /// Runs `command` (an installer's command line), its standard error kept line by line.
    pub fn spawn(mut command: Command) -> Self {
        let mut child = command
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting the installer");
        let stderr = BufReader::new(child.stderr.take().expect("piped"));
        let log = Arc::new(Mutex::new(Vec::new()));
        let lines = Arc::clone(&log);
        let reader = std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line);
            }
        });
        Self {
            child,
            log,
            reader: Some(reader),
        }
    }

    /// The test build's installer and plugin for `network`, with `extra` arguments. The agent
    /// it tells of restores is at `agent_socket` (a path where none listens sends nothing to
    /// the node's).
    pub fn start(network: &CniNetwork, agent_socket: &Path, extra: &[&str]) -> Self {
        let mut command = network.install(&interceptor_bin(), &plugin_bin(), agent_socket);
        command.args(extra);
        Self::spawn(command)
    }

    /// The whole log so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// The log lines containing every one of `needles`.
    pub fn lines_with(&self, needles: &[&str]) -> usize {
        let log = self.log.lock().unwrap();
        log.iter()
            .filter(|l| needles.iter().all(|n| l.contains(n)))
            .count()
    }

    /// Waits (up to 10 s) until `count` lines contain all of `needles`, and asserts there are
    /// no more.
    pub fn logged(&self, needles: &[&str], count: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.lines_with(needles) < count && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(
            self.lines_with(needles),
            count,
            "lines with {needles:?}:\n{}",
            self.log()
        );
    }

    /// Waits (up to 20 s) for a line containing `needle`.
    pub fn wait_for(&self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.lines_with(&[needle]) == 0 {
            assert!(
                Instant::now() < deadline,
                "never logged {needle:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// For an installer that exits by itself: its exit status and whole log.
    pub fn exited(mut self) -> (ExitStatus, String) {
        let status = self.child.wait().expect("waiting for the installer");
        (status, self.whole_log())
    }

    /// SIGTERM, as the kubelet stops the container: its exit status, how long it took to exit,
    /// and its whole log.
    pub fn terminate(mut self) -> (ExitStatus, Duration, String) {
        let sent = Instant::now();
        kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM).expect("SIGTERM");
        let status = self.child.wait().expect("waiting for the installer");
        let took = sent.elapsed();
        (status, took, self.whole_log())
    }

    /// The log once the installer has exited: every line it wrote.
    fn whole_log(&mut self) -> String {
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        self.log()
    }
}

impl Drop for Installer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
