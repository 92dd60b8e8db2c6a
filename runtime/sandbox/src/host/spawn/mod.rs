//! Starting the programs the host runs without copying the agent.
//!
//! `fork` copies the page tables of the whole agent — every populated page
//! of its heap, compiled code and instance pool — and the subreaper mode
//! forked twice (agent → supervisor → program). Measured on the 2-core VM
//! (docs/performance-notes.md), that made one `/bin/true` cost 1,987 µs of CPU against
//! 635 µs for the same program started natively.
//!
//! Here, on x86-64, the children share the agent's memory (`CLONE_VM`)
//! until they execute, as `posix_spawn` does:
//!
//! - the **program** is a `CLONE_VM | CLONE_VFORK` child: its parent is
//!   suspended until the program has executed or failed to;
//! - the **supervisor** of the subreaper mode is a `CLONE_VM` child on a
//!   stack of its own. It runs beside the agent for the whole run and
//!   starts the program the same way, so no page table is copied at all.
//!
//! Code that runs in such a child runs in the agent's memory with the
//! thread-local storage of the agent thread that started it. So it makes
//! raw system calls only ([`sys`]: rustix's, whose Linux backend makes
//! them itself, and a few of its own where rustix has none; a libc wrapper
//! would write that thread's `errno` under it), allocates nothing, cannot
//! panic, and reads only its own stack and the [`Request`], which the
//! agent keeps alive until the program has executed. Elsewhere `sys` forks
//! instead, and the same child code runs in a copy of the agent.
//!
//! The agent holds each child by a pidfd: it waits on it without
//! `waitpid(-1)`, and signals it with no risk of reaching a recycled pid.
//!
//! Here: [`start`] (building the request, the clone, the exec status).
//! The code the children run is `child`, their system calls `sys`, their
//! stacks `stack`, and the agent's hold on a child `process`.

mod child;
mod process;
mod stack;
mod sys;

use child::{Request, program_main, supervisor_main};
pub(crate) use process::Process;
use process::reap;
use stack::Stack;
use std::ffi::{CString, c_char, c_void};
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use tokio::net::unix::pipe;

/// How a program is contained (see [`super::contain`]).
pub(crate) enum How<'a> {
    /// The program writes itself into this `cgroup.procs` before it
    /// executes.
    Cgroup(BorrowedFd<'a>),
    /// The program runs under a subreaper supervisor that sweeps its
    /// descendants.
    Supervised,
}

/// A program started by [`start`], with the read ends of its output.
pub(crate) struct Started {
    /// The process the agent waits on: the program in the cgroup mode, its
    /// supervisor in the subreaper mode.
    pub(crate) process: Process,
    /// The program's stdout.
    pub(crate) stdout: pipe::Receiver,
    /// The program's stderr.
    pub(crate) stderr: pipe::Receiver,
}

/// Starts `argv` (an absolute program path, then its arguments) with no
/// stdin, only `env`, `/` as its directory, in a process group of its own,
/// with every signal at its default action and none blocked. Returns once the
/// program has executed; an error if it could not (its errno).
pub(crate) fn start(argv: &[String], env: &[(String, String)], how: How<'_>) -> io::Result<Started> {
    let Some(path) = argv.first() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty argv"));
    };
    if !path.starts_with('/') {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not an absolute path"));
    }
    let (args, vars) = c_strings(argv, env)?;
    let (arg_ptrs, var_ptrs) = (nul_terminated(&args), nul_terminated(&vars));

    let (mut status_r, status_w) = std::io::pipe()?;
    let (out_r, out_w) = std::io::pipe()?;
    let (err_r, err_w) = std::io::pipe()?;
    let (stdout, stderr) = (above_stdio(out_w.into())?, above_stdio(err_w.into())?);
    let status_w = above_stdio(status_w.into())?;
    let stack = Stack::new()?;
    // On the heap, so that it can outlive this function if it must (below).
    let request = Box::new(Request {
        path: args[0].as_ptr(),
        argv: arg_ptrs.as_ptr(),
        envp: var_ptrs.as_ptr(),
        stdin: dev_null()?.as_raw_fd(),
        stdout: stdout.as_raw_fd(),
        stderr: stderr.as_raw_fd(),
        status: status_w.as_raw_fd(),
        cgroup_procs: match &how {
            How::Cgroup(fd) => fd.as_raw_fd(),
            How::Supervised => -1,
        },
        agent: std::process::id() as i32,
        program_stack: stack.program_top(),
    });
    let (child, flags, top): (extern "C" fn(*mut c_void) -> !, _, _) = match &how {
        How::Cgroup(_) => (program_main, libc::CLONE_VM | libc::CLONE_VFORK, stack.program_top()),
        How::Supervised => (supervisor_main, libc::CLONE_VM, stack.supervisor_top()),
    };
    let mut pidfd: RawFd = -1;
    // Every signal is blocked across the clone, so none is handled in the
    // child before it has reset the agent's handlers.
    let blocked = SignalsBlocked::all();
    // SAFETY: `child` follows the rules of this module's children; the
    // request, the strings it points to and the stack outlive the child's
    // use of them (below: the request until the exec-status pipe is
    // closed, the stack until the child has been reaped).
    #[allow(unsafe_code, reason = "clone of the supervised child on its own stack")]
    let pid = unsafe {
        sys::clone(
            (flags | libc::CLONE_PIDFD) as usize | libc::SIGCHLD as usize,
            top,
            &mut pidfd,
            child,
            std::ptr::from_ref::<Request>(&request).cast_mut().cast(),
        )
    };
    drop(blocked);
    if pid < 0 {
        return Err(io::Error::from_raw_os_error(-pid as i32));
    }
    // SAFETY: CLONE_PIDFD stored a new descriptor that nothing else owns.
    #[allow(unsafe_code, reason = "taking ownership of the pidfd CLONE_PIDFD made")]
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    drop((stdout, stderr, status_w));
    // Until the pipe closes, a child may still read the request.
    match exec_status(&mut status_r) {
        Ok(None) => {}
        Ok(Some(errno)) => {
            // The child is exiting; its stack is free once it is gone.
            let _ = reap(pidfd.as_fd(), true);
            stack.release();
            return Err(io::Error::from_raw_os_error(errno));
        }
        Err(e) => {
            // Not seen on a pipe; but a child may still be reading the
            // request, the strings or the stack: leave them all, and the
            // child, rather than free them under it.
            std::mem::forget((request, args, vars, arg_ptrs, var_ptrs, stack, pidfd));
            return Err(e);
        }
    }
    Ok(Started {
        process: Process::held(pidfd, stack, matches!(how, How::Supervised))?,
        stdout: pipe::Receiver::from_owned_fd(out_r.into())?,
        stderr: pipe::Receiver::from_owned_fd(err_r.into())?,
    })
}

/// `argv`, and `env` as `NAME=VALUE`, as C strings.
fn c_strings(argv: &[String], env: &[(String, String)]) -> io::Result<(Vec<CString>, Vec<CString>)> {
    let c =
        |s: &str| CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in argv or env"));
    let args = argv.iter().map(|a| c(a)).collect::<io::Result<Vec<_>>>()?;
    let vars = env
        .iter()
        .map(|(k, v)| c(&format!("{k}={v}")))
        .collect::<io::Result<Vec<_>>>()?;
    Ok((args, vars))
}

/// The pointers of `list`, then a null one, as `execve` takes them.
fn nul_terminated(list: &[CString]) -> Vec<*const c_char> {
    list.iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// Reads the exec-status pipe until it closes: `None` when the program
/// executed (the pipe closed empty), else the errno a child wrote.
fn exec_status(status: &mut impl Read) -> io::Result<Option<i32>> {
    let mut errno = [0u8; 4];
    let mut got = 0;
    while got < errno.len() {
        match status.read(&mut errno[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok((got == errno.len()).then(|| i32::from_ne_bytes(errno)))
}

/// `/dev/null`, opened once for every program's stdin (above 2, so putting
/// it in place never overwrites another descriptor).
fn dev_null() -> io::Result<BorrowedFd<'static>> {
    static NULL: std::sync::OnceLock<OwnedFd> = std::sync::OnceLock::new();
    if let Some(fd) = NULL.get() {
        return Ok(fd.as_fd());
    }
    let fd = above_stdio(std::fs::File::open("/dev/null")?.into())?;
    Ok(NULL.get_or_init(|| fd).as_fd())
}

/// Moves `fd` to a number above 2, so that putting the program's stdio in
/// place never overwrites another of them.
fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    Ok(rustix::io::fcntl_dupfd_cloexec(&fd, 3)?)
}

/// Blocks every signal in the calling thread until dropped.
struct SignalsBlocked(libc::sigset_t);

impl SignalsBlocked {
    fn all() -> Self {
        // SAFETY: plain calls on local signal sets.
        #[allow(unsafe_code, reason = "blocking every signal around the clone")]
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
            Self(old)
        }
    }
}

impl Drop for SignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved in `all`.
        #[allow(unsafe_code, reason = "restoring the signal mask saved before the clone")]
        unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut());
        }
    }
}
