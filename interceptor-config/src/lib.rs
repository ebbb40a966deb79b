//! How one pod is intercepted, as plain data: [`InterceptionConfig`] and its values (ports and
//! ranges, CIDRs of both families, UID/GID), each parsed and validated here and nowhere else,
//! with a [`ConfigError`] that names the setting and the value. Linkerd's defaults live in
//! [`linkerd`].
//!
//! Every way a configuration arrives goes through this crate, so a bad value gets the same
//! message everywhere: proxy-init's flags, as `interceptor run` and `pod add` take them and
//! records written by older agents hold them ([`InterceptionConfig::from_proxy_init_args`], the
//! one parser of these flags, which the command line only collects), the agent's API and records
//! (JSON, see [`InterceptionConfig`]'s serde form) and the CNI plugin's `linkerd` block
//! ([`InterceptionConfig::set`], keyed by proxy-init's flag names). One table of flag cases
//! (`interceptor-test-cases`' `flag_cases`) is run through each of them. No clap, no aya: the CNI plugin builds with it
//! alone.
#![forbid(unsafe_code)]

pub mod annotations;
pub mod flags;
pub mod kube;
pub mod mesh;
pub mod ports;
pub mod subnets;
pub mod user_ids;

use std::fmt;

use flags::flag_names;
pub use flags::{FLAGS, Flag, SETTINGS, Setting};
use ipnet::IpNet;
pub use ports::{PortRange, PortSet};
use serde::{Deserialize, Serialize};

/// Linkerd's values, where a configuration leaves one out (its proxy injector's defaults).
pub mod linkerd {
    /// The proxy's inbound listener.
    pub const INBOUND_PORT: u16 = 4143;
    /// The proxy's outbound listener (on loopback).
    pub const OUTBOUND_PORT: u16 = 4140;
    /// The proxy's UID: its own connections are never redirected.
    pub const PROXY_UID: u32 = 2102;
    /// The proxy's admin and tap ports, which reach it directly.
    pub const INBOUND_PORTS_TO_IGNORE: &str = "4190,4191";
}

/// A setting that is missing, unknown or not valid.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Worded as the command line words a bad flag, so a value reads the same wherever it
    /// came from.
    #[error("invalid value '{value}' for '{setting}': {reason}")]
    Invalid {
        setting: String,
        value: String,
        reason: String,
    },
    #[error("unknown setting {setting:?} (known: {})", SETTINGS.join(", "))]
    Unknown { setting: String },
    /// Worded as the command line words an unexpected argument.
    #[error("unexpected argument '{flag}' (proxy-init's flags: {})", flag_names())]
    UnknownFlag { flag: String },
    #[error("--{setting} is required")]
    Missing { setting: &'static str },
}

/// How one pod is intercepted. Every value is already validated.
///
/// Its JSON form (the agent's API and records) writes port lists as proxy-init takes them
/// (`"4190,4191,25-30"`) and CIDRs as strings; reading it validates every value as the flags are
/// validated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Wire", into = "Wire")]
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

impl InterceptionConfig {
    /// Linkerd's configuration: the proxy's ports and UID, its admin ports not steered, IPv6 on.
    pub fn linkerd() -> Self {
        Self {
            incoming_proxy_port: linkerd::INBOUND_PORT,
            outgoing_proxy_port: linkerd::OUTBOUND_PORT,
            proxy_uid: Some(linkerd::PROXY_UID),
            proxy_gid: None,
            inbound_ports_to_ignore: linkerd::INBOUND_PORTS_TO_IGNORE
                .parse()
                .expect("Linkerd's admin ports parse"),
            outbound_ports_to_ignore: PortSet::default(),
            ports_to_redirect: Vec::new(),
            subnets_to_ignore: Vec::new(),
            outbound_subnets_to_ignore: Vec::new(),
            ipv6: true,
        }
    }

    /// Sets one setting, by proxy-init's flag name, from its text form; a list replaces the
    /// list there was.
    pub fn set(&mut self, setting: &str, value: &str) -> Result<(), ConfigError> {
        self.apply(Setting::parse(setting, value)?);
        Ok(())
    }

    /// The configuration as proxy-init's flags; [`Self::from_proxy_init_args`] (and `interceptor
    /// run`) gives this configuration back.
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
        if !self.ports_to_redirect.is_empty() {
            flag("ports-to-redirect", join(&self.ports_to_redirect));
        }
        if !self.subnets_to_ignore.is_empty() {
            flag("subnets-to-ignore", join(&self.subnets_to_ignore));
        }
        if !self.outbound_subnets_to_ignore.is_empty() {
            flag(
                "outbound-subnets-to-ignore",
                join(&self.outbound_subnets_to_ignore),
            );
        }
        args.push(format!("--ipv6={}", self.ipv6));
        args
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

/// The JSON form of [`InterceptionConfig`]: lists as text, checked on the way in.
#[derive(Serialize, Deserialize)]
struct Wire {
    incoming_proxy_port: u16,
    outgoing_proxy_port: u16,
    /// Negative is none, as in linkerd-cni's conflist (`"proxy-gid": -1`).
    #[serde(default)]
    proxy_uid: Option<i64>,
    #[serde(default)]
    proxy_gid: Option<i64>,
    #[serde(default)]
    inbound_ports_to_ignore: String,
    #[serde(default)]
    outbound_ports_to_ignore: String,
    #[serde(default)]
    ports_to_redirect: Vec<u16>,
    #[serde(default)]
    subnets_to_ignore: Vec<String>,
    #[serde(default)]
    outbound_subnets_to_ignore: Vec<String>,
    #[serde(default = "yes")]
    ipv6: bool,
}

fn yes() -> bool {
    true
}

impl TryFrom<Wire> for InterceptionConfig {
    type Error = ConfigError;

    fn try_from(wire: Wire) -> Result<Self, ConfigError> {
        let mut config = Self::linkerd();
        config.set("incoming-proxy-port", &wire.incoming_proxy_port.to_string())?;
        config.set("outgoing-proxy-port", &wire.outgoing_proxy_port.to_string())?;
        // Absent is none, not Linkerd's default.
        config.proxy_uid = None;
        if let Some(uid) = wire.proxy_uid {
            config.set("proxy-uid", &uid.to_string())?;
        }
        if let Some(gid) = wire.proxy_gid {
            config.set("proxy-gid", &gid.to_string())?;
        }
        config.set("inbound-ports-to-ignore", &wire.inbound_ports_to_ignore)?;
        config.set("outbound-ports-to-ignore", &wire.outbound_ports_to_ignore)?;
        config.set("ports-to-redirect", &join(&wire.ports_to_redirect))?;
        config.set("subnets-to-ignore", &wire.subnets_to_ignore.join(","))?;
        config.set(
            "outbound-subnets-to-ignore",
            &wire.outbound_subnets_to_ignore.join(","),
        )?;
        config.ipv6 = wire.ipv6;
        Ok(config)
    }
}

impl From<InterceptionConfig> for Wire {
    fn from(config: InterceptionConfig) -> Self {
        let strings = |nets: &[IpNet]| nets.iter().map(ToString::to_string).collect();
        Self {
            incoming_proxy_port: config.incoming_proxy_port,
            outgoing_proxy_port: config.outgoing_proxy_port,
            proxy_uid: config.proxy_uid.map(i64::from),
            proxy_gid: config.proxy_gid.map(i64::from),
            inbound_ports_to_ignore: config.inbound_ports_to_ignore.to_string(),
            outbound_ports_to_ignore: config.outbound_ports_to_ignore.to_string(),
            ports_to_redirect: config.ports_to_redirect.clone(),
            subnets_to_ignore: strings(&config.subnets_to_ignore),
            outbound_subnets_to_ignore: strings(&config.outbound_subnets_to_ignore),
            ipv6: config.ipv6,
        }
    }
}

/// The proxy's UID or GID: a decimal number. As in proxy-init (whose flags default to -1) and
/// linkerd-cni, a negative one means none, like 0 (no rule is written for either): both give 0
/// here, which [`positive`] turns into no exemption.
pub fn parse_id(s: &str) -> Result<u32, String> {
    let id: i64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a numeric id (-1 for none, or 0-4294967295)"))?;
    if id < 0 {
        return Ok(0);
    }
    u32::try_from(id)
        .map_err(|_| format!("{s:?} is not a numeric id (-1 for none, or 0-4294967295)"))
}

/// A boolean as Go's `strconv.ParseBool` (and so proxy-init's `--ipv6`) takes it.
pub fn parse_bool(s: &str) -> Result<bool, String> {
    match s.trim() {
        "true" | "TRUE" | "True" | "t" | "T" | "1" => Ok(true),
        "false" | "FALSE" | "False" | "f" | "F" | "0" => Ok(false),
        other => Err(format!(
            "{other:?} is not true or false (nor 1, 0, t, f, TRUE, FALSE, True, False)"
        )),
    }
}

/// proxy-init only exempts a UID or GID above 0.
fn positive(id: u32) -> Option<u32> {
    (id > 0).then_some(id)
}

/// Empty entries of a comma-separated list are skipped.
fn entries(s: &str) -> impl Iterator<Item = &str> {
    s.split(',').map(str::trim).filter(|e| !e.is_empty())
}

fn join(items: &[impl ToString]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn linkerd_defaults() {
        let config = InterceptionConfig::linkerd();
        assert_eq!(config.incoming_proxy_port, 4143);
        assert_eq!(config.outgoing_proxy_port, 4140);
        assert_eq!(config.proxy_uid, Some(2102));
        assert_eq!(config.inbound_ports_to_ignore.to_string(), "4190,4191");
        assert!(config.ipv6);
    }

    /// `Setting::name` spells each flag's name again; merging repeated flags and the check for
    /// required ones compare it with the table's.
    #[test]
    fn every_setting_names_the_flag_it_was_parsed_from() {
        for flag in &FLAGS {
            let setting = ["1", "true", "10.0.0.0/8"]
                .into_iter()
                .find_map(|value| Setting::parse(flag.name, value).ok())
                .unwrap_or_else(|| panic!("no sample value parses for --{}", flag.name));
            assert_eq!(setting.name(), flag.name);
        }
    }

    #[test]
    fn every_setting_is_parsed_and_checked_by_name() {
        let mut config = InterceptionConfig::linkerd();
        for (setting, value) in [
            ("incoming-proxy-port", "14143"),
            ("outgoing-proxy-port", "14140"),
            ("proxy-uid", "1234"),
            ("proxy-gid", "0"),
            ("inbound-ports-to-ignore", "4190, 25-30"),
            ("outbound-ports-to-ignore", ""),
            ("ports-to-redirect", "80,443"),
            ("subnets-to-ignore", "10.1.2.3/8,fd00::1/8"),
            ("outbound-subnets-to-ignore", "192.0.2.7"),
            ("ipv6", "false"),
        ] {
            config.set(setting, value).unwrap();
        }
        assert_eq!(config.incoming_proxy_port, 14143);
        assert_eq!(config.proxy_uid, Some(1234));
        assert_eq!(config.proxy_gid, None, "0 exempts nothing");
        assert_eq!(config.inbound_ports_to_ignore.to_string(), "4190,25-30");
        assert!(config.outbound_ports_to_ignore.is_empty());
        assert_eq!(config.ports_to_redirect, vec![80, 443]);
        assert_eq!(
            config.subnets_to_ignore,
            vec![
                "10.0.0.0/8".parse::<IpNet>().unwrap(),
                "fd00::/8".parse().unwrap()
            ]
        );
        assert_eq!(
            config.outbound_subnets_to_ignore[0].to_string(),
            "192.0.2.7/32"
        );
        assert!(!config.ipv6);

        for (setting, value, reason) in [
            ("incoming-proxy-port", "0", "port 0 is out of range"),
            ("outgoing-proxy-port", "70000", "port 70000 is out of range"),
            ("proxy-uid", "2102x", "not a numeric id"),
            ("proxy-gid", "4294967296", "not a numeric id"),
            (
                "inbound-ports-to-ignore",
                "30-25",
                "low end above its high end",
            ),
            ("ports-to-redirect", "80-90", "not a port number"),
            ("subnets-to-ignore", "10.0.0.0/33", "not a CIDR"),
            ("outbound-subnets-to-ignore", "::/129", "not a CIDR"),
            ("ipv6", "yes", "not true or false"),
            ("ipv6", "on", "not true or false"),
        ] {
            let err = config.set(setting, value).unwrap_err();
            let message = err.to_string();
            assert!(
                message.starts_with(&format!("invalid value '{value}' for '{setting}': "))
                    && message.contains(reason),
                "{message}"
            );
        }
        assert_eq!(
            config.set("banana", "1").unwrap_err().to_string(),
            format!(
                "unknown setting \"banana\" (known: {})",
                SETTINGS.join(", ")
            )
        );
    }

    #[test]
    fn proxy_init_flags_give_back_the_configuration_they_came_from() {
        for (flags, expected) in interceptor_test_cases::flag_cases::FLAG_CASES {
            if expected.is_ok() {
                let flags: Vec<String> = flags.iter().map(|a| a.to_string()).collect();
                let config = InterceptionConfig::from_proxy_init_args(&flags).unwrap();
                assert_eq!(
                    InterceptionConfig::from_proxy_init_args(&config.to_args()),
                    Ok(config),
                    "{flags:?}"
                );
            }
        }
        assert_eq!(
            InterceptionConfig::from_proxy_init_args(&args("-p 4143")),
            Err(ConfigError::Missing {
                setting: "outgoing-proxy-port"
            })
        );
        assert_eq!(
            InterceptionConfig::from_proxy_init_args(&args("-p 4143 -o 4140 --banana 1")),
            Err(ConfigError::UnknownFlag {
                flag: "--banana".into()
            })
        );
        assert_eq!(
            InterceptionConfig::from_proxy_init_args(&args("-p 0 -o 4140"))
                .unwrap_err()
                .to_string(),
            "invalid value '0' for '--incoming-proxy-port': port 0 is out of range (1-65535)"
        );
    }

    #[test]
    fn every_flag_case_parses_as_the_table_says() {
        for (flags, expected) in interceptor_test_cases::flag_cases::FLAG_CASES {
            let args: Vec<String> = flags.iter().map(|a| a.to_string()).collect();
            match (InterceptionConfig::from_proxy_init_args(&args), expected) {
                (Ok(config), Ok(expected)) => {
                    assert_eq!(&config.to_args().join(" "), expected, "{flags:?}")
                }
                (Err(e), Err(needle)) => {
                    assert!(e.to_string().contains(needle), "{flags:?}: {e}")
                }
                (got, expected) => panic!("{flags:?}: {got:?}, expected {expected:?}"),
            }
        }
    }

    #[test]
    fn the_json_form_is_stable_and_checked() {
        let mut config = InterceptionConfig::linkerd();
        config
            .set("outbound-subnets-to-ignore", "192.0.2.0/24,2001:db8::/32")
            .unwrap();
        let json = serde_json::to_value(&config).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "incoming_proxy_port": 4143,
                "outgoing_proxy_port": 4140,
                "proxy_uid": 2102,
                "proxy_gid": null,
                "inbound_ports_to_ignore": "4190,4191",
                "outbound_ports_to_ignore": "",
                "ports_to_redirect": [],
                "subnets_to_ignore": [],
                "outbound_subnets_to_ignore": ["192.0.2.0/24", "2001:db8::/32"],
                "ipv6": true
            })
        );
        assert_eq!(
            serde_json::from_value::<InterceptionConfig>(json).unwrap(),
            config
        );
        let minimal: InterceptionConfig =
            serde_json::from_str(r#"{"incoming_proxy_port":4143,"outgoing_proxy_port":4140}"#)
                .unwrap();
        assert!(
            minimal.ipv6
                && minimal.proxy_uid.is_none()
                && minimal.inbound_ports_to_ignore.is_empty()
        );
        let bad = serde_json::from_str::<InterceptionConfig>(
            r#"{"incoming_proxy_port":0,"outgoing_proxy_port":4140}"#,
        )
        .unwrap_err();
        assert!(
            bad.to_string()
                .contains("invalid value '0' for 'incoming-proxy-port'"),
            "{bad}"
        );
        let bad = serde_json::from_str::<InterceptionConfig>(
            r#"{"incoming_proxy_port":1,"outgoing_proxy_port":2,"inbound_ports_to_ignore":"http"}"#,
        )
        .unwrap_err();
        assert!(
            bad.to_string()
                .contains("invalid value 'http' for 'inbound-ports-to-ignore'"),
            "{bad}"
        );
    }
}
