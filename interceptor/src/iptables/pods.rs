//! The iptables backend's pods, as the agent meshes them: each registered pod gets proxy-init's
//! nat-table chains in its own network namespace (`install`, which enters it with setns before
//! each command), and removing the pod runs `cleanup` there (our two jumps and two chains,
//! nothing else). Nothing is loaded into the kernel, so it works where the eBPF programs cannot
//! load.
//!
//! The chains are the state: a pod's record keeps them as `iptables-save` listed them once they
//! were written, and a restarted agent compares that with what the namespace holds, writing them
//! again only when they differ (missing, or another configuration's).
use std::{collections::BTreeMap, net::IpAddr, path::Path};

use interceptor_common::NetnsCookie;
use serde::{Deserialize, Serialize};

use super::{Family, IptablesError, IptablesMode, IptablesOptions};
use crate::config::InterceptionConfig;

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

/// The pods the iptables backend meshes, the one table of them: their chains are in their
/// namespaces; this keeps each one's configuration and addresses, with its user's `D` (the
/// agent's facts about it), as the eBPF backend's registry does.
pub struct IptablesPods<D> {
    settings: IptablesSettings,
    /// `--max-pods`, as the eBPF backend's pod table is bounded.
    max_pods: u32,
    pods: BTreeMap<NetnsCookie, IptablesPod<D>>,
}

struct IptablesPod<D> {
    config: InterceptionConfig,
    addresses: Vec<IpAddr>,
    data: D,
}

impl<D> IptablesPods<D> {
    pub fn new(settings: IptablesSettings, max_pods: u32) -> Self {
        Self {
            settings,
            max_pods,
            pods: BTreeMap::new(),
        }
    }

    /// `Some(max)` when `max` pods are meshed already: a new one is refused.
    pub fn full(&self) -> Option<u32> {
        (self.pods.len() >= self.max_pods as usize).then_some(self.max_pods)
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
    /// twice; a failure removes what it added) and reads back what is in force. The table is
    /// left as it is.
    pub fn write_chains(
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

    /// The chains of a pod taken back after a restart: those `in_force` describe, running
    /// nothing when they are still what the namespace holds, or written again. Returns what is
    /// in force now, and whether the chains had to be written again. The table is left as it is.
    pub fn restore_chains(
        &self,
        netns: &Path,
        config: &InterceptionConfig,
        in_force: Option<&ChainsInForce>,
    ) -> Result<(ChainsInForce, bool), IptablesError> {
        if let Some(recorded) = in_force
            && self.rules(netns, recorded.mode, config.ipv6)? == recorded.rules
        {
            return Ok((recorded.clone(), false));
        }
        Ok((self.write_chains(netns, config)?, true))
    }

    /// Puts a pod whose chains are in force in the table, with `data` (replacing what it held).
    pub fn insert(
        &mut self,
        cookie: NetnsCookie,
        config: &InterceptionConfig,
        addresses: &[IpAddr],
        data: D,
    ) {
        let pod = IptablesPod {
            config: config.clone(),
            addresses: addresses.to_vec(),
            data,
        };
        self.pods.insert(cookie, pod);
    }

    /// Removes the pod's chains (written by `mode`'s binaries) and forgets it.
    pub fn remove(
        &mut self,
        cookie: NetnsCookie,
        netns: &Path,
        ipv6: bool,
        mode: Option<IptablesMode>,
    ) -> Result<(), IptablesError> {
        let mode = mode.unwrap_or(self.settings.mode);
        super::cleanup(&self.options(netns, mode, ipv6))?;
        self.pods.remove(&cookie);
        Ok(())
    }

    /// Forgets a pod whose namespace is gone: its chains went with it.
    pub fn forget(&mut self, cookie: NetnsCookie) {
        self.pods.remove(&cookie);
    }

    pub fn addresses(&self, cookie: NetnsCookie) -> Vec<IpAddr> {
        self.pods
            .get(&cookie)
            .map(|p| p.addresses.clone())
            .unwrap_or_default()
    }

    pub fn set_addresses(&mut self, cookie: NetnsCookie, addresses: &[IpAddr]) {
        if let Some(pod) = self.pods.get_mut(&cookie) {
            pod.addresses = addresses.to_vec();
        }
    }

    pub fn len(&self) -> usize {
        self.pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// What is kept with a pod in the table.
    pub fn data(&self, cookie: NetnsCookie) -> Option<&D> {
        Some(&self.pods.get(&cookie)?.data)
    }

    /// The pods in the table, with what is kept with each, by key.
    pub fn registered(&self) -> impl Iterator<Item = (NetnsCookie, &D)> {
        self.pods.iter().map(|(cookie, p)| (*cookie, &p.data))
    }

    /// A pod's configuration, as its chains were written for it.
    pub fn config(&self, cookie: NetnsCookie) -> Option<&InterceptionConfig> {
        Some(&self.pods.get(&cookie)?.config)
    }

    /// Replaces what is kept with a pod; returns what was kept, or gives `data` back if the pod
    /// is not in the table.
    pub fn set_data(&mut self, cookie: NetnsCookie, data: D) -> Result<D, D> {
        match self.pods.get_mut(&cookie) {
            Some(pod) => Ok(std::mem::replace(&mut pod.data, data)),
            None => Err(data),
        }
    }

    /// What differs between the chains recorded for a pod and those in its namespace now (runs
    /// `iptables-save` in it).
    pub fn differs(&self, netns: &Path, ipv6: bool, recorded: &ChainsInForce) -> Option<String> {
        match self.rules(netns, recorded.mode, ipv6) {
            Ok(rules) if rules == recorded.rules => None,
            Ok(rules) if rules.is_empty() => Some("its iptables chains are missing".into()),
            Ok(_) => Some("its iptables chains are not those the agent wrote".into()),
            Err(e) => Some(format!("its iptables chains cannot be read: {e}")),
        }
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
                ours(&save)
                    .into_iter()
                    .map(|line| format!("{prefix} {line}")),
            );
        }
        Ok(rules)
    }
}

/// The lines of `iptables-save -t nat` output that are ours: the rules of our two chains and the
/// jumps to them (not the chains' declarations, whose counters change).
fn ours(save: &str) -> Vec<&str> {
    let chains = [super::REDIRECT_CHAIN, super::OUTPUT_CHAIN];
    save.lines()
        .filter(|line| {
            chains.iter().any(|chain| {
                line.starts_with(&format!("-A {chain} "))
                    || ((line.starts_with("-A PREROUTING ") || line.starts_with("-A OUTPUT "))
                        && line.ends_with(&format!("-j {chain}")))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_our_rules_and_jumps_are_compared() {
        let save = r#"# Generated by iptables-save
*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [3:180]
:PROXY_INIT_OUTPUT - [0:0]
:PROXY_INIT_REDIRECT - [0:0]
:CNI_OTHER - [0:0]
-A PREROUTING -j CNI_OTHER
-A PREROUTING -m comment --comment "proxy-init/install-proxy-init-prerouting" -j PROXY_INIT_REDIRECT
-A OUTPUT -m comment --comment "proxy-init/install-proxy-init-output" -j PROXY_INIT_OUTPUT
-A OUTPUT -p tcp -m tcp --dport 9 -j RETURN
-A PROXY_INIT_OUTPUT -m owner --uid-owner 2102 -m comment --comment "proxy-init/ignore-proxy-user-id" -j RETURN
-A PROXY_INIT_REDIRECT -p tcp -m comment --comment "proxy-init/redirect-all-incoming-to-proxy-port" -j REDIRECT --to-ports 4143
-A CNI_OTHER -p udp -j RETURN
COMMIT
"#;
        assert_eq!(
            super::ours(save),
            [
                r#"-A PREROUTING -m comment --comment "proxy-init/install-proxy-init-prerouting" -j PROXY_INIT_REDIRECT"#,
                r#"-A OUTPUT -m comment --comment "proxy-init/install-proxy-init-output" -j PROXY_INIT_OUTPUT"#,
                r#"-A PROXY_INIT_OUTPUT -m owner --uid-owner 2102 -m comment --comment "proxy-init/ignore-proxy-user-id" -j RETURN"#,
                r#"-A PROXY_INIT_REDIRECT -p tcp -m comment --comment "proxy-init/redirect-all-incoming-to-proxy-port" -j REDIRECT --to-ports 4143"#,
            ]
        );
    }
}
