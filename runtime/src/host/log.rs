//! sonde's `log` interface: a plugin's records go to the host's log, tagged
//! with the probe's name, at most [`MAX_LOG_RECORDS`] records of
//! [`MAX_LOG_RECORD_BYTES`] each per call.

use super::HostState;
use crate::engine::bindings::sonde::probe::log::{self, Level};
use crate::engine::limits::{MAX_LOG_RECORD_BYTES, MAX_LOG_RECORDS};
use crate::verdict::truncate;
use std::sync::Arc;
use wasmtime::component::{HasSelf, Linker};

/// The log state of one call.
pub(crate) struct CallLog {
    probe: Arc<str>,
    records: usize,
}

impl CallLog {
    pub(crate) fn new(probe: Arc<str>) -> Self {
        Self { probe, records: 0 }
    }

    /// Counts a record and returns it cut to size, or `None` once the call
    /// has used its quota (warning once when it does).
    fn admit(&mut self, message: String) -> Option<String> {
        self.records = self.records.saturating_add(1);
        if self.records > MAX_LOG_RECORDS {
            if self.records == MAX_LOG_RECORDS + 1 {
                tracing::warn!(probe = %self.probe, max = MAX_LOG_RECORDS, "plugin log cap reached; dropping the rest of this call's records");
            }
            return None;
        }
        Some(truncate(message, MAX_LOG_RECORD_BYTES))
    }
}

pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    log::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)
}

impl log::Host for HostState {
    fn log(&mut self, level: Level, message: String) {
        let Some(message) = self.log.admit(message) else {
            return;
        };
        let probe = &*self.log.probe;
        match level {
            Level::Trace => tracing::trace!(target: "sonde::plugin", probe, "{message}"),
            Level::Debug => tracing::debug!(target: "sonde::plugin", probe, "{message}"),
            Level::Info => tracing::info!(target: "sonde::plugin", probe, "{message}"),
            Level::Warn => tracing::warn!(target: "sonde::plugin", probe, "{message}"),
            Level::Error => tracing::error!(target: "sonde::plugin", probe, "{message}"),
        }
    }
}

impl crate::engine::bindings::sonde::probe::types::Host for HostState {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_logs_at_most_its_quota_of_capped_records() {
        let mut log = CallLog::new("flood".into());
        let admitted: Vec<String> = (0..1000).filter_map(|_| log.admit("l".repeat(100 * 1024))).collect();
        assert_eq!(admitted.len(), MAX_LOG_RECORDS);
        assert!(admitted.iter().all(|m| m.len() <= MAX_LOG_RECORD_BYTES));
    }
}
