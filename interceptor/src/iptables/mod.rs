//! The iptables backend: the very nat-table chains proxy-init writes, for kernels or
//! environments where eBPF cannot be used.
mod pods;
mod rules;

use std::{
    fs::File,
    os::fd::{AsFd as _, AsRawFd as _, OwnedFd},
    path::{Path, PathBuf},
    process::Command,
};

use clap::ValueEnum;
pub use pods::{ChainsInForce, IptablesBackend, IptablesSettings};
pub use rules::{
    Existing, Family, OUTPUT_CHAIN, REDIRECT_CHAIN, Rule, cleanup as cleanup_rules,
    install as install_rules, multiport_groups,
};

use crate::config::InterceptionConfig;

/// Which iptables binaries to run: legacy, nft or plain `iptables`, as proxy-init offers.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum IptablesMode {
    #[default]
    Legacy,
    Nft,
    Plain,
}

impl IptablesMode {
    /// The command and its `-save` counterpart for one family.
    pub fn binaries(self, family: Family) -> (&'static str, &'static str) {
        match (self, family) {
            (Self::Legacy, Family::V4) => ("iptables-legacy", "iptables-legacy-save"),
            (Self::Legacy, Family::V6) => ("ip6tables-legacy", "ip6tables-legacy-save"),
            (Self::Nft, Family::V4) => ("iptables-nft", "iptables-nft-save"),
            (Self::Nft, Family::V6) => ("ip6tables-nft", "ip6tables-nft-save"),
            (Self::Plain, Family::V4) => ("iptables", "iptables-save"),
            (Self::Plain, Family::V6) => ("ip6tables", "ip6tables-save"),
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct IptablesOptions {
    pub mode: IptablesMode,
    /// Pass `-w` (wait for the xtables lock).
    pub wait: bool,
    /// Also run the ip6tables pass.
    pub ipv6: bool,
    /// Act inside this network namespace (default: the current one).
    pub netns: Option<PathBuf>,
}

impl IptablesOptions {
    fn families(&self) -> Vec<Family> {
        if self.ipv6 {
            vec![Family::V4, Family::V6]
        } else {
            vec![Family::V4]
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum IptablesError {
    #[error(
        "{binary} not found on PATH: install iptables (apt-get install iptables) or choose another --iptables-mode"
    )]
    MissingBinary { binary: String },
    #[error("cannot open network namespace {path}: {source}")]
    Netns {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("`{command}` could not run: {source}")]
    Spawn {
        command: String,
        source: std::io::Error,
    },
    #[error("`{command}` failed ({status}): {output}")]
    Failed {
        command: String,
        status: std::process::ExitStatus,
        output: String,
    },
    #[error("this agent serves at most {0} pods (--max-pods): remove a pod first")]
    Full(u32),
}

/// Installs the chains (both families with `ipv6`). Idempotent: existing chains are flushed and
/// refilled, existing jumps kept. If any command fails, everything this backend adds is removed
/// again, so no half-installed chain is left behind. Returns the commands that ran.
pub fn install(
    config: &InterceptionConfig,
    options: &IptablesOptions,
) -> Result<Vec<String>, IptablesError> {
    let runner = Runner::new(options)?;
    let mut ran = Vec::new();
    for family in options.families() {
        let (binary, existing) = runner.prepare(family)?;
        for rule in rules::install(config, family, existing) {
            match runner.run(binary, &rule) {
                Ok(command) => ran.push(command),
                Err(e) => {
                    let _ = cleanup(options);
                    return Err(e);
                }
            }
        }
    }
    Ok(ran)
}

/// The commands [`install`] would run, for `--simulate`. Reads the current state (to show a
/// re-run's flushes) when the save binary is there, changes nothing.
pub fn simulate(
    config: &InterceptionConfig,
    options: &IptablesOptions,
) -> Result<Vec<String>, IptablesError> {
    let runner = Runner::new(options)?;
    let mut commands = Vec::new();
    for family in options.families() {
        let (binary, save) = options.mode.binaries(family);
        let existing = if runner.require(save).is_ok() {
            runner.existing(save)?
        } else {
            Existing::default()
        };
        commands.extend(
            rules::install(config, family, existing)
                .iter()
                .map(|r| runner.show(binary, r)),
        );
    }
    Ok(commands)
}

/// Removes the two jumps and the two chains, and nothing else. Idempotent.
pub fn cleanup(options: &IptablesOptions) -> Result<Vec<String>, IptablesError> {
    let runner = Runner::new(options)?;
    let mut ran = Vec::new();
    for family in options.families() {
        let (binary, existing) = runner.prepare(family)?;
        let wanted = [
            existing.prerouting_jump,
            existing.output_jump,
            existing.redirect_chain,
            existing.redirect_chain,
            existing.output_chain,
            existing.output_chain,
        ];
        for (rule, present) in rules::cleanup().iter().zip(wanted) {
            if present {
                ran.push(runner.run(binary, rule)?);
            }
        }
    }
    Ok(ran)
}

/// The nat table as `<save> -t nat` prints it, inside the options' namespace.
pub fn save_nat(options: &IptablesOptions, family: Family) -> Result<String, IptablesError> {
    let runner = Runner::new(options)?;
    let (_, save) = options.mode.binaries(family);
    runner.require(save)?;
    runner.output(save, &["-t", "nat"])
}

struct Runner<'a> {
    options: &'a IptablesOptions,
    netns: Option<File>,
    /// The user namespace that owns `netns`, where it is not ours (a pod with `hostUsers:
    /// false`): iptables runs inside it, as the pod's own `linkerd-init` would, since the kernel
    /// refuses an owner match written from another user namespace (`xt_owner`'s check).
    userns: Option<OwnedFd>,
}

impl<'a> Runner<'a> {
    fn new(options: &'a IptablesOptions) -> Result<Self, IptablesError> {
        let netns = match &options.netns {
            Some(path) => Some(File::open(path).map_err(|source| IptablesError::Netns {
                path: path.clone(),
                source,
            })?),
            None => None,
        };
        // Entering the namespace we are already in would still need CAP_SYS_ADMIN, which
        // iptables itself does not: skip it.
        let netns = netns.filter(|ns| !same_file(ns, Path::new("/proc/self/ns/net")));
        let userns = match (&netns, &options.netns) {
            (Some(netns), Some(path)) => {
                foreign_owner(netns).map_err(|source| IptablesError::Netns {
                    path: path.clone(),
                    source,
                })?
            }
            _ => None,
        };
        Ok(Self {
            options,
            netns,
            userns,
        })
    }

    /// The family's iptables binary, once both it and its save counterpart are known to be there,
    /// and what of ours is already installed.
    fn prepare(&self, family: Family) -> Result<(&'static str, Existing), IptablesError> {
        let (binary, save) = self.options.mode.binaries(family);
        self.require(binary)?;
        self.require(save)?;
        Ok((binary, self.existing(save)?))
    }

    fn require(&self, binary: &str) -> Result<(), IptablesError> {
        let found = std::env::var_os("PATH").is_some_and(|path| {
            std::env::split_paths(&path).any(|dir| is_executable(&dir.join(binary)))
        });
        if found {
            Ok(())
        } else {
            Err(IptablesError::MissingBinary {
                binary: binary.into(),
            })
        }
    }

    fn show(&self, binary: &str, rule: &Rule) -> String {
        if self.options.wait {
            format!("{binary} -w {rule}")
        } else {
            format!("{binary} {rule}")
        }
    }

    /// `binary` with `args` in the namespace; a write (`inside_users`) also inside its user
    /// namespace. Reads stay in ours: the first read on a node loads `ip_tables` (iptables-legacy
    /// runs modprobe), which no process inside a pod's user namespace may do.
    fn command(&self, binary: &str, args: &[String], inside_users: bool) -> Command {
        let mut cmd = Command::new(binary);
        cmd.args(args);
        let userns = self.userns.as_ref().filter(|_| inside_users);
        // The namespaces' fds stay open until after the spawn (self holds them).
        match (&self.netns, userns) {
            (Some(netns), Some(userns)) => interceptor_sys::userns::enter_pod_before_exec(
                &mut cmd,
                netns.as_raw_fd(),
                userns.as_raw_fd(),
            ),
            (Some(netns), None) => {
                interceptor_sys::netns::enter_netns_before_exec(&mut cmd, netns.as_raw_fd());
            }
            (None, _) => {}
        }
        cmd
    }

    fn run(&self, binary: &str, rule: &Rule) -> Result<String, IptablesError> {
        let mut args = Vec::new();
        if self.options.wait {
            args.push("-w".to_owned());
        }
        args.extend(rule.0.iter().cloned());
        let shown = self.show(binary, rule);
        self.capture(binary, &args, &shown, true)?;
        Ok(shown)
    }

    fn output(&self, binary: &str, args: &[&str]) -> Result<String, IptablesError> {
        let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
        self.capture(
            binary,
            &args,
            &format!("{binary} {}", args.join(" ")),
            false,
        )
    }

    fn capture(
        &self,
        binary: &str,
        args: &[String],
        shown: &str,
        inside_users: bool,
    ) -> Result<String, IptablesError> {
        let out = self
            .command(binary, args, inside_users)
            .output()
            .map_err(|source| IptablesError::Spawn {
                command: shown.into(),
                source,
            })?;
        if !out.status.success() {
            let mut output = String::from_utf8_lossy(&out.stderr).trim().to_owned();
            output.push_str(String::from_utf8_lossy(&out.stdout).trim());
            return Err(IptablesError::Failed {
                command: shown.into(),
                status: out.status,
                output,
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Which of our chains and jumps are already there.
    fn existing(&self, save: &str) -> Result<Existing, IptablesError> {
        Ok(interceptor_parse::iptables::existing(
            &self.output(save, &["-t", "nat"])?,
        ))
    }
}

/// The user namespace that owns the network namespace `netns`, unless it is ours.
fn foreign_owner(netns: &File) -> std::io::Result<Option<OwnedFd>> {
    let userns = interceptor_sys::userns::owning_user_namespace(netns.as_fd())?;
    Ok((!interceptor_sys::userns::is_own_user_namespace(userns.as_fd())?).then_some(userns))
}

fn same_file(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
