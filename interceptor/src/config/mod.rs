//! The interception contract's configuration (SPEC "Configuration"), validated once and then
//! shared by every backend.
pub mod ports;
pub mod subnets;

use std::fmt;

use ipnet::IpNet;
pub use ports::{PortRange, PortSet};

/// How one pod is intercepted. Every value is already validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InterceptionConfig {
    pub incoming_proxy_port: u16,
    pub outgoing_proxy_port: u16,
    /// `None` when unset or 0: proxy-init only exempts a UID > 0.
    pub proxy_uid: Option<u32>,
    pub proxy_gid: Option<u32>,
    pub inbound_ports_to_ignore: PortSet,
    pub outbound_ports_to_ignore: PortSet,
    /// When not empty, only these inbound ports are steered.
    pub ports_to_redirect: Vec<u16>,
    /// Inbound: connections from these sources are not steered.
    pub subnets_to_ignore: Vec<IpNet>,
    /// Outbound (extension): connections to these destinations are not redirected.
    pub outbound_subnets_to_ignore: Vec<IpNet>,
    pub ipv6: bool,
}

pub use interceptor_api::ConfigSummary;

impl InterceptionConfig {
    /// The configuration as proxy-init's flags, in the form `interceptor run` and the agent's
    /// API take them (`--incoming-proxy-port 4143 ...`); parsing them gives this configuration
    /// back.
    pub fn to_args(&self) -> Vec<String> {
        let mut args = vec![
            "--incoming-proxy-port".to_owned(),
            self.incoming_proxy_port.to_string(),
            "--outgoing-proxy-port".to_owned(),
            self.outgoing_proxy_port.to_string(),
        ];
        let mut flag = |name: &str, value: String| {
            args.push(format!("--{name}"));
            args.push(value);
        };
        if let Some(uid) = self.proxy_uid {
            flag("proxy-uid", uid.to_string());
        }
        if let Some(gid) = self.proxy_gid {
            flag("proxy-gid", gid.to_string());
        }
        if !self.inbound_ports_to_ignore.is_empty() {
            flag(
                "inbound-ports-to-ignore",
                self.inbound_ports_to_ignore.to_string(),
            );
        }
        if !self.outbound_ports_to_ignore.is_empty() {
            flag(
                "outbound-ports-to-ignore",
                self.outbound_ports_to_ignore.to_string(),
            );
        }
        let join = |items: Vec<String>| items.join(",");
        if !self.ports_to_redirect.is_empty() {
            flag(
                "ports-to-redirect",
                join(self.ports_to_redirect.iter().map(u16::to_string).collect()),
            );
        }
        if !self.subnets_to_ignore.is_empty() {
            flag(
                "subnets-to-ignore",
                join(
                    self.subnets_to_ignore
                        .iter()
                        .map(IpNet::to_string)
                        .collect(),
                ),
            );
        }
        if !self.outbound_subnets_to_ignore.is_empty() {
            flag(
                "outbound-subnets-to-ignore",
                join(
                    self.outbound_subnets_to_ignore
                        .iter()
                        .map(IpNet::to_string)
                        .collect(),
                ),
            );
        }
        args.push(format!("--ipv6={}", self.ipv6));
        args
    }

    pub fn summary(&self) -> ConfigSummary {
        ConfigSummary {
            incoming_proxy_port: self.incoming_proxy_port,
            outgoing_proxy_port: self.outgoing_proxy_port,
            proxy_uid: self.proxy_uid,
            proxy_gid: self.proxy_gid,
            inbound_ports_to_ignore: self.inbound_ports_to_ignore.to_string(),
            outbound_ports_to_ignore: self.outbound_ports_to_ignore.to_string(),
            ports_to_redirect: self.ports_to_redirect.clone(),
            subnets_to_ignore: self
                .subnets_to_ignore
                .iter()
                .map(IpNet::to_string)
                .collect(),
            outbound_subnets_to_ignore: self
                .outbound_subnets_to_ignore
                .iter()
                .map(IpNet::to_string)
                .collect(),
            ipv6: self.ipv6,
        }
    }
}

impl fmt::Display for InterceptionConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "inbound->{} outbound->{}",
            self.incoming_proxy_port, self.outgoing_proxy_port
        )?;
        if let Some(uid) = self.proxy_uid {
            write!(f, " proxy-uid={uid}")?;
        }
        if let Some(gid) = self.proxy_gid {
            write!(f, " proxy-gid={gid}")?;
        }
        if !self.outbound_ports_to_ignore.is_empty() {
            write!(
                f,
                " outbound-ports-to-ignore={}",
                self.outbound_ports_to_ignore
            )?;
        }
        if !self.inbound_ports_to_ignore.is_empty() {
            write!(
                f,
                " inbound-ports-to-ignore={}",
                self.inbound_ports_to_ignore
            )?;
        }
        Ok(())
    }
}
