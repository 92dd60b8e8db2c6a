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

use std::ffi::{CString, c_char, c_void};
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;

/// What the children need, built before the clone (they allocate nothing).
#[repr(C)]
struct Request {
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
    stdin: RawFd,
    stdout: RawFd,
    stderr: RawFd,
    /// The write end of the exec-status pipe: a child that fails writes
    /// its errno there; a program that executes closes it (close-on-exec).
    status: RawFd,
    /// `cgroup.procs` of the run's cgroup, or -1.
    cgroup_procs: RawFd,
    /// The agent's pid: a supervisor whose parent is no longer the agent
    /// starts nothing.
    agent: i32,
    /// Where the supervisor's program child gets its stack (its top).
    program_stack: *mut u8,
}

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
    #[allow(unsafe_code)]
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
    #[allow(unsafe_code)]
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
        #[allow(unsafe_code)]
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
        #[allow(unsafe_code)]
        unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut());
        }
    }
}

/// The stacks of one start: the supervisor's at the top, its program
/// child's below (the supervisor is suspended while that one runs).
struct Stack {
    base: *mut c_void,
}

// SAFETY: the mapping is owned by this value alone; it is only unmapped.
#[allow(unsafe_code)]
unsafe impl Send for Stack {}

impl Stack {
    const SIZE: usize = 256 * 1024;

    /// The most stacks kept for reuse: mapping and unmapping one per run
    /// (a TLB shoot-down across the agent's threads, then fresh zeroed
    /// pages) cost about 3 % of a `/bin/true` run.
    const IDLE: usize = 32;

    fn idle() -> std::sync::MutexGuard<'static, Vec<Stack>> {
        static IDLE: std::sync::Mutex<Vec<Stack>> = std::sync::Mutex::new(Vec::new());
        IDLE.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A stack from the idle ones, or a new mapping.
    fn new() -> io::Result<Self> {
        if let Some(stack) = Self::idle().pop() {
            return Ok(stack);
        }
        // SAFETY: a fresh private mapping.
        #[allow(unsafe_code)]
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                Self::SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self { base })
    }

    /// Gives back a stack no child runs on any more.
    fn release(self) {
        let mut idle = Self::idle();
        if idle.len() < Self::IDLE {
            idle.push(self);
        }
    }

    fn supervisor_top(&self) -> *mut u8 {
        self.base.cast::<u8>().wrapping_add(Self::SIZE)
    }

    fn program_top(&self) -> *mut u8 {
        self.base.cast::<u8>().wrapping_add(Self::SIZE / 2)
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; no child runs on it any more.
        #[allow(unsafe_code)]
        unsafe {
            libc::munmap(self.base, Self::SIZE);
        }
    }
}

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
fn reap(pidfd: BorrowedFd<'_>, block: bool) -> rustix::io::Result<Option<ExitCode>> {
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
    fn held(pidfd: OwnedFd, stack: Stack, supervised: bool) -> io::Result<Self> {
        let on_drop = match supervised {
            true => rustix::process::Signal::TERM,
            false => rustix::process::Signal::KILL,
        };
        // SAFETY: the `AsyncFd` owns the descriptor, which stays open until
        // the registration is gone.
        #[allow(unsafe_code)]
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

/// The program: puts its stdio, group, directory and signals in place,
/// enters its cgroup if it has one, and executes. Runs as a clone child
/// (see the module's rules).
extern "C" fn program_main(request: *mut c_void) -> ! {
    // SAFETY: the agent passes a `Request` it keeps alive until the
    // program has executed or this child has written its errno.
    #[allow(unsafe_code)]
    let r = unsafe { &*request.cast::<Request>() };
    reset_signals();
    let errno = 'fail: {
        if r.cgroup_procs >= 0 {
            match sys::write(r.cgroup_procs, b"0") {
                1 => {}
                n if n < 0 => break 'fail -n as i32,
                _ => break 'fail libc::EIO,
            }
        }
        let steps: [fn(&Request) -> i32; 5] = [
            |_| sys::setpgid_self(),
            |r| sys::dup3(r.stdin, 0),
            |r| sys::dup3(r.stdout, 1),
            |r| sys::dup3(r.stderr, 2),
            |_| sys::chdir_root(),
        ];
        for step in steps {
            let result = step(r);
            if result < 0 {
                break 'fail -result;
            }
        }
        // Nothing of the agent's reaches the program, not even what was
        // opened without close-on-exec (the status pipe included: it closes
        // when the program executes).
        sys::cloexec_from(3);
        sys::set_signal_mask(0);
        // SAFETY: NUL-terminated arrays of C strings, built by the agent.
        #[allow(unsafe_code)]
        let result = unsafe { sys::execve(r.path, r.argv, r.envp) };
        -result
    };
    fail(r, errno)
}

/// The supervisor of one run: a child subreaper that starts the program,
/// waits for it to exit or for `SIGTERM` (the agent's, or the kernel's when
/// the agent dies), then kills and reaps every descendant and exits as the
/// program did. Runs as a clone child (see the module's rules).
extern "C" fn supervisor_main(request: *mut c_void) -> ! {
    // SAFETY: as in `program_main`.
    #[allow(unsafe_code)]
    let r = unsafe { &*request.cast::<Request>() };
    // Every signal stays blocked (as the agent left them for the clone):
    // no handler of the agent's ever runs here, and SIGTERM and SIGCHLD
    // are taken with `sigtimedwait`. (A fault is not blockable: the kernel
    // kills the supervisor with it.) The program child resets all.
    let waited = sys::signal_bit(libc::SIGTERM) | sys::signal_bit(libc::SIGCHLD);
    let result = sys::become_subreaper();
    if result < 0 {
        fail(r, -result);
    }
    sys::term_with_parent();
    if sys::getppid() != r.agent {
        // The agent died before this was set up: start nothing.
        sys::exit(127);
    }
    // SAFETY: `program_main` follows this module's rules; its stack is
    // below this one's, unused while this child is suspended.
    #[allow(unsafe_code)]
    let program = unsafe {
        sys::clone(
            (libc::CLONE_VM | libc::CLONE_VFORK) as usize | libc::SIGCHLD as usize,
            r.program_stack,
            std::ptr::null_mut(),
            program_main,
            request,
        )
    };
    if program < 0 {
        fail(r, -program as i32);
    }
    // The program has executed (or written its errno and exited). Nothing
    // of the agent's is used from here: not the request, not its
    // descriptors — the output pipes' readers must see their end when the
    // program's tree is gone, and the agent waits for the status pipe.
    sys::close_all();
    let status = supervise(program as i32, waited);
    exit_like(status)
}

/// Writes `errno` to the status pipe and exits.
fn fail(r: &Request, errno: i32) -> ! {
    sys::write(r.status, &errno.to_ne_bytes());
    sys::exit(127)
}

/// Gives every signal its default action: none of the agent's handlers
/// runs in a child, and a program starts with nothing ignored — not
/// SIGPIPE, which Rust programs ignore, nor what the agent inherited
/// ignored.
fn reset_signals() {
    for signal in 1..=64 {
        if signal != libc::SIGKILL && signal != libc::SIGSTOP {
            sys::set_default_action(signal);
        }
    }
}

/// Waits until the program exits or SIGTERM arrives, then kills and reaps
/// every descendant; returns the program's wait status.
fn supervise(program: i32, waited: u64) -> i32 {
    let status = 'wait: loop {
        if sys::wait_signal(waited) == libc::SIGTERM {
            sys::kill(program);
        }
        loop {
            match sys::wait_any(libc::WNOHANG) {
                (pid, status) if pid == program => break 'wait status,
                (pid, _) if pid > 0 => continue,
                _ => break,
            }
        }
    };
    // Every process left is a descendant: kill the children (their own
    // children are re-parented here as they die) until none is left. Most
    // runs leave none, and end at the first `ECHILD`.
    loop {
        match sys::wait_any(libc::WNOHANG).0 {
            pid if pid > 0 => {}
            0 => {
                kill_children();
                sys::wait_any(0);
            }
            _ => break,
        }
    }
    status
}

/// Sends SIGKILL to each child of this (single-threaded) process, read from
/// `/proc/thread-self/children` into a buffer on the stack.
fn kill_children() {
    let fd = sys::open_read(c"/proc/thread-self/children");
    if fd < 0 {
        return;
    }
    let mut buf = [0u8; 4096];
    let n = sys::read(fd, &mut buf);
    sys::close(fd);
    let mut pid: i32 = 0;
    for &b in buf.iter().take(n.max(0) as usize) {
        if b.is_ascii_digit() {
            pid = pid.saturating_mul(10).saturating_add(i32::from(b - b'0'));
        } else if pid > 0 {
            sys::kill(pid);
            pid = 0;
        }
    }
    if pid > 0 {
        sys::kill(pid);
    }
}

/// Ends the supervisor the way the program ended: its exit code, or its
/// signal.
fn exit_like(status: i32) -> ! {
    if libc::WIFSIGNALED(status) {
        let signal = libc::WTERMSIG(status);
        sys::set_default_action(signal);
        // Only that one: any other pending signal would run the agent's
        // handler here.
        sys::set_signal_mask(!sys::signal_bit(signal));
        sys::kill_self(signal);
        sys::exit(128 + signal);
    }
    sys::exit(libc::WEXITSTATUS(status))
}

/// The system calls of the children, returning `-errno` on failure: none
/// goes through libc (see the module's docs).
///
/// Most are rustix's: its Linux backend makes the system call itself and
/// returns the error as a value, touching no `errno` and allocating
/// nothing for a `&CStr` path. The rest are made here ([`syscall`]) because
/// rustix offers them only in its unstable `runtime` module (`execve`,
/// `exit_group`, the kernel's signal calls) or not at all (`close_range`,
/// a `clone` that runs a function on a given stack), or only on an
/// `OwnedFd` the child would have to forge for a descriptor that may not be
/// open (`dup3` onto 0, 1 and 2).
mod sys {
    use rustix::io::Errno;
    use rustix::process::{Pid, Signal, WaitOptions};
    use std::ffi::{CStr, c_char, c_void};
    use std::os::fd::{BorrowedFd, RawFd};

    /// `-errno` of `e`, as the raw calls return it.
    fn neg(e: Errno) -> isize {
        -(e.raw_os_error() as isize)
    }

    /// A descriptor of this child's own table, by number.
    fn fd(raw: RawFd) -> BorrowedFd<'static> {
        // SAFETY: a child names only descriptors open in its own table (the
        // request's, copied at the clone, or one it opened) and closes none
        // it still names; never -1 (callers check).
        #[allow(unsafe_code)]
        unsafe {
            BorrowedFd::borrow_raw(raw)
        }
    }

    /// A system call with up to six arguments.
    ///
    /// # Safety
    ///
    /// The arguments must be valid for the call.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    #[allow(unsafe_code)]
    unsafe fn syscall(nr: libc::c_long, a: [usize; 6]) -> isize {
        let ret: isize;
        // SAFETY: the caller's; `syscall` clobbers rcx and r11 only.
        unsafe {
            std::arch::asm!(
                "syscall",
                inlateout("rax") nr as isize => ret,
                in("rdi") a[0], in("rsi") a[1], in("rdx") a[2],
                in("r10") a[3], in("r8") a[4], in("r9") a[5],
                lateout("rcx") _, lateout("r11") _,
                options(nostack, preserves_flags),
            );
        }
        ret
    }

    /// Elsewhere the children are forked copies (see `clone`), so libc's
    /// wrapper, and its `errno`, are theirs alone.
    #[cfg(not(target_arch = "x86_64"))]
    #[allow(unsafe_code)]
    unsafe fn syscall(nr: libc::c_long, a: [usize; 6]) -> isize {
        // SAFETY: the caller's.
        let ret = unsafe { libc::syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]) };
        if ret < 0 {
            -(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO) as isize)
        } else {
            ret as isize
        }
    }

    /// `clone(flags)` running `f(arg)` in the child on the stack whose top
    /// is `stack` (16-byte aligned); with `CLONE_PIDFD`, the pidfd goes to
    /// `pidfd`. Returns the child's pid, or `-errno`.
    ///
    /// # Safety
    ///
    /// `f` must follow the rules of a clone child (module docs) and never
    /// return; `stack` and `arg` must stay valid while it uses them.
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    pub(super) unsafe fn clone(
        flags: usize,
        stack: *mut u8,
        pidfd: *mut i32,
        f: extern "C" fn(*mut c_void) -> !,
        arg: *mut c_void,
    ) -> isize {
        let ret: isize;
        // SAFETY: the caller's. The child starts on `stack` with the
        // parent's registers: it clears the frame pointer and calls `f`,
        // which never returns.
        unsafe {
            std::arch::asm!(
                "syscall",
                "test rax, rax",
                "jnz 2f",
                "xor ebp, ebp",
                "mov rdi, r12",
                "call r13",
                "ud2",
                "2:",
                inlateout("rax") libc::SYS_clone as isize => ret,
                in("rdi") flags, in("rsi") stack, in("rdx") pidfd,
                in("r10") 0usize, in("r8") 0usize,
                in("r12") arg, in("r13") f,
                lateout("rcx") _, lateout("r11") _,
            );
        }
        ret
    }

    /// Elsewhere: a fork (no shared memory, so no stack), with a pidfd
    /// opened for it.
    #[cfg(not(target_arch = "x86_64"))]
    #[allow(unsafe_code)]
    pub(super) unsafe fn clone(
        _flags: usize,
        _stack: *mut u8,
        pidfd: *mut i32,
        f: extern "C" fn(*mut c_void) -> !,
        arg: *mut c_void,
    ) -> isize {
        // SAFETY: in the child, `f` only makes system calls.
        unsafe {
            let pid = libc::fork();
            if pid == 0 {
                f(arg);
            }
            if pid < 0 {
                return -(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO) as isize);
            }
            if !pidfd.is_null() {
                *pidfd = libc::syscall(libc::SYS_pidfd_open, pid, 0) as i32;
            }
            pid as isize
        }
    }

    /// A raw call of the list above.
    fn call(nr: libc::c_long, a: [usize; 6]) -> isize {
        // SAFETY: every caller below passes arguments valid for `nr`.
        #[allow(unsafe_code)]
        unsafe {
            syscall(nr, a)
        }
    }

    pub(super) fn write(raw: RawFd, bytes: &[u8]) -> isize {
        rustix::io::write(fd(raw), bytes).map_or_else(neg, |n| n as isize)
    }

    pub(super) fn read(raw: RawFd, buf: &mut [u8]) -> isize {
        rustix::io::read(fd(raw), buf).map_or_else(neg, |n| n as isize)
    }

    /// Opens `path` to read: the descriptor, or `-errno`.
    pub(super) fn open_read(path: &CStr) -> i32 {
        use rustix::fs::{Mode, OFlags};
        match rustix::fs::open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()) {
            // Closed by `close`: an `OwnedFd` would close it through libc.
            Ok(owned) => std::os::fd::IntoRawFd::into_raw_fd(owned),
            Err(e) => neg(e) as i32,
        }
    }

    pub(super) fn close(raw: RawFd) {
        // SAFETY: `raw` was opened by this child (`open_read`) and is not
        // used after.
        #[allow(unsafe_code)]
        unsafe {
            rustix::io::close(raw)
        }
    }

    /// Closes every descriptor.
    pub(super) fn close_all() {
        call(libc::SYS_close_range, [0, u32::MAX as usize, 0, 0, 0, 0]);
    }

    /// Marks every descriptor from `first` up close-on-exec (a kernel
    /// before 5.11 refuses; what was opened close-on-exec is then all that
    /// closes).
    pub(super) fn cloexec_from(first: u32) {
        call(
            libc::SYS_close_range,
            [
                first as usize,
                u32::MAX as usize,
                libc::CLOSE_RANGE_CLOEXEC as usize,
                0,
                0,
                0,
            ],
        );
    }

    pub(super) fn dup3(from: i32, to: i32) -> i32 {
        call(libc::SYS_dup3, [from as usize, to as usize, 0, 0, 0, 0]) as i32
    }

    pub(super) fn setpgid_self() -> i32 {
        rustix::process::setpgid(None, None).map_or_else(|e| neg(e) as i32, |()| 0)
    }

    pub(super) fn chdir_root() -> i32 {
        rustix::process::chdir(c"/").map_or_else(|e| neg(e) as i32, |()| 0)
    }

    /// # Safety
    ///
    /// NUL-terminated arrays of C strings.
    #[allow(unsafe_code)]
    pub(super) unsafe fn execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> i32 {
        // SAFETY: the caller's.
        unsafe { syscall(libc::SYS_execve, [path as usize, argv as usize, envp as usize, 0, 0, 0]) as i32 }
    }

    /// Makes this process the subreaper of its descendants.
    pub(super) fn become_subreaper() -> i32 {
        let me = rustix::process::getpid();
        rustix::process::set_child_subreaper(Some(me)).map_or_else(|e| neg(e) as i32, |()| 0)
    }

    /// Asks for SIGTERM when the parent (the agent) dies.
    pub(super) fn term_with_parent() {
        let _ = rustix::process::set_parent_process_death_signal(Some(Signal::TERM));
    }

    pub(super) fn getppid() -> i32 {
        Pid::as_raw(rustix::process::getppid())
    }

    /// Sends SIGKILL to `pid`.
    pub(super) fn kill(pid: i32) {
        if let Some(pid) = Pid::from_raw(pid) {
            let _ = rustix::process::kill_process(pid, Signal::KILL);
        }
    }

    /// Sends `signal` to this process: one the kernel reported as having
    /// ended the program.
    pub(super) fn kill_self(signal: i32) {
        // SAFETY: a signal number the kernel reported, so a valid one; the
        // libc reserved ones matter to libc's threads, and none runs here.
        #[allow(unsafe_code)]
        let signal = unsafe { Signal::from_raw_unchecked(signal) };
        let _ = rustix::process::kill_process(rustix::process::getpid(), signal);
    }

    pub(super) fn exit(code: i32) -> ! {
        loop {
            call(libc::SYS_exit_group, [code as usize, 0, 0, 0, 0, 0]);
        }
    }

    /// Waits for any child (`options`: 0 or `WNOHANG`): its pid and wait
    /// status, or `(-errno, 0)`, or `(0, 0)` when none has exited.
    pub(super) fn wait_any(options: i32) -> (i32, i32) {
        let options = match options {
            0 => WaitOptions::empty(),
            _ => WaitOptions::NOHANG,
        };
        match rustix::process::wait(options) {
            Ok(Some((pid, status))) => (pid.as_raw_pid(), status.as_raw()),
            Ok(None) => (0, 0),
            Err(e) => (neg(e) as i32, 0),
        }
    }

    /// The kernel's signal set bit of `signal`.
    pub(super) fn signal_bit(signal: i32) -> u64 {
        1 << (signal - 1)
    }

    /// Blocks exactly the signals in `set`.
    pub(super) fn set_signal_mask(set: u64) {
        call(
            libc::SYS_rt_sigprocmask,
            [
                libc::SIG_SETMASK as usize,
                std::ptr::from_ref(&set) as usize,
                0,
                8,
                0,
                0,
            ],
        );
    }

    /// Waits for one of the (blocked) signals in `set`; returns it, or a
    /// negative errno (EINTR).
    pub(super) fn wait_signal(set: u64) -> i32 {
        let mut info = [0u64; 16];
        call(
            libc::SYS_rt_sigtimedwait,
            [
                std::ptr::from_ref(&set) as usize,
                info.as_mut_ptr() as usize,
                0,
                8,
                0,
                0,
            ],
        ) as i32
    }

    /// The kernel's `struct sigaction`, large enough for every layout; its
    /// first word is the handler.
    type KernelSigaction = [usize; 4];

    /// Gives `signal` its default action.
    pub(super) fn set_default_action(signal: i32) {
        let default: KernelSigaction = [libc::SIG_DFL, 0, 0, 0];
        call(
            libc::SYS_rt_sigaction,
            [signal as usize, default.as_ptr() as usize, 0, 8, 0, 0],
        );
    }
}
