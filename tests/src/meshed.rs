//! A pod meshed by `interceptor run` in the background, as the CLI tests, the demo and the bench
//! run it.
use std::{
    io::{BufRead as _, BufReader, Read as _},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::PodFixture;

/// `run --instance INSTANCE --netns POD --cgroup CGROUP`: what places `interceptor run` on
/// `fixture`'s pod; the caller adds the proxy's flags.
pub fn run_args(fixture: &PodFixture, instance: &str) -> Vec<String> {
    [
        "run",
        "--instance",
        instance,
        "--netns",
        &fixture.pod.path().display().to_string(),
        "--cgroup",
        &fixture.cgroup.path.display().to_string(),
    ]
    .map(String::from)
    .to_vec()
}

/// `interceptor status --json --instance INSTANCE`: the instance's report.
pub fn status(binary: &Path, instance: &str) -> Value {
    let out = Command::new(binary)
        .args(["status", "--json", "--instance", instance])
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", binary.display()));
    assert!(
        out.status.success(),
        "status: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Value = serde_json::from_slice(&out.stdout).expect("status --json is JSON");
    json["instances"][0].clone()
}

/// `interceptor run` in the background. Dropped while it runs, it gets SIGTERM, so it detaches
/// and removes its instance's state (SIGKILL if it has not exited after 5 s).
pub struct Meshed {
    pub child: Child,
    pub instance: String,
    binary: PathBuf,
}

impl Meshed {
    /// Starts `binary` with `args` (a `run` command line for `instance`, see [`run_args`]) and
    /// waits until its status says it runs and lists its pod. Its log goes to `log`; piped, it
    /// is what [`Self::stop`] returns.
    pub fn start(binary: &Path, instance: &str, args: &[String], log: Stdio) -> Self {
        Self::start_with_env(binary, instance, args, &[], log)
    }

    /// [`Self::start`] with `env` added to its environment (e.g. `INTERCEPTOR_KERNEL_FEATURES`,
    /// for the programs of an older kernel).
    pub fn start_with_env(
        binary: &Path,
        instance: &str,
        args: &[String],
        env: &[(&str, &str)],
        log: Stdio,
    ) -> Self {
        let child = Command::new(binary)
            .args(args)
            .envs(env.iter().copied())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", binary.display()));
        let mut meshed = Self {
            child,
            instance: instance.to_owned(),
            binary: binary.to_owned(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let report = meshed.status();
            if report["running"] == true && report["pods"].as_array().is_some_and(|p| !p.is_empty())
            {
                return meshed;
            }
            if let Some(exit) = meshed.child.try_wait().expect("wait for interceptor run") {
                let mut log = String::new();
                if let Some(stderr) = meshed.child.stderr.as_mut() {
                    stderr.read_to_string(&mut log).ok();
                }
                panic!("interceptor run exited early ({exit}): {log}");
            }
            assert!(
                Instant::now() < deadline,
                "interceptor run did not become ready in 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// This instance's `status --json` report.
    pub fn status(&self) -> Value {
        status(&self.binary, &self.instance)
    }

    /// SIGTERM, then the exit status and the log lines (none unless the log was piped).
    pub fn stop(mut self) -> (ExitStatus, Vec<String>) {
        // SAFETY: signalling our own child, which has not been waited for.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().expect("wait for interceptor run");
        let logs = self
            .child
            .stderr
            .take()
            .map(|stderr| {
                BufReader::new(stderr)
                    .lines()
                    .map_while(Result::ok)
                    .collect()
            })
            .unwrap_or_default();
        (status, logs)
    }
}

impl Drop for Meshed {
    fn drop(&mut self) {
        // Already waited for (stopped or killed): its pid may be another process's by now.
        if !matches!(self.child.try_wait(), Ok(None)) {
            return;
        }
        // SAFETY: signalling our own child, still running.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
