//! The iptables backend of the node's pod table: each registered pod gets proxy-init's
//! nat-table chains in its own network namespace (`install`, which enters it with setns before
//! each command), and removing the pod runs `cleanup` there (our two jumps and two chains,
//! nothing else). Nothing is loaded into the kernel, so it works where the eBPF programs cannot
//! load.
//!
//! The chains are the state: a pod's record keeps them as `iptables-save` listed them once they
//! were written, and a restarted agent compares that with what the namespace holds, writing them
//! again only when they differ (missing, or another configuration's).
use std::path::Path;

use interceptor_common::NetnsCookie;
use serde::{Deserialize, Serialize};

use super::{Family, IptablesError, IptablesMode, IptablesOptions};
use crate::{
    config::InterceptionConfig,
    netns::{LocalDestinations, NetnsError, PodNetns},
    node::{Adopted, Interception, Pod, Wanted},
};

/// What the iptables backend wrote in a pod, as its record keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainsInForce {
    /// The binaries that wrote them (and remove them).
    pub mode: IptablesMode,
    /// Our rules (the two chains' and the two jumps), as `iptables-save -t nat` lists them,
    /// IPv6 ones after the IPv4 ones, each prefixed with its family (`ipv4 -A ...`).
    pub rules: Vec<String>,
}

/// How the agent runs iptables (`--iptables-mode`, `-w`).
#[derive(Clone, Copy, Debug, Default)]
pub struct IptablesSettings {
    pub mode: IptablesMode,
    pub wait: bool,
}

/// The iptables backend of a node's pod table: proxy-init's chains in each pod's namespace.
/// What it wrote for a pod is the pod's entry's [`ChainsInForce`].
pub struct IptablesBackend {
    settings: IptablesSettings,
    /// `--max-pods`, as the eBPF backend's slots are bounded.
    max_pods: u32,
}

impl IptablesBackend {
    pub fn new(settings: IptablesSettings, max_pods: u32) -> Self {
        Self { settings, max_pods }
    }

    fn options(&self, netns: &Path, mode: IptablesMode, ipv6: bool) -> IptablesOptions {
        IptablesOptions {
            mode,
            wait: self.settings.wait,
            ipv6,
            netns: Some(netns.to_owned()),
        }
    }

    /// Writes a pod's chains (an existing chain is flushed and refilled, a jump is never added
    /// twice; a failure removes what it added) and reads back what is in force.
    fn write_chains(
        &self,
        netns: &Path,
        config: &InterceptionConfig,
    ) -> Result<ChainsInForce, IptablesError> {
        let mode = self.settings.mode;
        super::install(config, &self.options(netns, mode, config.ipv6))?;
        Ok(ChainsInForce {
            mode,
            rules: self.rules(netns, mode, config.ipv6)?,
        })
    }

    /// Our rules in the namespace, as `iptables-save -t nat` lists them.
    fn rules(
        &self,
        netns: &Path,
        mode: IptablesMode,
        ipv6: bool,
    ) -> Result<Vec<String>, IptablesError> {
        let options = self.options(netns, mode, ipv6);
        let families: &[Family] = if ipv6 {
            &[Family::V4, Family::V6]
        } else {
            &[Family::V4]
        };
        let mut rules = Vec::new();
        for family in families {
            let prefix = match family {
                Family::V4 => "ipv4",
                Family::V6 => "ipv6",
            };
            let save = super::save_nat(&options, *family)?;
            rules.extend(
                interceptor_parse::iptables::ours(&save)
                    .into_iter()
                    .map(|line| format!("{prefix} {line}")),
            );
        }
        Ok(rules)
    }
}

impl Interception for IptablesBackend {
    type Written = ChainsInForce;
    type Error = IptablesError;
    type Census = ();

    /// The cookie, or where the kernel cannot tell it (5.10 to 5.13) a key derived from the
    /// namespace's inode: the chains need nothing of the kernel's.
    fn key(netns: &PodNetns) -> Result<NetnsCookie, NetnsError> {
        match netns.cookie() {
            Err(NetnsError::NoCookie { .. }) => netns.inode_key(),
            other => other,
        }
    }

    /// No `local` route: the chains' `-o lo` covers them.
    fn identify(netns: &PodNetns) -> Result<(NetnsCookie, LocalDestinations), NetnsError> {
        netns.key_and_addresses()
    }

    fn room(&self, meshed: usize) -> Result<(), IptablesError> {
        if meshed >= self.max_pods as usize {
            return Err(IptablesError::Full(self.max_pods));
        }
        Ok(())
    }

    /// A failed change removes what its run added, so the previous configuration's chains are
    /// written again.
    fn write(
        &mut self,
        _key: NetnsCookie,
        wanted: &Wanted<'_>,
        before: Option<&mut Pod<ChainsInForce>>,
    ) -> Result<ChainsInForce, IptablesError> {
        let netns = wanted.netns.path();
        self.write_chains(netns, wanted.config).inspect_err(|_| {
            if let Some(before) = before
                && let Err(undo) = self.write_chains(netns, &before.config)
            {
                tracing::error!(netns = %netns.display(), error = %undo, "writing a pod's previous iptables chains again after a change failed: the pod is not intercepted");
            }
        })
    }

    /// The chains need nothing: `-o lo` covers whatever the pod delivers over lo.
    fn set_local(
        &mut self,
        _key: NetnsCookie,
        _pod: &mut Pod<ChainsInForce>,
        _local: &LocalDestinations,
    ) -> Result<(), IptablesError> {
        Ok(())
    }

    /// Runs `cleanup` in the pod's namespace with the binaries that wrote the chains: our two
    /// jumps and two chains, nothing else.
    fn remove(
        &mut self,
        _key: NetnsCookie,
        pod: &mut Pod<ChainsInForce>,
    ) -> Result<(), IptablesError> {
        let options = self.options(&pod.netns, pod.written.mode, pod.config.ipv6);
        super::cleanup(&options).map(drop)
    }

    /// The chains went with the namespace.
    fn forget(
        &mut self,
        _key: NetnsCookie,
        _pod: &mut Pod<ChainsInForce>,
    ) -> Result<(), IptablesError> {
        Ok(())
    }

    /// The chains are read only by the thorough check ([`Self::differs`]).
    fn problem(&self, _key: NetnsCookie, _pod: &Pod<ChainsInForce>) -> Option<String> {
        None
    }

    fn census(&self) {}

    /// Runs `iptables-save` in the pod's namespace and compares our rules with those written.
    fn differs(
        &self,
        _key: NetnsCookie,
        pod: &Pod<ChainsInForce>,
        _census: Option<&()>,
    ) -> Option<String> {
        match self.rules(&pod.netns, pod.written.mode, pod.config.ipv6) {
            Ok(rules) if rules == pod.written.rules => None,
            Ok(rules) if rules.is_empty() => Some("its iptables chains are missing".into()),
            Ok(_) => Some("its iptables chains are not those the agent wrote".into()),
            Err(e) => Some(format!("its iptables chains cannot be read: {e}")),
        }
    }

    /// The chains `recorded` describes, running nothing when they are still what the namespace
    /// holds, or written again.
    fn adopt(
        &mut self,
        _key: NetnsCookie,
        wanted: &Wanted<'_>,
        recorded: Option<&ChainsInForce>,
        _census: &mut (),
    ) -> Result<Adopted<ChainsInForce>, IptablesError> {
        let netns = wanted.netns.path();
        let kept = match recorded {
            Some(recorded)
                if self.rules(netns, recorded.mode, wanted.config.ipv6)? == recorded.rules =>
            {
                Some(recorded.clone())
            }
            _ => None,
        };
        let repaired = match (&kept, recorded) {
            (None, Some(_)) => Some(
                "its iptables chains were missing or not those recorded, and are written again"
                    .to_owned(),
            ),
            _ => None,
        };
        let written = match kept {
            Some(kept) => kept,
            None => self.write_chains(netns, wanted.config)?,
        };
        Ok(Adopted {
            written,
            local: wanted.local.clone(),
            repaired,
        })
    }
}
