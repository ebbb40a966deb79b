//! Reading a test binary's log (libtest's output), and reporting the matrix: a table on the
//! terminal and `target/kernels/results.json`, from which the README's supported-kernels table
//! is made.

use std::{fmt::Write as _, path::Path};

use anyhow::Context as _;
use serde::Serialize;

use super::plan::Expectation;

/// What one run of one test binary on one kernel gave.
#[derive(Serialize)]
pub struct RunReport {
    pub run: String,
    pub binary: String,
    pub features: &'static str,
    /// `pass`, `informative` or `impossible`.
    pub expectation: &'static str,
    /// Why a run is informative or impossible on this kernel.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
    pub ran: bool,
    pub passed: u32,
    pub failed: u32,
    pub ignored: u32,
    /// Tests that failed, or never finished (`timed out`), each with the first lines of why.
    pub failures: Vec<Failure>,
    /// How long the binary ran in the guest.
    pub secs: u64,
    /// Set when the binary did not run to its end (killed at its timeout, guest stopped).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub incomplete: Option<String>,
    /// The binary's `variant:` lines (kernel_support: which program variants load).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub variants: Vec<String>,
}

#[derive(Serialize)]
pub struct Failure {
    pub test: String,
    pub why: String,
}

#[derive(Serialize)]
pub struct KernelReport {
    pub series: &'static str,
    pub package: String,
    pub version: String,
    pub suite: String,
    pub release: String,
    /// Boot, every run, power-off.
    pub guest_secs: u64,
    pub runs: Vec<RunReport>,
}

impl RunReport {
    pub fn not_run(
        run: String,
        binary: &str,
        features: &'static str,
        expectation: &Expectation,
    ) -> Self {
        let (label, reason) = describe(expectation);
        Self {
            run,
            binary: binary.to_owned(),
            features,
            expectation: label,
            reason,
            ran: false,
            secs: 0,
            passed: 0,
            failed: 0,
            ignored: 0,
            failures: Vec::new(),
            incomplete: None,
            variants: Vec::new(),
        }
    }

    /// A run from its log, given the tests it was to run (`--list`) and its exit status.
    pub fn with_log(
        mut self,
        log: &str,
        listed: &[String],
        status: Option<i32>,
        secs: u64,
    ) -> Self {
        self.ran = true;
        self.secs = secs;
        let mut finished = Vec::new();
        for line in log.lines() {
            if let Some(rest) = line.strip_prefix("test ") {
                let Some((name, outcome)) = rest.rsplit_once(" ... ") else {
                    continue;
                };
                finished.push(name.to_owned());
                match outcome.trim() {
                    "ok" => self.passed += 1,
                    outcome if outcome.starts_with("ignored") => self.ignored += 1,
                    _ => {
                        self.failed += 1;
                        self.failures.push(Failure {
                            test: name.to_owned(),
                            why: why_it_failed(log, name),
                        });
                    }
                }
            } else if line.starts_with("variant:") {
                self.variants.push(line.to_owned());
            }
        }
        let summary = log.lines().any(|line| line.starts_with("test result: "));
        if !summary {
            self.incomplete = Some(match status {
                Some(137) => "killed at its timeout".to_owned(),
                Some(code) => format!("exited with status {code} before its summary"),
                None => "the guest stopped before it ended".to_owned(),
            });
            for test in listed.iter().filter(|t| !finished.contains(t)) {
                self.failed += 1;
                self.failures.push(Failure {
                    test: test.clone(),
                    why: "did not finish".to_owned(),
                });
            }
            if listed.is_empty() {
                self.failed += 1;
            }
        }
        self
    }

    /// Whether this run breaks the matrix: an expected pass that failed.
    pub fn is_failure(&self) -> bool {
        self.expectation == "pass" && self.ran && (self.failed > 0 || self.incomplete.is_some())
    }
}

pub fn describe(expectation: &Expectation) -> (&'static str, Option<&'static str>) {
    match expectation {
        Expectation::Pass => ("pass", None),
        Expectation::Informative(reason) => ("informative", Some(reason)),
        Expectation::Impossible(reason) => ("impossible", Some(reason)),
    }
}

/// Why a test failed, from libtest's `---- <test> stdout ----` section: the panic's first
/// lines and, for a program the verifier rejected, the verifier's verdict (the line before its
/// `verification time` line) rather than the whole log.
fn why_it_failed(log: &str, test: &str) -> String {
    let header = format!("---- {test} stdout ----");
    let Some(start) = log.find(&header) else {
        return String::new();
    };
    let section: Vec<&str> = log[start + header.len()..]
        .lines()
        .take_while(|line| !line.starts_with("---- ") && !line.starts_with("note: run with"))
        .filter(|line| !line.trim().is_empty())
        .collect();
    let verdict = section
        .iter()
        .position(|line| line.starts_with("verification time"))
        .and_then(|at| at.checked_sub(1))
        .map(|at| section[at]);
    let mut why: Vec<&str> = section
        .iter()
        .take(if verdict.is_some() { 2 } else { 8 })
        .copied()
        .collect();
    why.extend(verdict);
    why.join("\n")
}

/// The table at the end of the output: kernel, run, counts.
pub fn table(kernels: &[KernelReport]) -> String {
    let mut out = String::from("\nkernel matrix:\n");
    let _ = writeln!(
        out,
        "{:<22} {:<58} {:>6} {:>6} {:>7} {:>5}  note",
        "kernel", "test binary", "passed", "failed", "ignored", "secs"
    );
    for kernel in kernels {
        let name = format!("{} ({}s)", kernel.release, kernel.guest_secs);
        for run in &kernel.runs {
            let note = match (run.expectation, &run.incomplete) {
                ("impossible", _) => "not run: impossible on this kernel".to_owned(),
                ("informative", _) => "informative: failures expected".to_owned(),
                (_, Some(why)) => why.clone(),
                _ if run.failed > 0 => "FAILED".to_owned(),
                _ => String::new(),
            };
            let _ = writeln!(
                out,
                "{name:<22} {:<58} {:>6} {:>6} {:>7} {:>5}  {note}",
                run.run, run.passed, run.failed, run.ignored, run.secs
            );
        }
    }
    out
}

pub fn write_json(kernels: &[KernelReport], file: &Path) -> anyhow::Result<()> {
    let json = serde_json::to_string_pretty(&serde_json::json!({ "kernels": kernels }))?;
    std::fs::write(file, json + "\n").with_context(|| format!("could not write {}", file.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> RunReport {
        RunReport::not_run("x".into(), "x", "native", &Expectation::Pass)
    }

    #[test]
    fn a_finished_log_gives_counts_and_why_tests_failed() {
        let log = "running 3 tests\ntest a ... ok\ntest b ... FAILED\ntest c ... ignored, slow\nvariant: connect4 cmpxchg loaded\n\nfailures:\n\n---- b stdout ----\nthread 'b' panicked at tests/tests/x.rs:3:5:\nverifier: R1 unbounded memory access\nnote: run with `RUST_BACKTRACE=1`\n\ntest result: FAILED. 1 passed; 1 failed; 1 ignored; 0 measured; 0 filtered out\n";
        let run = report().with_log(log, &[], Some(101), 1);
        assert_eq!((run.passed, run.failed, run.ignored), (1, 1, 1));
        assert_eq!(run.failures[0].test, "b");
        assert!(run.failures[0].why.contains("unbounded memory access"));
        let verifier = "---- v stdout ----\nthread 'v' panicked at x.rs:1:1:\nload eBPF: loading program p\n0: (bf) r6 = r1\n461: (71) r3 = *(u8 *)(r4 +536)\nR4 unbounded memory access, make sure to bounds check any such access\nverification time 21923 usec\nstack depth 88\n\n";
        assert_eq!(
            why_it_failed(verifier, "v"),
            "thread 'v' panicked at x.rs:1:1:\nload eBPF: loading program p\nR4 unbounded memory access, make sure to bounds check any such access"
        );
        assert_eq!(run.variants, ["variant: connect4 cmpxchg loaded"]);
        assert!(run.incomplete.is_none() && run.is_failure());
    }

    #[test]
    fn a_killed_run_fails_the_tests_it_never_finished() {
        let listed = ["a".to_owned(), "b".to_owned()];
        let run = report().with_log("running 2 tests\ntest a ... ok\n", &listed, Some(137), 1);
        assert_eq!((run.passed, run.failed), (1, 1));
        assert_eq!(run.failures[0].test, "b");
        assert_eq!(run.incomplete.as_deref(), Some("killed at its timeout"));
    }
}
