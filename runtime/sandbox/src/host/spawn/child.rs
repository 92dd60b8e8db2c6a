//! The code the children run: the program, and the supervisor of the
//! subreaper mode. It follows the rules of [`super`]: raw system calls only
//! ([`super::sys`]), no allocation, no panic, only its own stack and the
//! [`Request`].

use super::sys;
use std::ffi::{c_char, c_void};
use std::os::fd::RawFd;

/// What the children need, built before the clone (they allocate nothing).
#[repr(C)]
pub(super) struct Request {
    pub(super) path: *const c_char,
    pub(super) argv: *const *const c_char,
    pub(super) envp: *const *const c_char,
    pub(super) stdin: RawFd,
    pub(super) stdout: RawFd,
    pub(super) stderr: RawFd,
    /// The write end of the exec-status pipe: a child that fails writes
    /// its errno there; a program that executes closes it (close-on-exec).
    pub(super) status: RawFd,
    /// `cgroup.procs` of the run's cgroup, or -1.
    pub(super) cgroup_procs: RawFd,
    /// The agent's pid: a supervisor whose parent is no longer the agent
    /// starts nothing.
    pub(super) agent: i32,
    /// Where the supervisor's program child gets its stack (its top).
    pub(super) program_stack: *mut u8,
}

/// The program: puts its stdio, group, directory and signals in place,
/// enters its cgroup if it has one, and executes. Runs as a clone child
/// (see the module's rules).
pub(super) extern "C" fn program_main(request: *mut c_void) -> ! {
    // SAFETY: the agent passes a `Request` it keeps alive until the
    // program has executed or this child has written its errno.
    #[allow(unsafe_code, reason = "the cloned child reads the request the agent keeps alive")]
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
        #[allow(unsafe_code, reason = "execve of the sandboxed program")]
        let result = unsafe { sys::execve(r.path, r.argv, r.envp) };
        -result
    };
    fail(r, errno)
}

/// The supervisor of one run: a child subreaper that starts the program,
/// waits for it to exit or for `SIGTERM` (the agent's, or the kernel's when
/// the agent dies), then kills and reaps every descendant and exits as the
/// program did. Runs as a clone child (see the module's rules).
pub(super) extern "C" fn supervisor_main(request: *mut c_void) -> ! {
    // SAFETY: as in `program_main`.
    #[allow(unsafe_code, reason = "the supervisor reads the request the agent keeps alive")]
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
    #[allow(unsafe_code, reason = "clone(CLONE_VM|CLONE_VFORK) of the program on its own stack")]
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
