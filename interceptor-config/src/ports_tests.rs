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
