//! Running a granted program on the host (`sonde:probe/exec`).
//!
//! Only programs in the probe's `exec` grant run; anything else returns
//! [`ProbeError::Denied`] and the host records the run as `denied`. The
//! program gets no stdin and only the granted environment, and its whole
//! process group is killed at the timeout.

use crate::ProbeError;
use crate::bindings::sonde::probe::exec::{self, Command, ExecError};
use alloc::string::ToString;
use alloc::vec::Vec;
use core::time::Duration;

/// How a program ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecOutput {
    /// Its exit code; `None` when a signal or the timeout ended it.
    pub exit_code: Option<i32>,
    /// Whether the timeout ended it.
    pub timed_out: bool,
    /// The start of its stdout (at most 4 KiB).
    pub stdout: Vec<u8>,
    /// The start of its stderr (at most 4 KiB).
    pub stderr: Vec<u8>,
}

/// Runs `argv` (an absolute program path, then its arguments) for at most
/// `timeout`.
pub fn run<S: AsRef<str>>(argv: &[S], timeout: Duration) -> Result<ExecOutput, ProbeError> {
    let cmd = Command {
        argv: argv.iter().map(|a| a.as_ref().to_string()).collect(),
        timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
    };
    match exec::run(&cmd) {
        Ok(o) => Ok(ExecOutput {
            exit_code: o.exit_code,
            timed_out: o.timed_out,
            stdout: o.stdout,
            stderr: o.stderr,
        }),
        Err(ExecError::Denied(m)) => Err(ProbeError::Denied(m)),
        Err(ExecError::Spawn(m)) => Err(ProbeError::Io(m)),
    }
}
