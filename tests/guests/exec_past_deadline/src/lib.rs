//! Asks the host to run its configured program for an hour, far past the
//! call's deadline: the host must stop the call and kill the program's
//! whole process group.

use serde::Deserialize;
use sonde_sdk::{Outcome, Probe, ProbeError, Request, exec};
use std::time::Duration;

#[derive(Deserialize)]
struct Config {
    command: Vec<String>,
}

struct ExecPastDeadline;

impl Probe for ExecPastDeadline {
    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let config: Config = req.config()?;
        let out = exec::run(&config.command, Duration::from_secs(3600))?;
        Ok(Outcome::success(format!("{out:?}")))
    }
}

sonde_sdk::export!(ExecPastDeadline);
