//! CIDRs for `--subnets-to-ignore` and `--outbound-subnets-to-ignore`.
use ipnet::IpNet;

/// Parses a CIDR (`10.0.0.0/8`, `fd00::/8`) or a bare address (a /32 or /128, as iptables takes
/// it). Host bits are cleared, as iptables does (`10.1.2.3/8` is `10.0.0.0/8`).
pub fn parse_cidr(s: &str) -> Result<IpNet, String> {
    let s = s.trim();
    let net = if s.contains('/') {
        s.parse::<IpNet>()
            .map_err(|e| format!("{s:?} is not a CIDR: {e}"))?
    } else {
        let addr: std::net::IpAddr = s
            .parse()
            .map_err(|_| format!("{s:?} is not a CIDR (expected e.g. 10.0.0.0/8)"))?;
        IpNet::from(addr)
    };
    Ok(net.trunc())
}

/// A comma-separated list of CIDRs; empty entries are skipped.
pub fn parse_cidr_list(s: &str) -> Result<Vec<IpNet>, String> {
    crate::entries(s).map(parse_cidr).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cidrs_and_addresses() {
        assert_eq!(parse_cidr("10.0.0.0/8").unwrap().to_string(), "10.0.0.0/8");
        assert_eq!(parse_cidr("10.1.2.3/8").unwrap().to_string(), "10.0.0.0/8");
        assert_eq!(parse_cidr("192.0.2.7").unwrap().to_string(), "192.0.2.7/32");
        assert_eq!(parse_cidr("fd00::1/8").unwrap().to_string(), "fd00::/8");
    }

    #[test]
    fn rejects_bad_cidrs_naming_the_value() {
        for bad in [
            "10.0.0.0/33",
            "10.0.0/8",
            "banana",
            "",
            "10.0.0.0/",
            "::/129",
        ] {
            let err = parse_cidr(bad).unwrap_err();
            assert!(err.contains(&format!("{bad:?}")), "{bad}: {err}");
        }
    }
}
