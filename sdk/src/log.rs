//! Logging into the host's log. Each record is tagged with the probe's name;
//! the host caps how many records and how many bytes one call may log.

use crate::bindings::sonde::probe::log::{Level, log};

/// Logs at `trace` level.
pub fn trace(message: impl AsRef<str>) {
    log(Level::Trace, message.as_ref());
}

/// Logs at `debug` level.
pub fn debug(message: impl AsRef<str>) {
    log(Level::Debug, message.as_ref());
}

/// Logs at `info` level.
pub fn info(message: impl AsRef<str>) {
    log(Level::Info, message.as_ref());
}

/// Logs at `warn` level.
pub fn warn(message: impl AsRef<str>) {
    log(Level::Warn, message.as_ref());
}

/// Logs at `error` level.
pub fn error(message: impl AsRef<str>) {
    log(Level::Error, message.as_ref());
}
