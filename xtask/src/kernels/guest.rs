//! One guest per kernel: virtme-ng boots it under QEMU's software emulation with the host's
//! root shared read-only over 9p, and a script runs the test binaries in place, one after
//! another, each into a log file of a directory shared read-write. `vng` loses the guest's
//! exit status, so the script records each run's status in a file the host reads.

use std::{
    ffi::OsString,
    fmt::Write as _,
    fs,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::Context as _;

use super::fetch::Kernel;

/// One test binary invocation in the guest.
#[derive(Clone)]
pub struct GuestCommand {
    /// File-name-safe name of its log: `<dir>/<slug>.log`.
    pub slug: String,
    pub binary: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(&'static str, String)>,
    /// Killed after this long, so one hung test cannot eat the matrix's budget.
    pub timeout: Duration,
}

/// How each command ended, by slug: its exit status (`None` if the guest never got to it) and
/// how long it ran.
pub struct GuestResult {
    pub statuses: Vec<(String, Option<i32>, u64)>,
    pub elapsed: Duration,
    /// Whether the host stopped the guest at its deadline: it stopped reporting (the kernel
    /// wedged), as a test that hangs is killed in the guest by its own timeout and reported.
    pub stopped_at_deadline: bool,
    /// What happened to guests booted before the one these statuses are from, one line each.
    pub earlier_attempts: Vec<String>,
}

/// Guest size: measured fastest for two host cores (see docs/testing.md, "Kernel matrix").
const CPUS: &str = "2";
const MEMORY: &str = "4G";
/// Booting and powering off a guest, on top of its commands' timeouts.
const BOOT_ALLOWANCE: Duration = Duration::from_secs(180);

/// A guest whose kernel never reached the script: it crashed or hung while booting, before any
/// test ran.
#[derive(Debug)]
pub struct NeverBooted {
    pub release: String,
    pub console: PathBuf,
}

impl std::fmt::Display for NeverBooted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the {} guest never ran its script: see {}",
            self.release,
            self.console.display()
        )
    }
}

impl std::error::Error for NeverBooted {}

/// [`run`], booting a second guest when the first never reached its script. Under software
/// emulation a kernel can die while booting, before anything of ours runs: 7.3 took the int3 of
/// a code patch as an Oops in `sched_clock_cpu` in two boots of one stop's runs and booted in
/// the nine after them. No test ran in such a guest, so booting another hides no failure; a guest
/// that ran its script is never booted again, whatever its tests did. The first boot's console
/// is kept beside the run's directory and named in both lines.
pub fn run_booted(
    vng_bin: &Path,
    path: &OsString,
    kernel: &Kernel,
    commands: &[GuestCommand],
    dir: &Path,
) -> anyhow::Result<GuestResult> {
    let mut result = match run(vng_bin, path, kernel, commands, dir) {
        Ok(result) => result,
        // Any other error is the caller's.
        Err(e) => {
            let first = e.downcast::<NeverBooted>()?;
            let kept = keep_console(&first.console, dir, "first-boot")?;
            eprintln!(
                "kernels: {}; booting a second guest (first console kept in {})",
                first,
                kept.display()
            );
            let mut second = run(vng_bin, path, kernel, commands, dir).with_context(|| {
                format!(
                    "the second guest too (the first one's console: {})",
                    kept.display()
                )
            })?;
            second.earlier_attempts.push(format!(
                "a first guest never ran its script (console: {})",
                kept.display()
            ));
            return Ok(second);
        }
    };
    rerun_after_a_wedge(vng_bin, path, kernel, commands, dir, &mut result)?;
    Ok(result)
}

/// A guest the host stopped at its deadline with commands it never reported wedged (under
/// software emulation: an RCU stall, and no output after it; twice in eight clean-clone runs):
/// a fresh guest runs those commands once more, into the same logs, and both attempts are
/// reported. A command that reported, passed or failed, is never run again; nor is anything of a
/// guest that stopped on its own (a panic is a failure, never a wedge).
fn rerun_after_a_wedge(
    vng_bin: &Path,
    path: &OsString,
    kernel: &Kernel,
    commands: &[GuestCommand],
    dir: &Path,
    result: &mut GuestResult,
) -> anyhow::Result<()> {
    let unreported: Vec<GuestCommand> = commands
        .iter()
        .filter(|c| {
            result
                .statuses
                .iter()
                .any(|(slug, status, _)| *slug == c.slug && status.is_none())
        })
        .cloned()
        .collect();
    if !result.stopped_at_deadline || unreported.is_empty() {
        return Ok(());
    }
    let console = dir.join("console.log");
    let stall = fs::read_to_string(&console)
        .unwrap_or_default()
        .lines()
        .find(|line| line.contains("rcu") && line.contains("stall"))
        .map(|line| format!(" ({})", line.trim()))
        .unwrap_or_default();
    let kept = keep_console(&console, dir, "wedged")?;
    let slugs: Vec<&str> = unreported.iter().map(|c| c.slug.as_str()).collect();
    let attempt = format!(
        "the first guest wedged{stall} after {} of {} commands and was stopped at its deadline; a fresh guest ran {} (first console: {})",
        commands.len() - unreported.len(),
        commands.len(),
        slugs.join(", "),
        kept.display()
    );
    eprintln!("kernels: {}: {attempt}", kernel.release);
    // The wedged guest's partial logs stay beside the new ones.
    for c in &unreported {
        let log = dir.join(format!("{}.log", c.slug));
        if log.exists() {
            let _ = fs::rename(&log, dir.join(format!("{}.wedged.log", c.slug)));
        }
    }
    let second_dir = dir.with_file_name(format!(
        "{}.after-wedge",
        dir.file_name().unwrap_or_default().to_string_lossy()
    ));
    let second = run(vng_bin, path, kernel, &unreported, &second_dir)
        .with_context(|| format!("the fresh guest after a wedged one ({attempt})"))?;
    for (slug, status, secs) in second.statuses {
        let from = second_dir.join(format!("{slug}.log"));
        let _ = fs::copy(&from, dir.join(format!("{slug}.log")));
        if let Some(entry) = result.statuses.iter_mut().find(|(s, _, _)| *s == slug) {
            *entry = (slug, status, secs);
        }
    }
    result.elapsed += second.elapsed;
    result.earlier_attempts.push(attempt);
    if second.stopped_at_deadline {
        result
            .earlier_attempts
            .push("the fresh guest was stopped at its deadline too".to_owned());
    }
    Ok(())
}

/// Keeps a guest's console beside the run's directory, as `<dir>.<what>-console.log`.
fn keep_console(console: &Path, dir: &Path, what: &str) -> anyhow::Result<PathBuf> {
    let kept = dir.with_file_name(format!(
        "{}.{what}-console.log",
        dir.file_name().unwrap_or_default().to_string_lossy()
    ));
    fs::copy(console, &kept).with_context(|| format!("keeping {}", console.display()))?;
    Ok(kept)
}

/// Boots `kernel` and runs `commands` in it; their logs go to `dir` (emptied first).
pub fn run(
    vng_bin: &Path,
    path: &OsString,
    kernel: &Kernel,
    commands: &[GuestCommand],
    dir: &Path,
) -> anyhow::Result<GuestResult> {
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir).with_context(|| format!("could not create {}", dir.display()))?;
    let script = dir.join("guest.sh");
    fs::write(&script, script_text(commands, dir))
        .with_context(|| format!("could not write {}", script.display()))?;

    let log = fs::File::create(dir.join("console.log")).context("creating the console log")?;
    // vng finds its helpers (virtme-run) on PATH.
    let path = crate::setup::path_with_dir(vng_bin, path)?;
    let started = Instant::now();
    let mut vng = Command::new(vng_bin.join("vng"))
        .arg("--run")
        .arg(&kernel.vmlinuz)
        // /dev/kvm here is kvm-pvm, which stock kernels cannot run on: software emulation.
        .args([
            "--disable-kvm",
            "--force-9p",
            // The guest kernel's console in console.log: a guest that stops mid-run (a panic)
            // leaves its reason there.
            "--verbose",
            "--memory",
            MEMORY,
            "--cpus",
            CPUS,
        ])
        .arg(format!("--rwdir={}", dir.display()))
        .arg("--exec")
        .arg(format!("sh {}", script.display()))
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // vng runs QEMU through a shell and virtme-run: a group of their own lets a guest that
        // overruns be stopped whole.
        .process_group(0)
        .spawn()
        .context("could not start vng (virtme-ng)")?;
    let deadline = BOOT_ALLOWANCE + commands.iter().map(|c| c.timeout).sum::<Duration>();
    let mut stopped_at_deadline = false;
    loop {
        if vng.try_wait()?.is_some() {
            break;
        }
        if started.elapsed() > deadline {
            eprintln!(
                "kernels: {} did not power off within {deadline:?}: stopping it",
                kernel.release
            );
            let group = i32::try_from(vng.id()).expect("pids fit in i32");
            // SAFETY: kill has no memory preconditions; the group is the one vng leads.
            unsafe { libc::kill(-group, libc::SIGKILL) };
            let _ = vng.wait();
            stopped_at_deadline = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let elapsed = started.elapsed();

    let recorded = fs::read_to_string(dir.join("status")).unwrap_or_default();
    let statuses = commands
        .iter()
        .map(|c| {
            let ended = recorded.lines().find_map(|line| {
                let mut fields = line.split_whitespace();
                (fields.next()? == c.slug).then_some(())?;
                let code = fields.next()?.parse().ok()?;
                Some((code, fields.next()?.parse().ok()?))
            });
            (
                c.slug.clone(),
                ended.map(|(code, _)| code),
                ended.map_or(0, |(_, secs)| secs),
            )
        })
        .collect::<Vec<_>>();
    if !dir.join("ready").exists() {
        return Err(NeverBooted {
            release: kernel.release.clone(),
            console: dir.join("console.log"),
        }
        .into());
    }
    Ok(GuestResult {
        statuses,
        elapsed,
        stopped_at_deadline,
        earlier_attempts: Vec::new(),
    })
}

/// The guest's script: the mounts the tests need (the host's are not shared), then each
/// command with its status recorded.
fn script_text(commands: &[GuestCommand], dir: &Path) -> String {
    let dir = dir.display();
    let mut script = format!(
        "\
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
grep -q ' - cgroup2 ' /proc/self/mountinfo || {{ mkdir -p /sys/fs/cgroup && mount -t cgroup2 cgroup2 /sys/fs/cgroup; }}
mkdir -p /run/netns
ulimit -n 65536
uname -r > {dir}/ready
"
    );
    for c in commands {
        let env: String = c
            .env
            .iter()
            .map(|(name, value)| format!("{name}={} ", quote(value)))
            .collect();
        let args: String = c.args.iter().map(|a| format!(" {}", quote(a))).collect();
        let _ = writeln!(
            script,
            "start=$(date +%s); env {env}timeout -s KILL {secs} {binary}{args} > {dir}/{slug}.log 2>&1; echo \"{slug} $? $(($(date +%s) - start))\" >> {dir}/status",
            secs = c.timeout.as_secs(),
            binary = quote(&c.binary.display().to_string()),
            slug = c.slug,
        );
    }
    script
}

fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}
