//! The children's stacks: one mapping per start, the supervisor's at the
//! top and its program's below, kept for reuse.

use std::ffi::c_void;
use std::io;

/// The stacks of one start: the supervisor's at the top, its program
/// child's below (the supervisor is suspended while that one runs).
pub(super) struct Stack {
    base: *mut c_void,
}

// SAFETY: the mapping is owned by this value alone; it is only unmapped.
#[allow(unsafe_code, reason = "a child's stack mapping moves between threads with its owner")]
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
    pub(super) fn new() -> io::Result<Self> {
        if let Some(stack) = Self::idle().pop() {
            return Ok(stack);
        }
        // SAFETY: a fresh private mapping.
        #[allow(unsafe_code, reason = "mmap of a child's private stack")]
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
    pub(super) fn release(self) {
        let mut idle = Self::idle();
        if idle.len() < Self::IDLE {
            idle.push(self);
        }
    }

    pub(super) fn supervisor_top(&self) -> *mut u8 {
        self.base.cast::<u8>().wrapping_add(Self::SIZE)
    }

    pub(super) fn program_top(&self) -> *mut u8 {
        self.base.cast::<u8>().wrapping_add(Self::SIZE / 2)
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; no child runs on it any more.
        #[allow(unsafe_code, reason = "munmap of the stack mapped in new")]
        unsafe {
            libc::munmap(self.base, Self::SIZE);
        }
    }
}
