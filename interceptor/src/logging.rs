//! Structured logs with `tracing`: plain text for people, JSON for log pipelines.
use tracing_subscriber::{EnvFilter, fmt};

use crate::cli::LogFormat;

pub fn init(format: LogFormat, level: &str) -> anyhow::Result<()> {
    let filter = EnvFilter::try_new(level)
        .map_err(|e| anyhow::anyhow!("--log-level={level:?} is not valid: {e}"))?;
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Plain => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
    Ok(())
}
