//! sonde's `log` interface: a plugin's records go to the host's log, tagged
//! with the probe's name, at most [`MAX_LOG_RECORDS`] records of
//! [`MAX_LOG_RECORD_BYTES`] each per call.

use crate::bindings::sonde::probe::log::{self, Level};
use crate::verdict::plugin_text;
use std::sync::Arc;
use wasmtime::component::{HasSelf, Linker};

/// Cap on log records per call.
pub const MAX_LOG_RECORDS: usize = 64;
/// Cap on one log record, in bytes.
pub const MAX_LOG_RECORD_BYTES: usize = 1024;

/// The log state of one call (built per call): whose records these are,
/// how many the plugin wrote, and the panic message it reported, if any.
pub(crate) struct LogCtx {
    probe: Arc<str>,
    records: usize,
    panic: Option<String>,
    /// The call's grants, for a probe that holds secrets: its records are
    /// scrubbed of them.
    secrets: Option<Arc<sonde_policy::grants::CallGrants>>,
}

impl LogCtx {
    pub(crate) fn new(probe: Arc<str>) -> Self {
        Self {
            probe,
            records: 0,
            panic: None,
            secrets: None,
        }
    }

    /// The same, scrubbing its records of the secrets `grants` holds.
    pub(crate) fn scrubbing(mut self, grants: &Arc<sonde_policy::grants::CallGrants>) -> Self {
        if grants.holds_secrets() {
            self.secrets = Some(grants.clone());
        }
        self
    }

    /// The first error record that reads as a Rust panic (`panicked at
    /// ...`): how a plugin without std reports one (the SDK's panic handler
    /// logs it, once), for the trap's report. Kept whatever the record
    /// quota, cut to a record's size, and copied once per call whatever the
    /// plugin logs.
    pub(crate) fn panic_message(&self) -> Option<&str> {
        self.panic.as_deref()
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
        let mut text = plugin_text(message, MAX_LOG_RECORD_BYTES);
        if let Some(s) = self.secrets.as_ref().and_then(|g| g.scrubber()) {
            s.string(&mut text);
        }
        Some(text)
    }
}

/// Adds the `log` interface to `linker` (the once-per-process phase);
/// `get` finds the call's [`LogCtx`] in the store's data.
pub(crate) fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    get: fn(&mut T) -> &mut LogCtx,
) -> wasmtime::Result<()> {
    log::add_to_linker::<T, HasSelf<LogCtx>>(linker, get)
}

impl log::Host for LogCtx {
    fn log(&mut self, level: Level, message: String) -> wasmtime::Result<()> {
        // Cut before it is kept: the copy is of a record's size, not of
        // whatever the plugin sent (cutting again in `admit` changes nothing).
        let message = if self.panic.is_none() && matches!(level, Level::Error) && message.starts_with("panicked") {
            let cut = plugin_text(message, MAX_LOG_RECORD_BYTES);
            self.panic = Some(cut.clone());
            cut
        } else {
            message
        };
        let Some(message) = self.admit(message) else {
            return Ok(());
        };
        let probe = &*self.probe;
        match level {
            Level::Trace => tracing::trace!(target: "sonde::plugin", probe, "{message}"),
            Level::Debug => tracing::debug!(target: "sonde::plugin", probe, "{message}"),
            Level::Info => tracing::info!(target: "sonde::plugin", probe, "{message}"),
            Level::Warn => tracing::warn!(target: "sonde::plugin", probe, "{message}"),
            Level::Error => tracing::error!(target: "sonde::plugin", probe, "{message}"),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_logs_at_most_its_quota_of_capped_records() {
        let mut log = LogCtx::new("flood".into());
        let admitted: Vec<String> = (0..1000).filter_map(|_| log.admit("l".repeat(100 * 1024))).collect();
        assert_eq!(admitted.len(), MAX_LOG_RECORDS);
        assert!(admitted.iter().all(|m| m.len() <= MAX_LOG_RECORD_BYTES));
    }

    #[test]
    fn the_first_panic_record_is_kept_past_the_quota_and_cut_to_size() {
        use log::Host;
        let mut log = LogCtx::new("p".into());
        log.log(Level::Warn, "panicked at but only a warning".into()).unwrap();
        assert_eq!(log.panic_message(), None);
        for _ in 0..2 * MAX_LOG_RECORDS {
            log.log(Level::Error, "not a panic".into()).unwrap();
        }
        log.log(
            Level::Error,
            format!("panicked at src/lib.rs:1:1: {}", "x".repeat(4096)),
        )
        .unwrap();
        log.log(Level::Error, "panicked at a later record".into()).unwrap();
        let panic = log.panic_message().unwrap();
        assert!(panic.starts_with("panicked at src/lib.rs:1:1: x"), "{panic}");
        assert!(panic.len() <= MAX_LOG_RECORD_BYTES, "{}", panic.len());
    }
}
