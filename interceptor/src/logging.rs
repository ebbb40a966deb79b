//! Structured logs with `tracing`: plain text for people, JSON for log pipelines.
use std::io::IsTerminal as _;

use tracing_subscriber::{EnvFilter, fmt};

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Plain,
    Json,
}

pub fn init(format: LogFormat, level: &str) -> anyhow::Result<()> {
    let filter = EnvFilter::try_new(level)
        .map_err(|e| anyhow::anyhow!("--log-level={level:?} is not valid: {e}"))?;
    // Colours only for a person at a terminal, not in log files or `kubectl logs`.
    let builder = fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Plain => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
    Ok(())
}
