//! Reading a test binary's log (libtest's output), and reporting the matrix: a table on the
//! terminal and `target/kernels/results.json`, from which the supported-kernels table (docs/kernels.md)
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
    /// `pass`, `impossible` or `covered`.
    pub expectation: &'static str,
    /// Why a run is impossible, or not needed, on this kernel.
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
    /// The binary's `variant:`, `feature:` and `auto:` lines (kernel_support: which features
    /// the probes found, which program variants load, what `--mode auto` picks).
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
    /// Guests booted before the one whose results these are (one that never booted, or one
    /// that wedged and whose unreported commands a fresh guest ran), one line each.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub earlier_attempts: Vec<String>,
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
            } else if ["variant:", "feature:", "auto:"]
                .iter()
                .any(|p| line.starts_with(p))
            {
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
        Expectation::Impossible(reason) => ("impossible", Some(reason)),
        Expectation::Covered(reason) => ("covered", Some(reason)),
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

/// `key=value` of a kernel_support line (values run to the next ` key=`; the last one, `refused`
/// or `why`, to the end of the line).
fn field<'a>(line: &'a str, key: &str) -> &'a str {
    let Some(start) = line.find(&format!(" {key}=")) else {
        return "";
    };
    let value = &line[start + key.len() + 2..];
    if matches!(key, "refused" | "why") {
        return value;
    }
    value.split(' ').next().unwrap_or_default()
}

/// The supported-kernels table (docs/kernels.md), from what kernel_support printed on each kernel (its
/// plain run): the variant each hook runs (the first that loads, in order of preference), the
/// features the probes did not find, and the backend `--mode auto` picks.
pub fn supported_kernels(kernels: &[KernelReport]) -> String {
    let hooks = [
        ("cgroup/connect4", "connect4/6"),
        ("sock_ops", "sock_ops"),
        ("cgroup/getsockopt", "getsockopt"),
        ("sk_lookup,", "sk_lookup"),
    ];
    let mut out = String::from("| kernel | ");
    for (_, name) in hooks {
        let _ = write!(out, "{name} | ");
    }
    out.push_str("kernel lacks | `--mode auto` |\n|---|");
    out.push_str(&"---|".repeat(hooks.len() + 2));
    out.push('\n');
    for kernel in kernels {
        let Some(run) = kernel
            .runs
            .iter()
            .find(|r| r.binary == "kernel_support" && r.features == "native" && r.ran)
        else {
            continue;
        };
        let _ = write!(out, "| {} ({}) | ", kernel.version, kernel.suite);
        for (hook, _) in hooks {
            let runs = run
                .variants
                .iter()
                .filter(|l| l.starts_with("variant:") && field(l, "hook").starts_with(hook))
                .find(|l| field(l, "loads") == "true")
                .map_or("refused", |l| field(l, "variant"));
            let _ = write!(out, "{runs} | ");
        }
        let lacks: Vec<&str> = run
            .variants
            .iter()
            .filter(|l| l.starts_with("feature:") && field(l, "present") == "false")
            .map(|l| field(l, "name"))
            .collect();
        let auto = run
            .variants
            .iter()
            .find(|l| l.starts_with("auto:"))
            .map_or("", |l| field(l, "backend"));
        let _ = writeln!(
            out,
            "{} | {auto} |",
            if lacks.is_empty() {
                "-".to_owned()
            } else {
                lacks.join(", ")
            }
        );
    }
    out
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
        for attempt in &kernel.earlier_attempts {
            let _ = writeln!(out, "{name:<22} {attempt}");
        }
        for run in &kernel.runs {
            let note = match (run.expectation, &run.incomplete) {
                ("impossible", _) => "not run: impossible on this kernel".to_owned(),
                ("covered", _) => "not run in the core here: covered elsewhere".to_owned(),
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
    fn the_supported_kernels_table_shows_the_first_variant_that_loads() {
        let mut run = report().with_log(
            "test a ... ok\n\
             feature: kernel=5.10 name=atomics present=false\n\
             variant: kernel=5.10 hook=cgroup/connect4 program=icpt_connect4 variant=slots loads=false refused=BPF_STX uses reserved fields\n\
             auto: kernel=5.10 backend=iptables taken_away= why=no cookie\n\
             test result: ok. 1 passed; 0 failed\n",
            &[],
            Some(0),
            1,
        );
        run.binary = "kernel_support".into();
        let kernel = KernelReport {
            series: "5.10",
            package: "p".into(),
            version: "5.10.262-1".into(),
            suite: "bullseye-security".into(),
            release: "5.10.0-46-amd64".into(),
            guest_secs: 1,
            earlier_attempts: Vec::new(),
            runs: vec![run],
        };
        let table = supported_kernels(&[kernel]);
        let row = table.lines().nth(2).unwrap();
        assert_eq!(
            row,
            "| 5.10.262-1 (bullseye-security) | refused | refused | refused | refused | atomics | iptables |"
        );
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
