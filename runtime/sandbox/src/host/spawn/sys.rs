//! The system calls of the children, returning `-errno` on failure: none
//! goes through libc (see the module's docs).
//!
//! Most are rustix's: its Linux backend makes the system call itself and
//! returns the error as a value, touching no `errno` and allocating
//! nothing for a `&CStr` path. The rest are made here ([`syscall`]) because
//! rustix offers them only in its unstable `runtime` module (`execve`,
//! `exit_group`, the kernel's signal calls) or not at all (`close_range`,
//! a `clone` that runs a function on a given stack), or only on an
//! `OwnedFd` the child would have to forge for a descriptor that may not be
//! open (`dup3` onto 0, 1 and 2).

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
    #[allow(unsafe_code, reason = "borrowing a descriptor the child owns")]
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
#[allow(unsafe_code, reason = "a raw system call, without libc, in the cloned child")]
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
#[allow(unsafe_code, reason = "a raw system call in the cloned child")]
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
#[allow(unsafe_code, reason = "the clone system call, which libc does not wrap this way")]
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
#[allow(unsafe_code, reason = "the clone system call, which libc does not wrap this way")]
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
    #[allow(
        unsafe_code,
        reason = "every system call below passes arguments valid for its number"
    )]
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
    #[allow(unsafe_code, reason = "closing a descriptor the child opened")]
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
#[allow(unsafe_code, reason = "execve, as a raw system call in the cloned child")]
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
    #[allow(unsafe_code, reason = "a signal number the kernel reported")]
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
