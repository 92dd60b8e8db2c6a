//! sonde's `exec` interface: the host runs a program for the plugin.
//!
//! Only programs named in the probe's `exec` grant run, compared as exact
//! absolute paths; anything else is a recorded denial and is never started.
//! The program runs contained ([`super::contain`]: a cgroup per run, else
//! a subreaper supervisor) with no stdin and only the granted environment;
//! its stdout and stderr are kept up to [`MAX_OUTPUT_BYTES`] each (the rest
//! is read and dropped so it never blocks on a full pipe). When the program
//! exits, its timeout or the call's deadline passes, or the call is
//! dropped, everything it started dies — children in a session of their
//! own and double forks included — and output is never awaited past the
//! timeout.

use super::contain::{Containment, RunCgroup, RunLimits};
use super::spawn::{self, How, Started};
use crate::bindings::sonde::probe::exec::{self, Command, ExecError, Output};
use rustix::process::Signal;
use sonde_policy::grants::{CallGrants, Use};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt};
use wasmtime::component::{HasData, Linker};

/// How much of each output stream the plugin gets.
pub const MAX_OUTPUT_BYTES: usize = 4 * 1024;

/// What `exec` sees of one call: its grants (the programs and their
/// environment) and its deadline, which no program outlives.
pub(crate) struct ExecView<'a> {
    /// The call's grants.
    pub(crate) grants: &'a CallGrants,
    /// When the call ends.
    pub(crate) deadline: Instant,
    /// What bounds each program's cgroup: the probe's memory cap and the
    /// agent's `sandbox.exec_pids`.
    pub(crate) run_limits: RunLimits,
}

struct Exec;

impl HasData for Exec {
    type Data<'a> = ExecView<'a>;
}

/// Adds the `exec` interface to `linker` (the once-per-process phase);
/// `get` gives the view of the call in the store's data.
pub(crate) fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    get: fn(&mut T) -> ExecView<'_>,
) -> wasmtime::Result<()> {
    exec::add_to_linker::<T, Exec>(linker, get)
}

/// Reads up to `MAX_OUTPUT_BYTES` into `kept` and drains the rest, until
/// the end of the stream (the future is cut off at the run's timeout).
async fn capture(mut stream: impl AsyncRead + Unpin, kept: &mut Vec<u8>) {
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let room = MAX_OUTPUT_BYTES.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
}

/// How a program run by the host ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramOutput {
    /// Its exit code; none when a signal or the timeout ended it.
    pub exit_code: Option<i32>,
    /// Whether the timeout ended it.
    pub timed_out: bool,
    /// The start of its stdout, at most [`MAX_OUTPUT_BYTES`].
    pub stdout: Vec<u8>,
    /// The start of its stderr, at most [`MAX_OUTPUT_BYTES`].
    pub stderr: Vec<u8>,
}

/// Runs `argv` (an absolute program path, then its arguments) contained
/// as [`Containment::in_force`] says, with no stdin, only `env`, and `/` as
/// its directory; ends the whole run — the program and everything it
/// started — at `timeout`, at exit, or when the future is dropped. Output is
/// read until the run ends, never past `timeout`. The caller checks that
/// the program is allowed.
/// Where runs get a cgroup, `limits` bound it.
pub async fn run_program(
    argv: &[String],
    env: &[(String, String)],
    timeout: Duration,
    limits: RunLimits,
) -> Result<ProgramOutput, RunError> {
    run_contained(argv, env, timeout, Containment::in_force(), limits).await
}

/// [`run_program`] in a given containment mode (tests force each mode).
pub async fn run_contained(
    argv: &[String],
    env: &[(String, String)],
    timeout: Duration,
    containment: &Containment,
    limits: RunLimits,
) -> Result<ProgramOutput, RunError> {
    let Some(program) = argv.first() else {
        return Err(RunError::EmptyArgv);
    };
    let program = || program.clone();
    let deadline = tokio::time::Instant::now() + timeout;
    // Dropped with the call (cancelled at its deadline), the cgroup kills
    // every process in it, and the `Process` its supervisor (which sweeps)
    // or its program.
    let mut cgroup = match containment {
        Containment::Cgroup {
            parent,
            limits: controllers,
        } => Some(
            RunCgroup::create(parent, controllers, limits).map_err(|source| RunError::Cgroup {
                program: program(),
                source,
            })?,
        ),
        Containment::Subreaper => None,
    };
    let how = match &cgroup {
        Some(cgroup) => How::Cgroup(cgroup.procs()),
        None => How::Supervised,
    };
    let Started {
        mut process,
        stdout,
        stderr,
    } = spawn::start(argv, env, how).map_err(|source| RunError::Start {
        program: program(),
        source,
    })?;
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let reading = async { tokio::join!(capture(stdout, &mut out), capture(stderr, &mut err)) };
    let running = async {
        let status = tokio::time::timeout_at(deadline, process.wait()).await;
        // At exit too: what the program left behind dies with it, and the
        // output pipes close. A supervisor has swept its run before it
        // exits; told to end early, it sweeps, then exits.
        match cgroup.take() {
            Some(cgroup) => cgroup.end().await,
            None if status.is_err() => process.signal(Signal::TERM),
            None => {}
        }
        if status.is_err() {
            let _ = process.wait().await;
        }
        status
    };
    // Output is read while the program runs, and not past its timeout
    // (whatever still holds the pipes then is being killed).
    let (status, _) = tokio::join!(running, tokio::time::timeout_at(deadline, reading));
    let (exit_code, timed_out) = match status {
        Ok(Ok(code)) => (code, false),
        Ok(Err(source)) => {
            return Err(RunError::Wait {
                program: program(),
                source,
            });
        }
        Err(_) => (None, true),
    };
    Ok(ProgramOutput {
        exit_code,
        timed_out,
        stdout: out,
        stderr: err,
    })
}

/// Why [`run_program`] could not run a program; each names it.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// No program was named.
    #[error("empty argv")]
    EmptyArgv,
    /// Its cgroup could not be made.
    #[error("{program}: creating its cgroup: {source}")]
    Cgroup {
        /// The program's path.
        program: String,
        /// What the cgroup filesystem said.
        source: std::io::Error,
    },
    /// It could not be started (not an absolute path, not found, not
    /// executable...).
    #[error("{program}: {source}")]
    Start {
        /// The program's path.
        program: String,
        /// Why, as the kernel said (or the check before it).
        source: std::io::Error,
    },
    /// Waiting for it failed.
    #[error("{program}: waiting: {source}")]
    Wait {
        /// The program's path.
        program: String,
        /// What the wait said.
        source: std::io::Error,
    },
}

impl exec::Host for ExecView<'_> {
    async fn run(&mut self, cmd: Command) -> wasmtime::Result<Result<Output, ExecError>> {
        Ok(self.run_checked(cmd).await)
    }
}

impl ExecView<'_> {
    async fn run_checked(&self, cmd: Command) -> Result<Output, ExecError> {
        let Some(program) = cmd.argv.first() else {
            return Err(ExecError::Spawn("empty argv".into()));
        };
        self.grants
            .authorize(Use::Exec(program))
            .map_err(|d| ExecError::Denied(d.0))?;
        let left = self.deadline.saturating_duration_since(Instant::now());
        let timeout = Duration::from_millis(cmd.timeout_ms).min(left);
        let out = run_program(&cmd.argv, &self.grants.config().env, timeout, self.run_limits)
            .await
            .map_err(|e| ExecError::Spawn(e.to_string()))?;
        Ok(Output {
            exit_code: out.exit_code,
            timed_out: out.timed_out,
            stdout: out.stdout,
            stderr: out.stderr,
        })
    }
}
