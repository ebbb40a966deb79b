//! Running the command line's commands (their flags are in `cli`).
pub mod agent;
pub mod check;
pub mod cni;
pub mod kernel;
pub mod namespace_metadata;
pub mod run;
pub mod status;
pub mod validate;

use clap::Parser as _;
use tracing::{info, warn};

use crate::{
    cli::{IptablesCleanupArgs, Mode},
    ebpf, iptables,
};

/// The backend `mode` asks for: `auto` is eBPF when every program loads and verifies on this
/// kernel with these privileges (probed by loading them), else iptables, said in one log line
/// with the reason.
pub fn choose_backend(mode: Mode) -> Mode {
    if mode != Mode::Auto {
        return mode;
    }
    match ebpf::probe() {
        Ok(()) => {
            info!(
                backend = "ebpf",
                "auto mode: every eBPF program loads and verifies on this kernel"
            );
            Mode::Ebpf
        }
        Err(reason) => {
            warn!(backend = "iptables", %reason, "auto mode: eBPF cannot be used here, falling back to iptables");
            Mode::Iptables
        }
    }
}

/// A command's end with an exit code of its own (a validation that failed, a usage error), once
/// it has said why: `main` exits with `code` and adds nothing.
#[derive(Debug, thiserror::Error)]
#[error("exit code {code}")]
pub struct Exit {
    pub code: u8,
}

/// The `interceptor` binary: parse, set up logging, run the command.
pub fn main() -> std::process::ExitCode {
    let cli = crate::cli::Cli::parse();
    if let Err(e) = crate::logging::init(cli.log_format, &cli.log_level) {
        eprintln!("error: {e:#}");
        return std::process::ExitCode::from(2);
    }
    let result = match cli.command {
        crate::cli::Command::Run(args) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(run::run(args))),
        crate::cli::Command::Status(args) => status::status(args),
        crate::cli::Command::IptablesCleanup(args) => iptables_cleanup(args),
        // API requests are handled on blocking threads (see `agent::server`); a few suffice, as
        // the map changes are serialized anyway, and each thread costs an allocator arena.
        crate::cli::Command::Daemon(args) => {
            // Before any thread starts: see `open_files`.
            crate::agent::open_files::make_room(args.max_pods);
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .max_blocking_threads(4)
                .build()
                .map_err(anyhow::Error::from)
                .and_then(|rt| rt.block_on(agent::daemon(args)))
        }
        crate::cli::Command::Pod(args) => agent::pod(args),
        crate::cli::Command::Uninstall(args) => agent::uninstall(args),
        crate::cli::Command::Validate(args) => validate::validate(args),
        crate::cli::Command::Cni(args) => cni::cni(args),
        crate::cli::Command::Kernel(args) => kernel::kernel(args),
        crate::cli::Command::MountBpffs(args) => mount_bpffs(&args.path),
        crate::cli::Command::Check(args) => check::check(args),
        crate::cli::Command::NamespaceMetadata(args) => {
            namespace_metadata::namespace_metadata(args)
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => match e.downcast_ref::<Exit>() {
            Some(exit) => std::process::ExitCode::from(exit.code),
            None => {
                tracing::error!("{e:#}");
                std::process::ExitCode::FAILURE
            }
        },
    }
}

/// `interceptor mount-bpffs`: one line saying whether it mounted one or found one.
fn mount_bpffs(path: &std::path::Path) -> anyhow::Result<()> {
    let mounted = crate::bpffs::ensure_bpffs(path)?;
    if mounted {
        info!(path = %path.display(), "bpffs mounted");
    } else {
        info!(path = %path.display(), "a bpffs is already mounted here");
    }
    Ok(())
}

/// `interceptor iptables-cleanup`.
pub fn iptables_cleanup(args: IptablesCleanupArgs) -> anyhow::Result<()> {
    let options = iptables::IptablesOptions {
        mode: args.iptables.iptables_mode,
        wait: args.iptables.use_wait_flag,
        ipv6: args.ipv6,
        netns: args.netns,
    };
    let ran = iptables::cleanup(&options)?;
    info!(commands = ran.len(), "iptables chains removed");
    for command in ran {
        println!("{command}");
    }
    Ok(())
}
