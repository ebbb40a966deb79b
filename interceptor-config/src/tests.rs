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
    for (flags, expected) in super::flag_cases::FLAG_CASES {
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
    for (flags, expected) in super::flag_cases::FLAG_CASES {
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
        serde_json::from_str(r#"{"incoming_proxy_port":4143,"outgoing_proxy_port":4140}"#).unwrap();
    assert!(
        minimal.ipv6 && minimal.proxy_uid.is_none() && minimal.inbound_ports_to_ignore.is_empty()
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
