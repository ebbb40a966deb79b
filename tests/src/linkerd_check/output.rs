//! Reading `check --output=json` as Linkerd reads it (`parseJSONCheckOutput`,
//! `cli/cmd/check_extensions.go:277-300`): a check failed if its `error` is not empty, and is a
//! warning if its `result` is `warning`.
use serde_json::Value;

/// Asserts `json` has Linkerd's `CheckOutput` shape exactly (no field it does not know, each
/// it needs), and that each check's `error` and `result` agree as Linkerd reads them.
pub fn assert_linkerd_shape(json: &Value) {
    let keys = |v: &Value| -> Vec<String> {
        let mut keys: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        keys
    };
    assert_eq!(keys(json), ["categories", "success"], "{json:#}");
    assert!(json["success"].is_boolean());
    for category in json["categories"].as_array().unwrap() {
        assert_eq!(keys(category), ["categoryName", "checks"], "{category:#}");
        for check in category["checks"].as_array().unwrap() {
            let result = check["result"].as_str().unwrap();
            let failed = check.get("error").is_some();
            match result {
                "success" => assert_eq!(keys(check), ["description", "result"], "{check:#}"),
                "warning" | "error" => {
                    assert_eq!(
                        keys(check),
                        ["description", "error", "hint", "result"],
                        "{check:#}"
                    );
                    assert!(failed && !check["error"].as_str().unwrap().is_empty());
                }
                other => panic!("result {other:?} is not Linkerd's: {check:#}"),
            }
        }
    }
}

/// The check whose description starts with `description` (a success's may go on with what it
/// found).
pub fn check<'a>(json: &'a Value, description: &str) -> &'a Value {
    json["categories"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["checks"].as_array().unwrap())
        .find(|c| c["description"].as_str().unwrap().starts_with(description))
        .unwrap_or_else(|| panic!("no check {description:?} in {json:#}"))
}

/// A check's error, empty when it passed.
pub fn error(check: &Value) -> &str {
    check["error"].as_str().unwrap_or_default()
}
