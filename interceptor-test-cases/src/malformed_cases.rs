//! A node's CNI files that no installer can change, and what the error must say is wrong: the
//! one list that the installer's tests (`interceptor-cni`) and the CLI's (`cni install`, `cni
//! uninstall`, the watching installer, in `tests/tests/cni_malformed.rs`) both run.

/// One case: the file's name in the conf directory, what it holds, and a piece of the error.
pub type MalformedCase = (&'static str, &'static str, &'static str);

pub const MALFORMED: &[MalformedCase] = &[
    (
        "10-net.conflist",
        r#"{"cniVersion": "1.0.0", "name": "n", "plugins": ["loopback", {"type": "interceptor-cni"}]}"#,
        r#"plugin 0 of "plugins" is a string where an object belongs"#,
    ),
    (
        "10-net.conflist",
        r#"{"cniVersion": "1.0.0", "name": "n", "type": "loopback"}"#,
        r#"no "plugins" list"#,
    ),
    (
        "10-net.conflist",
        r#"{"cniVersion": "1.0.0", "name": "n", "plugins": {"type": "loopback"}}"#,
        r#""plugins" is an object, not a list"#,
    ),
    (
        "10-net.conflist",
        r#"{"cniVersion": "1.0.0", "name": "n", "plugins": "loopback"}"#,
        r#""plugins" is a string, not a list"#,
    ),
    (
        "10-net.conflist",
        r#"{"cniVersion": "1.0.0", "plugins": []}"#,
        r#"the "plugins" list is empty"#,
    ),
    (
        "10-net.conflist",
        r#"{"plugins": [{"type": "loopback"}, {"name": "x"}]}"#,
        r#"plugin 1 of "plugins" has no "type""#,
    ),
    (
        "10-net.conflist",
        r#"{"plugins": [{"type": 7}]}"#,
        r#"plugin 0 of "plugins" has a "type" that is a number, not a string"#,
    ),
    (
        "10-net.conflist",
        r#"[{"type": "loopback"}]"#,
        "a list where a JSON object belongs",
    ),
    (
        "10-net.conflist",
        r#"{"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "loopback"}"#,
        "not JSON",
    ),
    ("10-net.conflist", "", "the file is empty"),
    ("10-net.conflist", " \n", "the file is empty"),
    (
        "10-net.conf",
        r#"["loopback"]"#,
        "a list where a JSON object belongs",
    ),
    (
        "10-net.conf",
        r#""loopback""#,
        "a string where a JSON object belongs",
    ),
    (
        "10-net.conf",
        r#"{"name": "n"}"#,
        r#"the plugin has no "type""#,
    ),
];
