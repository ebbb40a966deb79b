pub mod agent;
pub mod cni;
pub mod run;
pub mod status;
pub mod validate;

use tracing::info;

use crate::{cli::IptablesCleanupArgs, iptables};

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
