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
    let first = match run(vng_bin, path, kernel, commands, dir) {
        // Any other error is the caller's.
        Err(e) => e.downcast::<NeverBooted>()?,
        ok => return ok,
    };
    let kept = dir.with_file_name(format!("{}.first-boot-console.log", kernel.release));
    fs::copy(&first.console, &kept)
        .with_context(|| format!("keeping {}", first.console.display()))?;
    eprintln!(
        "kernels: {}; booting a second guest (first console kept in {})",
        first,
        kept.display()
    );
    run(vng_bin, path, kernel, commands, dir).with_context(|| {
        format!(
            "the second guest too (the first one's console: {})",
            kept.display()
        )
    })
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
    Ok(GuestResult { statuses, elapsed })
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
