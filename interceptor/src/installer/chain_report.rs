//! The report of the chain (`--chain-report`), which the agent's readiness goes by.
use std::{
    path::{Path, PathBuf},
    sync::Mutex,
};

use interceptor_api::node_status::ChainReport;
use tracing::{debug, warn};

use super::lock;

/// Keeps the report of the chain (`--chain-report`) in step with what the installer finds: it
/// is written whole when that changes, and removed with the plugin.
pub(super) struct ChainReporter {
    path: Option<PathBuf>,
    last: Mutex<Option<ChainReport>>,
}

impl ChainReporter {
    pub fn new(path: Option<PathBuf>) -> Self {
        Self {
            path,
            last: Mutex::new(None),
        }
    }

    /// Notes an attempt's outcome: chained into a configuration, or not and why.
    pub fn note(&self, outcome: Result<&Path, &str>) {
        let Some(path) = &self.path else { return };
        let report = match outcome {
            Ok(conf) => ChainReport::chained(conf),
            Err(reason) => ChainReport::not_chained(reason),
        };
        let mut last = lock(&self.last);
        if last.as_ref() == Some(&report) {
            return;
        }
        match report.write(path) {
            Ok(()) => {
                debug!(report = %path.display(), chained = report.chained, "chain report written");
                *last = Some(report);
            }
            Err(e) => warn!(
                report = %path.display(), error = %e,
                "writing the chain report: the agent goes by the previous one (or none)"
            ),
        }
    }

    /// The plugin was removed: so is the report.
    pub fn remove(&self) {
        let Some(path) = &self.path else { return };
        match std::fs::remove_file(path) {
            Ok(()) => *lock(&self.last) = None,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => warn!(report = %path.display(), error = %e, "removing the chain report"),
        }
    }
}
