//! Project tasks, run as `cargo xtask <task>` (an alias in .cargo/config.toml).

mod cmd;
mod crash_points;
mod disk;
mod fuzz;
mod image;
mod kernels;
mod kit;
mod release;
mod setup;
mod test;
mod upgrade;

use std::{ffi::OsString, path::Path, process::ExitCode};

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "Tasks for the interceptor workspace")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what building and testing need beyond the Rust toolchains (nightly rust-src,
    /// bpf-linker, iptables, ip, nsenter). Installs only what is missing.
    Setup,
    /// Run setup, then every test with privileged tests required to run. Needs root.
    Test {
        /// Only the upgrade test (tests/tests/upgrade.rs): the previous release, built from
        /// this repository's history, handing its pods over to this tree's agent and back.
        #[arg(long)]
        upgrade: bool,
        /// Configurations the randomized behaviour table draws (tests/tests/behaviour_random.rs;
        /// 12 when not given), as INTERCEPTOR_RANDOM_CONFIGS; give it before any test filter.
        #[arg(long)]
        random_configs: Option<u32>,
        /// Passed to `cargo test`, e.g. a test name filter or `--release`.
        #[arg(allow_hyphen_values = true)]
        cargo_args: Vec<OsString>,
        /// Passed to the test binaries, e.g. `cargo xtask test -- --test-threads 4`.
        #[arg(last = true)]
        test_args: Vec<OsString>,
    },
    /// Run the kernel tests in guests of Debian's kernels 5.10, 6.1, 6.12 and the newest in
    /// trixie-backports, under QEMU (results in target/kernels/results.json). Needs root.
    Kernels {
        /// Also the runs beyond the load-and-behaviour core `cargo xtask test` runs.
        #[arg(long)]
        full: bool,
        /// Only this series (5.10, 6.1, 6.12, newest); may be repeated.
        #[arg(long = "kernel")]
        series: Vec<String>,
        /// Only the runs of this test binary (e.g. behaviour_random); may be repeated. Set
        /// INTERCEPTOR_RANDOM_SEED (or _BASE_SEED, _CONFIGS) to replay a random table's seed.
        #[arg(long = "only")]
        binaries: Vec<String>,
        /// libtest's --test-threads in each guest.
        #[arg(long, default_value_t = test::DEFAULT_GUEST_TEST_THREADS)]
        test_threads: u32,
    },
    /// Run setup, build, then a self-contained demo of interception on this machine
    /// (`tests/src/bin/demo.rs`). Needs root.
    Demo,
    /// Run setup, build, then measure what interception costs per connection, eBPF next to
    /// iptables (`tests/src/bin/bench/`; results in target/bench/, see docs/BENCHMARKS.md).
    /// Needs root. Its options: `cargo xtask bench --help`.
    #[command(disable_help_flag = true)]
    Bench {
        /// Passed to the bench, e.g. `--quick`.
        #[arg(allow_hyphen_values = true, trailing_var_arg = true)]
        args: Vec<OsString>,
    },
    /// Run setup, build the release binaries, then the node agent's OCI image
    /// (target/image/interceptor.oci.tar, for `podman load`; nothing is pulled). Needs root.
    Image,
    /// Install cargo-fuzz if missing, then run each fuzz target of fuzz/ from its corpus (new
    /// inputs under target/fuzz/), failing on any crash; prints executions, coverage and crashes.
    Fuzz {
        /// Minutes per target.
        #[arg(long, default_value_t = 2.0)]
        minutes: f64,
        /// Only this target (cni, conflist, api_request, proxy_init_flags, annotations,
        /// pod_record, kube_pod, id_map, cni_commands, netlink, proc, iptables_save); may be
        /// repeated.
        #[arg(long = "target")]
        targets: Vec<String>,
    },
    /// Check that the crates, the chart, the image and the changelog name one version and that
    /// the changelog's recorded commits are in this clone (the default), or cut a release
    /// (docs/releasing.md).
    Release {
        #[command(subcommand)]
        action: Option<ReleaseAction>,
    },
}

#[derive(Subcommand)]
enum ReleaseAction {
    /// The check `cargo xtask test` starts with; no network.
    Check,
    /// Move CHANGELOG.md's Unreleased section under VERSION with today's date, set VERSION in
    /// Cargo.toml, the lock files and the chart, commit that as the release, then commit its
    /// hash into the changelog; prints the `git tag` to run.
    Cut {
        /// The new version, semver (e.g. 0.2.0 or 1.0.0-rc.1), later than the newest entry's.
        version: String,
    },
}

fn main() -> ExitCode {
    // Print the error chain on one line ourselves: returning the error from main would add
    // a backtrace whenever RUST_BACKTRACE is set, burying the message that says what to do.
    match run(Cli::parse().task) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            if let Some(hint) = disk::full_disk_hint(&workspace_root().join("target")) {
                eprintln!("{hint}");
            }
            ExitCode::FAILURE
        }
    }
}

fn run(task: Task) -> anyhow::Result<()> {
    match task {
        Task::Setup => setup::run().map(drop),
        Task::Test {
            upgrade,
            random_configs,
            cargo_args,
            test_args,
        } => test::run(upgrade, random_configs, &cargo_args, &test_args),
        Task::Kernels {
            full,
            series,
            binaries,
            test_threads,
        } => test::kernels(kernels::Options {
            scope: if full {
                kernels::Scope::Full
            } else {
                kernels::Scope::Core
            },
            series,
            binaries,
            test_threads,
            previous_release: None,
        }),
        Task::Demo => kit::run("demo", &[]),
        Task::Bench { args } => kit::run("bench", &args),
        Task::Image => image::build().map(drop),
        Task::Fuzz { minutes, targets } => fuzz::run(
            std::time::Duration::try_from_secs_f64(minutes * 60.0)
                .map_err(|_| anyhow::anyhow!("--minutes {minutes} is not a duration"))?,
            &targets,
        ),
        Task::Release { action } => match action.unwrap_or(ReleaseAction::Check) {
            ReleaseAction::Check => release::check(),
            ReleaseAction::Cut { version } => release::cut(&version),
        },
    }
}

/// The workspace root; child cargo commands run there so `cargo xtask` works from any directory.
fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask/ sits inside the workspace root")
}
