//! The checks' results as Linkerd writes them: its JSON (what `linkerd check` reads from an
//! extension), its table, and its short table (only what did not pass).
//!
//! The JSON is Linkerd's `CheckOutput` (linkerd2 `pkg/healthcheck/healthcheck_output.go:70-89`);
//! `linkerd check` parses it in `parseJSONCheckOutput` (`cli/cmd/check_extensions.go:277-300`),
//! where a check failed if and only if its `error` is not empty, and is a warning when its
//! `result` is `warning`; the top-level `success` is not read there.
use std::io::{self, IsTerminal as _, Write};

use serde::{Deserialize, Serialize};

use super::{CheckResult, Outcome, Severity};

/// Linkerd's `CheckOutput`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckOutput {
    pub success: bool,
    pub categories: Vec<CheckCategory>,
}

/// Linkerd's `CheckCategory`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckCategory {
    #[serde(rename = "categoryName")]
    pub name: String,
    pub checks: Vec<Check>,
}

/// Linkerd's `Check`: `hint` and `error` only when the check did not pass (`omitempty`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    pub description: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hint: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
    pub result: ResultStr,
}

/// Linkerd's `CheckResultStr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResultStr {
    Success,
    Warning,
    Error,
}

impl CheckOutput {
    /// The results in order, each category once where its checks follow one another, as
    /// Linkerd's `runChecksJSON` groups them.
    pub fn new(results: &[CheckResult]) -> Self {
        let mut categories: Vec<CheckCategory> = Vec::new();
        for result in results {
            if categories.last().is_none_or(|c| c.name != result.category) {
                categories.push(CheckCategory {
                    name: result.category.to_owned(),
                    checks: Vec::new(),
                });
            }
            let (result_str, error, hint) = match &result.outcome {
                Outcome::Success => (ResultStr::Success, String::new(), String::new()),
                Outcome::Failure { severity, message } => (
                    match severity {
                        Severity::Warning => ResultStr::Warning,
                        Severity::Error => ResultStr::Error,
                    },
                    message.clone(),
                    result.hint.clone(),
                ),
            };
            categories
                .last_mut()
                .expect("pushed above")
                .checks
                .push(Check {
                    description: result.description.clone(),
                    hint,
                    error,
                    result: result_str,
                });
        }
        Self {
            success: super::success(results),
            categories,
        }
    }
}

/// How the results are shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Every check, under its category's name (`linkerd check`'s default).
    Table,
    /// Only the checks that did not pass.
    Short,
    /// [`CheckOutput`], once all checks ran.
    Json,
}

/// Writes results as they come, as Linkerd's `RunChecks` does (`healthcheck_output.go:125-194`),
/// then the closing line.
pub struct Printer<W: Write> {
    out: W,
    format: Format,
    colour: bool,
    last_category: Option<&'static str>,
    /// A retry's line is on screen, to be cleared by the next one.
    transient: bool,
}

impl Printer<io::Stdout> {
    /// To stdout, in colour and with retries shown only on a terminal (and without `NO_COLOR`).
    pub fn stdout(format: Format) -> Self {
        let terminal = io::stdout().is_terminal();
        let colour = terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
        Self::new(io::stdout(), format, colour)
    }
}

impl<W: Write> Printer<W> {
    pub fn new(out: W, format: Format, colour: bool) -> Self {
        Self {
            out,
            format,
            colour,
            last_category: None,
            transient: false,
        }
    }

    fn status(&self, outcome: &Outcome) -> String {
        let (symbol, colour) = match outcome {
            Outcome::Success => ("\u{221A}", "32"),
            Outcome::Failure {
                severity: Severity::Warning,
                ..
            } => ("\u{203C}", "33"),
            Outcome::Failure {
                severity: Severity::Error,
                ..
            } => ("\u{00D7}", "31"),
        };
        if self.colour {
            format!("\x1b[1;{colour}m{symbol}\x1b[0m")
        } else {
            symbol.to_owned()
        }
    }

    fn clear_transient(&mut self) -> io::Result<()> {
        if self.transient {
            write!(self.out, "\r\x1b[2K")?;
            self.transient = false;
        }
        Ok(())
    }

    /// A check that failed and is tried again: shown (on a terminal) until the next line.
    pub fn retrying(&mut self, result: &CheckResult) -> io::Result<()> {
        if self.format == Format::Json || !self.colour {
            return Ok(());
        }
        self.category(result.category)?;
        self.clear_transient()?;
        let first = match &result.outcome {
            Outcome::Failure { message, .. } => message.lines().next().unwrap_or_default(),
            Outcome::Success => "",
        };
        write!(self.out, "\u{2026} {}: {first}", result.description)?;
        self.transient = true;
        self.out.flush()
    }

    fn category(&mut self, category: &'static str) -> io::Result<()> {
        if self.last_category == Some(category) {
            return Ok(());
        }
        self.clear_transient()?;
        if self.last_category.is_some() {
            writeln!(self.out)?;
        }
        writeln!(self.out, "{category}")?;
        writeln!(self.out, "{}", "-".repeat(category.len()))?;
        self.last_category = Some(category);
        Ok(())
    }

    /// A check's final result.
    pub fn result(&mut self, result: &CheckResult) -> io::Result<()> {
        match self.format {
            Format::Json => return Ok(()),
            Format::Short if result.outcome == Outcome::Success => return Ok(()),
            Format::Table | Format::Short => {}
        }
        self.category(result.category)?;
        self.clear_transient()?;
        writeln!(
            self.out,
            "{} {}",
            self.status(&result.outcome),
            result.description
        )?;
        if let Outcome::Failure { message, .. } = &result.outcome {
            writeln!(self.out, "    {message}")?;
            if !result.hint.is_empty() {
                writeln!(self.out, "    see {} for hints", result.hint)?;
            }
        }
        self.out.flush()
    }

    /// After the last check: the JSON, or the table's closing line (`PrintChecksResult`).
    pub fn finish(&mut self, results: &[CheckResult]) -> io::Result<()> {
        self.clear_transient()?;
        let success = super::success(results);
        match self.format {
            Format::Json => {
                let json = serde_json::to_string_pretty(&CheckOutput::new(results))
                    .map_err(io::Error::other)?;
                writeln!(self.out, "{json}")?;
            }
            Format::Table | Format::Short => {
                let warning = results.iter().any(|r| {
                    matches!(
                        r.outcome,
                        Outcome::Failure {
                            severity: Severity::Warning,
                            ..
                        }
                    )
                });
                // As Linkerd: a blank line after the checks, unless short output had nothing
                // to show.
                if self.format != Format::Short || !success || warning {
                    writeln!(self.out)?;
                }
                let status = self.status(&if success {
                    Outcome::Success
                } else {
                    Outcome::Failure {
                        severity: Severity::Error,
                        message: String::new(),
                    }
                });
                writeln!(self.out, "Status check results are {status}")?;
            }
        }
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
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
}
