//! The agent's hold on a child: its pidfd, waited on without
//! `waitpid(-1)`, signalled and reaped in the background when dropped.

use super::stack::Stack;

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use tokio::io::unix::AsyncFd;

/// A child of the agent, held by its pidfd. Dropped before it has been
/// reaped, it is signalled (`SIGTERM` to a supervisor, which then sweeps
/// its run; `SIGKILL` to a program) and reaped in the background, and only
/// then is its stack unmapped.
pub(crate) struct Process {
    pidfd: Option<AsyncFd<OwnedFd>>,
    stack: Option<Stack>,
    reaped: bool,
    on_drop: rustix::process::Signal,
}

/// How a child ended: its exit code, or none when a signal ended it.
pub(crate) type ExitCode = Option<i32>;

/// Reaps the child of `pidfd` if it has exited (or, with `block`, once it
/// has): its exit code.
pub(super) fn reap(pidfd: BorrowedFd<'_>, block: bool) -> rustix::io::Result<Option<ExitCode>> {
    use rustix::process::{WaitId, WaitIdOptions, waitid};
    let options = match block {
        true => WaitIdOptions::EXITED,
        false => WaitIdOptions::EXITED | WaitIdOptions::NOHANG,
    };
    Ok(waitid(WaitId::PidFd(pidfd), options)?.map(|status| status.exit_status()))
}

impl Process {
    /// Holds the child of `pidfd`, which has executed its program (or is
    /// the supervisor of one, which keeps its `stack`). If the pidfd cannot
    /// be registered with the runtime, the child is ended and reaped.
    pub(super) fn held(pidfd: OwnedFd, stack: Stack, supervised: bool) -> io::Result<Self> {
        let on_drop = match supervised {
            true => rustix::process::Signal::TERM,
            false => rustix::process::Signal::KILL,
        };
        // SAFETY: the `AsyncFd` owns the descriptor, which stays open until
        // the registration is gone.
        #[allow(unsafe_code, reason = "registering the pidfd the AsyncFd owns")]
        let registered = unsafe { AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE) };
        let pidfd = match registered {
            Ok(pidfd) => pidfd,
            Err(e) => {
                let (pidfd, e) = e.into_parts();
                let _ = rustix::process::pidfd_send_signal(&pidfd, on_drop);
                let _ = reap(pidfd.as_fd(), true);
                return Err(e);
            }
        };
        Ok(Self {
            pidfd: Some(pidfd),
            // A program that has executed no longer needs its stack.
            stack: match supervised {
                true => Some(stack),
                false => {
                    stack.release();
                    None
                }
            },
            reaped: false,
            on_drop,
        })
    }

    /// Waits for the child to exit and reaps it.
    pub(crate) async fn wait(&mut self) -> io::Result<ExitCode> {
        let (false, Some(pidfd)) = (self.reaped, &self.pidfd) else {
            return Err(io::Error::other("already reaped"));
        };
        loop {
            let mut ready = pidfd.readable().await?;
            match reap(pidfd.get_ref().as_fd(), false) {
                Ok(Some(code)) => {
                    self.reaped = true;
                    if let Some(stack) = self.stack.take() {
                        stack.release();
                    }
                    return Ok(code);
                }
                Ok(None) => ready.clear_ready(),
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Sends `signal` to the child (nothing once it has been reaped).
    pub(crate) fn signal(&self, signal: rustix::process::Signal) {
        if let (false, Some(pidfd)) = (self.reaped, &self.pidfd) {
            let _ = rustix::process::pidfd_send_signal(pidfd.get_ref(), signal);
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        self.signal(self.on_drop);
        let (Some(pidfd), stack) = (self.pidfd.take(), self.stack.take()) else {
            return;
        };
        // The stack stays mapped until the child is gone: a supervisor
        // still sweeping its run runs on it.
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                // A task dropped unfinished (the runtime shutting down)
                // leaks the stack rather than unmap it under a supervisor
                // that may still be sweeping.
                let stack = LeakUnlessTaken(stack);
                rt.spawn(async move {
                    let mut stack = stack;
                    let _ = pidfd.readable().await;
                    let _ = reap(pidfd.get_ref().as_fd(), true);
                    drop(pidfd);
                    if let Some(stack) = stack.0.take() {
                        stack.release();
                    }
                });
            }
            Err(_) => {
                let pidfd = pidfd.into_inner();
                std::thread::spawn(move || {
                    let _ = reap(pidfd.as_fd(), true);
                    if let Some(stack) = stack {
                        stack.release();
                    }
                });
            }
        }
    }
}

/// A stack that is leaked, not unmapped, unless taken out.
struct LeakUnlessTaken(Option<Stack>);

impl Drop for LeakUnlessTaken {
    fn drop(&mut self) {
        std::mem::forget(self.0.take());
    }
}
