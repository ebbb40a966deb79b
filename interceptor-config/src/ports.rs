//! Ports and port ranges as proxy-init takes them: `4190,4191,25-30`.
use std::{fmt, str::FromStr};

/// An inclusive range of TCP ports; a single port is a range of one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PortRange {
    pub low: u16,
    pub high: u16,
}

impl PortRange {
    pub fn single(port: u16) -> Self {
        Self {
            low: port,
            high: port,
        }
    }

    pub fn is_single(&self) -> bool {
        self.low == self.high
    }

    pub fn ports(&self) -> impl Iterator<Item = u16> {
        self.low..=self.high
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_single() {
            write!(f, "{}", self.low)
        } else {
            write!(f, "{}-{}", self.low, self.high)
        }
    }
}

/// Parses one port: a decimal number in 1..=65535.
pub fn parse_port(s: &str) -> Result<u16, String> {
    let s = s.trim();
    let n: u32 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a port number (1-65535)"))?;
    match u16::try_from(n) {
        Ok(p) if p >= 1 => Ok(p),
        _ => Err(format!("port {n} is out of range (1-65535)")),
    }
}

impl FromStr for PortRange {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        match s.split_once('-') {
            None => parse_port(s).map(Self::single),
            Some((low, high)) => {
                let (low, high) = (parse_port(low)?, parse_port(high)?);
                if low > high {
                    return Err(format!("range {s:?} has its low end above its high end"));
                }
                Ok(Self { low, high })
            }
        }
    }
}

/// Ports and ranges in the order the user gave them (the iptables rules keep that order).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortSet(pub Vec<PortRange>);

impl PortSet {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn contains(&self, port: u16) -> bool {
        self.0.iter().any(|r| (r.low..=r.high).contains(&port))
    }

    /// Every port of every range.
    pub fn ports(&self) -> impl Iterator<Item = u16> + '_ {
        self.0.iter().flat_map(PortRange::ports)
    }
}

/// A comma-separated list of ports and ranges (`4190,4191,25-30`); empty entries are skipped
/// (`""` is how charts pass "none").
impl FromStr for PortSet {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        crate::entries(s)
            .map(str::parse::<PortRange>)
            .collect::<Result<_, _>>()
            .map(Self)
    }
}

/// A comma-separated list of single ports (`--ports-to-redirect` takes no ranges).
pub fn parse_port_list(s: &str) -> Result<Vec<u16>, String> {
    crate::entries(s).map(parse_port).collect()
}

impl fmt::Display for PortSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ports_and_ranges() {
        assert_eq!("80".parse(), Ok(PortRange::single(80)));
        assert_eq!(" 25-30 ".parse(), Ok(PortRange { low: 25, high: 30 }));
        assert_eq!(
            "1-65535".parse(),
            Ok(PortRange {
                low: 1,
                high: 65535
            })
        );
        assert_eq!("7-7".parse(), Ok(PortRange::single(7)));
    }

    #[test]
    fn rejects_bad_ports_naming_the_value() {
        for (input, needle) in [
            ("0", "port 0 is out of range"),
            ("65536", "port 65536 is out of range"),
            ("http", "\"http\" is not a port number"),
            ("", "\"\" is not a port number"),
            ("30-25", "low end above its high end"),
            ("-5", "\"\" is not a port number"),
            ("5-", "\"\" is not a port number"),
            ("1-2-3", "\"2-3\" is not a port number"),
        ] {
            let err = input.parse::<PortRange>().unwrap_err();
            assert!(err.contains(needle), "{input:?}: {err}");
        }
    }

    #[test]
    fn sets_parse_lists_and_print_back() {
        let set: PortSet = " 443, 6000-6010 ,,65535".parse().unwrap();
        assert_eq!(set.to_string(), "443,6000-6010,65535");
        assert!(set.contains(6005) && !set.contains(6011));
        assert_eq!(set.ports().count(), 13);
        assert_eq!("".parse::<PortSet>(), Ok(PortSet::default()));
        assert!(
            "443,http"
                .parse::<PortSet>()
                .unwrap_err()
                .contains("\"http\"")
        );
        assert_eq!(parse_port_list("80, 443"), Ok(vec![80, 443]));
        assert!(parse_port_list("80-90").is_err());
    }
}
