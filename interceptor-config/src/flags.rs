//! proxy-init's flags: the one table of their names ([`FLAGS`]) and their values parsed
//! ([`Setting`]). The flags parser ([`InterceptionConfig::from_proxy_init_args`]), the command
//! line (whose arguments and value parser are built from the table, so clap hands over typed
//! values) and the CNI plugin's `linkerd` block ([`InterceptionConfig::set`]) all go through
//! them, so a flag is named once and a value parsed one way.
use ipnet::IpNet;

use crate::{
    ConfigError, InterceptionConfig, PortSet, parse_bool, parse_id, ports, positive, subnets,
};

/// One of proxy-init's flags.
#[derive(Clone, Copy, Debug)]
pub struct Flag {
    /// The long name, which is also the setting's name (Linkerd's CNI configuration keys).
    pub name: &'static str,
    pub short: Option<char>,
    /// Takes a comma-separated list; given more than once, the values add up (any other flag
    /// takes its last value).
    pub list: bool,
    pub required: bool,
    /// What its value is, for a usage line (`PORT`, `CIDRS`).
    pub value: &'static str,
    pub help: &'static str,
}

const fn flag(
    name: &'static str,
    short: Option<char>,
    value: &'static str,
    help: &'static str,
) -> Flag {
    Flag {
        name,
        short,
        list: false,
        required: false,
        value,
        help,
    }
}

const fn list(
    name: &'static str,
    short: Option<char>,
    value: &'static str,
    help: &'static str,
) -> Flag {
    Flag {
        list: true,
        ..flag(name, short, value, help)
    }
}

const fn required(name: &'static str, short: char, help: &'static str) -> Flag {
    Flag {
        required: true,
        ..flag(name, Some(short), "PORT", help)
    }
}

/// The value kind of a boolean flag: alone, it means true.
pub const BOOL: &str = "BOOL";
/// The value kinds of ids, where a negative one means none (proxy-init's default is -1).
pub const IDS: [&str; 2] = ["UID", "GID"];

/// proxy-init's flags, in the order its usage lists them.
pub const FLAGS: [Flag; 10] = [
    required(
        "incoming-proxy-port",
        'p',
        "Port of the proxy's inbound listener.",
    ),
    required(
        "outgoing-proxy-port",
        'o',
        "Port of the proxy's outbound listener (on 127.0.0.1).",
    ),
    flag(
        "proxy-uid",
        Some('u'),
        IDS[0],
        "Connections opened by this UID are never redirected (ignored when 0 or negative).",
    ),
    flag(
        "proxy-gid",
        Some('g'),
        IDS[1],
        "Connections opened by this GID are never redirected (ignored when 0 or negative).",
    ),
    list(
        "inbound-ports-to-ignore",
        None,
        "PORTS",
        "Inbound ports and ranges never steered to the proxy (e.g. 4190,4191,25-30).",
    ),
    list(
        "outbound-ports-to-ignore",
        None,
        "PORTS",
        "Outbound ports and ranges never redirected to the proxy.",
    ),
    list(
        "ports-to-redirect",
        Some('r'),
        "PORTS",
        "If set, only these inbound ports are steered to the proxy.",
    ),
    list(
        "subnets-to-ignore",
        None,
        "CIDRS",
        "Inbound connections from these CIDRs are not steered.",
    ),
    list(
        "outbound-subnets-to-ignore",
        None,
        "CIDRS",
        "Outbound connections to these CIDRs are not redirected (extension to proxy-init).",
    ),
    flag(
        "ipv6",
        None,
        BOOL,
        "Also intercept IPv6 (`--ipv6=false` to turn off, as with proxy-init).",
    ),
];

/// The settings, by proxy-init's flag names (which Linkerd's CNI configuration uses too).
pub const SETTINGS: [&str; FLAGS.len()] = {
    let mut names = [""; FLAGS.len()];
    let mut i = 0;
    while i < FLAGS.len() {
        names[i] = FLAGS[i].name;
        i += 1;
    }
    names
};

/// The flag of a setting's name.
pub fn find(name: &str) -> Option<&'static Flag> {
    FLAGS.iter().find(|f| f.name == name)
}

/// One setting's value, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Setting {
    IncomingProxyPort(u16),
    OutgoingProxyPort(u16),
    /// `None`: 0 or negative, no exemption (proxy-init only exempts an id above 0).
    ProxyUid(Option<u32>),
    ProxyGid(Option<u32>),
    InboundPortsToIgnore(PortSet),
    OutboundPortsToIgnore(PortSet),
    PortsToRedirect(Vec<u16>),
    SubnetsToIgnore(Vec<IpNet>),
    OutboundSubnetsToIgnore(Vec<IpNet>),
    Ipv6(bool),
}

impl Setting {
    /// Parses `value` for the setting `name` (a flag's long name).
    pub fn parse(name: &str, value: &str) -> Result<Self, ConfigError> {
        let invalid = |reason: String| ConfigError::Invalid {
            setting: name.to_owned(),
            value: value.to_owned(),
            reason,
        };
        let id = |value: &str| parse_id(value).map(positive);
        Ok(match name {
            "incoming-proxy-port" => {
                Self::IncomingProxyPort(ports::parse_port(value).map_err(invalid)?)
            }
            "outgoing-proxy-port" => {
                Self::OutgoingProxyPort(ports::parse_port(value).map_err(invalid)?)
            }
            "proxy-uid" => Self::ProxyUid(id(value).map_err(invalid)?),
            "proxy-gid" => Self::ProxyGid(id(value).map_err(invalid)?),
            "inbound-ports-to-ignore" => {
                Self::InboundPortsToIgnore(value.parse().map_err(invalid)?)
            }
            "outbound-ports-to-ignore" => {
                Self::OutboundPortsToIgnore(value.parse().map_err(invalid)?)
            }
            "ports-to-redirect" => {
                Self::PortsToRedirect(ports::parse_port_list(value).map_err(invalid)?)
            }
            "subnets-to-ignore" => {
                Self::SubnetsToIgnore(subnets::parse_cidr_list(value).map_err(invalid)?)
            }
            "outbound-subnets-to-ignore" => {
                Self::OutboundSubnetsToIgnore(subnets::parse_cidr_list(value).map_err(invalid)?)
            }
            "ipv6" => Self::Ipv6(parse_bool(value).map_err(invalid)?),
            _ => {
                return Err(ConfigError::Unknown {
                    setting: name.to_owned(),
                });
            }
        })
    }

    /// The flag it is the value of.
    pub fn name(&self) -> &'static str {
        match self {
            Self::IncomingProxyPort(_) => "incoming-proxy-port",
            Self::OutgoingProxyPort(_) => "outgoing-proxy-port",
            Self::ProxyUid(_) => "proxy-uid",
            Self::ProxyGid(_) => "proxy-gid",
            Self::InboundPortsToIgnore(_) => "inbound-ports-to-ignore",
            Self::OutboundPortsToIgnore(_) => "outbound-ports-to-ignore",
            Self::PortsToRedirect(_) => "ports-to-redirect",
            Self::SubnetsToIgnore(_) => "subnets-to-ignore",
            Self::OutboundSubnetsToIgnore(_) => "outbound-subnets-to-ignore",
            Self::Ipv6(_) => "ipv6",
        }
    }

    /// This setting given again as `later`: a list's values add up, anything else takes the
    /// later value.
    pub fn then(self, later: Self) -> Self {
        use Setting::*;
        match (self, later) {
            (InboundPortsToIgnore(mut a), InboundPortsToIgnore(b)) => {
                a.0.extend(b.0);
                InboundPortsToIgnore(a)
            }
            (OutboundPortsToIgnore(mut a), OutboundPortsToIgnore(b)) => {
                a.0.extend(b.0);
                OutboundPortsToIgnore(a)
            }
            (PortsToRedirect(mut a), PortsToRedirect(b)) => {
                a.extend(b);
                PortsToRedirect(a)
            }
            (SubnetsToIgnore(mut a), SubnetsToIgnore(b)) => {
                a.extend(b);
                SubnetsToIgnore(a)
            }
            (OutboundSubnetsToIgnore(mut a), OutboundSubnetsToIgnore(b)) => {
                a.extend(b);
                OutboundSubnetsToIgnore(a)
            }
            (_, later) => later,
        }
    }
}

impl InterceptionConfig {
    /// Puts a setting in place; a list replaces the list there was.
    pub fn apply(&mut self, setting: Setting) {
        match setting {
            Setting::IncomingProxyPort(port) => self.incoming_proxy_port = port,
            Setting::OutgoingProxyPort(port) => self.outgoing_proxy_port = port,
            Setting::ProxyUid(id) => self.proxy_uid = id,
            Setting::ProxyGid(id) => self.proxy_gid = id,
            Setting::InboundPortsToIgnore(ports) => self.inbound_ports_to_ignore = ports,
            Setting::OutboundPortsToIgnore(ports) => self.outbound_ports_to_ignore = ports,
            Setting::PortsToRedirect(ports) => self.ports_to_redirect = ports,
            Setting::SubnetsToIgnore(nets) => self.subnets_to_ignore = nets,
            Setting::OutboundSubnetsToIgnore(nets) => self.outbound_subnets_to_ignore = nets,
            Setting::Ipv6(on) => self.ipv6 = on,
        }
    }

    /// A configuration from proxy-init's flags, each given as its settings in the order they
    /// came (a flag given twice: see [`Setting::then`]); what proxy-init leaves out is out
    /// (no proxy UID, no ignored inbound port). `None` for one of the two proxy ports names it.
    pub fn from_settings(given: impl IntoIterator<Item = Setting>) -> Result<Self, ConfigError> {
        let mut config = Self::linkerd();
        config.proxy_uid = None;
        config.inbound_ports_to_ignore = PortSet::default();
        let mut merged: Vec<Setting> = Vec::new();
        for setting in given {
            match merged.iter_mut().find(|s| s.name() == setting.name()) {
                Some(earlier) => *earlier = earlier.clone().then(setting),
                None => merged.push(setting),
            }
        }
        if let Some(missing) = FLAGS
            .iter()
            .find(|flag| flag.required && !merged.iter().any(|s| s.name() == flag.name))
        {
            return Err(ConfigError::Missing {
                setting: missing.name,
            });
        }
        for setting in merged {
            config.apply(setting);
        }
        Ok(config)
    }

    /// Reads proxy-init's flags (`-p 4143 -o 4140 -u 2102 --inbound-ports-to-ignore 4190,4191
    /// --ipv6=false`): `pod add`'s (after its `--`) and the pod records of agents before
    /// configuration was JSON. Where it could differ from proxy-init's (Go's pflag), it reads them
    /// as proxy-init does: a value follows its flag (`-p 4143`), after `=`
    /// (`--incoming-proxy-port=4143`, `-p=4143`) or, for a short flag, attached (`-p4143`); a
    /// flag given twice takes its last value, a list flag's values add up; `--ipv6` alone is true.
    /// Unlike proxy-init, `--ipv6 false` (a separate true or false) is `--ipv6=false` rather than
    /// true and a stray argument. The two proxy ports are required.
    pub fn from_proxy_init_args(args: &[String]) -> Result<Self, ConfigError> {
        let mut given = Vec::new();
        let mut args = args.iter().map(String::as_str).peekable();
        while let Some(arg) = args.next() {
            let (flag, inline) = split_flag(arg).ok_or_else(|| ConfigError::UnknownFlag {
                flag: arg.to_owned(),
            })?;
            let value = match (inline, flag.value) {
                (Some(value), _) => value,
                // A boolean flag alone (`--ipv6`) means true; a following boolean is its value.
                (None, BOOL) => match args.peek() {
                    Some(next) if parse_bool(next).is_ok() => args.next().unwrap_or("true"),
                    _ => "true",
                },
                (None, _) => args.next().ok_or(ConfigError::Invalid {
                    setting: format!("--{}", flag.name),
                    value: String::new(),
                    reason: "a value is required".into(),
                })?,
            };
            given.push(Setting::parse(flag.name, value).map_err(as_flag)?);
        }
        Self::from_settings(given)
    }
}

/// An error of a setting given as a flag names the flag.
fn as_flag(e: ConfigError) -> ConfigError {
    match e {
        ConfigError::Invalid {
            setting,
            value,
            reason,
        } => ConfigError::Invalid {
            setting: format!("--{setting}"),
            value,
            reason,
        },
        e => e,
    }
}

/// The flag an argument gives and the value it carries, if any: `--name`, `--name=value`,
/// `-p`, `-p=value`, `-pvalue`.
fn split_flag(arg: &str) -> Option<(&'static Flag, Option<&str>)> {
    if let Some(long) = arg.strip_prefix("--") {
        let (name, value) = match long.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (long, None),
        };
        return Some((find(name)?, value));
    }
    let mut chars = arg.strip_prefix('-')?.chars();
    let short = chars.next()?;
    let flag = FLAGS.iter().find(|f| f.short == Some(short))?;
    let rest = chars.as_str();
    let value = rest.strip_prefix('=').unwrap_or(rest);
    Some((flag, (!rest.is_empty()).then_some(value)))
}

/// The flags, for a message: `--incoming-proxy-port (-p), ..., --ipv6`.
pub(crate) fn flag_names() -> String {
    FLAGS
        .iter()
        .map(|flag| match flag.short {
            Some(short) => format!("--{} (-{short})", flag.name),
            None => format!("--{}", flag.name),
        })
        .collect::<Vec<_>>()
        .join(", ")
}
