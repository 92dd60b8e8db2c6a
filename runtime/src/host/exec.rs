//! sonde's `exec` interface: the host runs a program for the plugin.
//!
//! Only programs named in the probe's `exec` grant run, compared as exact
//! absolute paths; anything else is a recorded denial and is never started.
//! The program runs in its own process group with no stdin and only the
//! granted environment; its stdout and stderr are kept up to
//! [`MAX_OUTPUT_BYTES`] each (the rest is read and dropped so it never
//! blocks on a full pipe). When its timeout or the call's deadline passes,
//! or the call is dropped, the whole group is killed — a hung check's
//! children do not outlive it. The group is also killed when the program
//! exits, so nothing it left in the background survives the check.

use super::grants::{CallGrants, Use};
use crate::bindings::sonde::probe::exec::{self, Command, ExecError, Output};
use std::process::Stdio;
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

/// Kills the whole process group when dropped: on timeout, on exit, and when
/// the call itself is cancelled at its deadline.
struct GroupGuard(Option<rustix::process::Pid>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pgid) = self.0 {
            // ESRCH (the group is already gone) is the common case.
            let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
        }
    }
}

/// Reads up to `MAX_OUTPUT_BYTES` and drains the rest.
async fn capture(mut stream: impl AsyncRead + Unpin) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return kept,
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

/// Runs `argv` (an absolute program path, then its arguments) in a process
/// group of its own, with no stdin, only `env`, and `/` as its directory;
/// kills the whole group at `timeout`, at exit, or when the future is
/// dropped. The caller checks that the program is allowed.
pub async fn run_program(
    argv: &[String],
    env: &[(String, String)],
    timeout: Duration,
) -> Result<ProgramOutput, String> {
    let Some(program) = argv.first() else {
        return Err("empty argv".into());
    };
    let mut child = tokio::process::Command::new(program)
        .args(&argv[1..])
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("{program}: {e}"))?;
    let group = GroupGuard(child.id().and_then(|id| rustix::process::Pid::from_raw(id as i32)));
    let stdout = tokio::spawn(capture(child.stdout.take().expect("stdout is piped")));
    let stderr = tokio::spawn(capture(child.stderr.take().expect("stderr is piped")));
    let (exit_code, timed_out) = match tokio::time::timeout(timeout, child.wait()).await {
        Ok(Ok(status)) => (status.code(), false),
        Ok(Err(e)) => return Err(format!("{program}: waiting: {e}")),
        Err(_) => (None, true),
    };
    // Killing the group closes every writer of the pipes, so the readers
    // finish.
    drop(group);
    let _ = child.wait().await;
    Ok(ProgramOutput {
        exit_code,
        timed_out,
        stdout: stdout.await.unwrap_or_default(),
        stderr: stderr.await.unwrap_or_default(),
    })
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
        let out = run_program(&cmd.argv, &self.grants.config().env, timeout)
            .await
            .map_err(ExecError::Spawn)?;
        Ok(Output {
            exit_code: out.exit_code,
            timed_out: out.timed_out,
            stdout: out.stdout,
            stderr: out.stderr,
        })
    }
}
