use serde_json::json;

use super::*;
use crate::health::{CATEGORY, CheckResult, Outcome, Severity};

fn result(description: &str, outcome: Outcome) -> CheckResult {
    CheckResult {
        category: CATEGORY,
        description: description.to_owned(),
        hint: "the agent's log".to_owned(),
        outcome,
    }
}

fn failure(severity: Severity, message: &str) -> Outcome {
    Outcome::Failure {
        severity,
        message: message.to_owned(),
    }
}

/// The field names and omissions of linkerd2 `pkg/healthcheck/healthcheck_output.go`:
/// `CheckOutput` (:71-74) `success`, `categories`; `CheckCategory` (:77-80) `categoryName`,
/// `checks`; `Check` (:84-89) `description`, `hint,omitempty`, `error,omitempty`, `result`;
/// `CheckResultStr` (:199-203) `success`, `warning`, `error`; and `runChecksJSON` (:205-257),
/// which sets `error` and `hint` only on a failure.
#[test]
fn the_json_has_linkerds_field_names() {
    let results = [
        result("passes", Outcome::Success),
        result("warns", failure(Severity::Warning, "maybe")),
        result("fails", failure(Severity::Error, "broken")),
    ];
    let json = serde_json::to_value(CheckOutput::new(&results)).unwrap();
    assert_eq!(
        json,
        json!({
            "success": false,
            "categories": [{
                "categoryName": "linkerd-interceptor",
                "checks": [
                    { "description": "passes", "result": "success" },
                    {
                        "description": "warns",
                        "hint": "the agent's log",
                        "error": "maybe",
                        "result": "warning",
                    },
                    {
                        "description": "fails",
                        "hint": "the agent's log",
                        "error": "broken",
                        "result": "error",
                    },
                ],
            }],
        })
    );
    // Warnings alone pass, as in Linkerd's `RunChecks` (:93-108).
    let json = serde_json::to_value(CheckOutput::new(&results[..2])).unwrap();
    assert_eq!(json["success"], true);
    // And it reads back.
    let back: CheckOutput = serde_json::from_value(json).unwrap();
    assert_eq!(back.categories[0].checks[1].result, ResultStr::Warning);
}

fn printed(format: Format, results: &[CheckResult]) -> String {
    let mut out = Vec::new();
    let mut printer = Printer::new(&mut out, format, false);
    for result in results {
        printer.result(result).unwrap();
    }
    printer.finish(results).unwrap();
    String::from_utf8(out).unwrap()
}

/// As `runChecksTable`, `printResultDescription` and `PrintChecksResult` (:133-194, :259-270,
/// :110-122) print them.
#[test]
fn the_table_is_linkerds() {
    let results = [
        result("passes", Outcome::Success),
        result("fails", failure(Severity::Error, "broken\n\t* node-a")),
    ];
    assert_eq!(
        printed(Format::Table, &results),
        "linkerd-interceptor\n-------------------\n\u{221A} passes\n\u{00D7} fails\n    broken\n\t* \
         node-a\n    see the agent's log for hints\n\nStatus check results \
         are \u{00D7}\n"
    );
    // Short: only what did not pass; nothing at all, not even the blank line, when all did.
    assert_eq!(
        printed(Format::Short, &results[..1]),
        "Status check results are \u{221A}\n"
    );
    assert!(printed(Format::Short, &results).starts_with("linkerd-interceptor\n---"));
    assert!(!printed(Format::Short, &results).contains("passes"));
}
