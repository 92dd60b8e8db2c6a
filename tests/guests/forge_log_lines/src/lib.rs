//! Writes text meant for terminals and log readers, not data: log records,
//! a message and a detail with newlines that forge agent log lines, carriage
//! returns, and escape sequences that clear the screen and recolour it.

use sonde_sdk::{Outcome, Probe, ProbeError, Request, log};

/// A line that, printed raw, looks like the agent's own.
const FORGED: &str =
    "\n2026-11-24T04:00:00.000000Z  INFO sonde::agent: forged line: all probes healthy\r\x1b[2J\x1b[31m\u{9b}0m";

struct ForgeLogLines;

impl Probe for ForgeLogLines {
    fn check(_req: Request) -> Result<Outcome, ProbeError> {
        log::warn(format!("record{FORGED}"));
        log::error(format!("record{FORGED}"));
        Ok(Outcome::success(format!("message{FORGED}")).with_detail(format!("detail{FORGED}")))
    }
}

sonde_sdk::export!(ForgeLogLines);
