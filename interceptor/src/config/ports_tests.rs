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
fn bitmap_matches_membership() {
    let set = PortSet(vec![
        PortRange::single(443),
        PortRange {
            low: 6000,
            high: 6010,
        },
        PortRange::single(65535),
    ]);
    let bitmap = set.bitmap();
    for port in 1..=65535u16 {
        assert_eq!(bitmap.contains(port), set.contains(port), "port {port}");
    }
    assert_eq!(set.to_string(), "443,6000-6010,65535");
    assert!(PortSet::default().bitmap().is_empty());
}
