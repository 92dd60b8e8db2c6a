//! A plugin that tries to remember what an earlier call left behind. Each
//! call first looks for traces of earlier ones, then leaves its own:
//!
//! - a 16-byte marker anywhere in its linear memory: it scans every byte
//!   below `memory.size`, then writes the marker into a static, a heap
//!   block it never frees, its own stack and a page it grows the memory by;
//! - statics in `.data` (initialised) and `.bss` (zero), which it changes;
//! - the memory's size, and where a fresh heap block lands (the arena's
//!   state), reported for the caller to compare between calls.
//!
//! It fails, naming what it found, if anything survived. With config
//! `"self-test"` it writes the marker before scanning, so the scan is shown
//! to find it.

#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::hint::black_box;
use sonde_sdk::{Outcome, Probe, ProbeError, Request};

/// The marker, XORed with a key the compiler cannot see through, so the
/// marker itself is nowhere in the component's data.
const MASKED: [u8; 16] = *b"rem3mber-t#is-42";

/// Initialised, so in `.data`.
static mut INITIALISED: u64 = 0x5eed;
/// Zero, so in `.bss`.
static mut ZEROED: u64 = 0;
/// A buffer in `.bss` the marker is written into.
static mut BUFFER: [u8; 16] = [0; 16];

fn marker(key: u8) -> [u8; 16] {
    MASKED.map(|b| b ^ key)
}

#[cfg(target_arch = "wasm32")]
fn memory_bytes() -> usize {
    core::arch::wasm32::memory_size(0) * 65536
}
#[cfg(not(target_arch = "wasm32"))]
fn memory_bytes() -> usize {
    0
}

#[cfg(target_arch = "wasm32")]
fn grow_one_page() -> Option<usize> {
    match core::arch::wasm32::memory_grow(0, 1) {
        usize::MAX => None,
        old => Some(old * 65536),
    }
}
#[cfg(not(target_arch = "wasm32"))]
fn grow_one_page() -> Option<usize> {
    None
}

/// Every address in the memory where the marker starts, comparing byte by
/// byte against the masked copy so no unmasked copy is made.
// A hostile guest: its `unsafe` (reading and writing raw memory) is the probe.
#[allow(unsafe_code, reason = "a hostile guest: reading raw memory is the probe")]
fn scan(key: u8) -> Vec<usize> {
    let end = memory_bytes();
    let mut found = Vec::new();
    // Address 0 is left out: reading it is a null dereference to Rust.
    let mut at = 16;
    while at + MASKED.len() <= end {
        // SAFETY: every address below memory.size is readable in wasm.
        let matches =
            (0..MASKED.len()).all(|i| unsafe { core::ptr::read_volatile((at + i) as *const u8) } == MASKED[i] ^ key);
        if matches {
            found.push(at);
        }
        at += 1;
    }
    found
}

/// Writes the marker into a static, a leaked heap block, the stack and a
/// new page.
// A hostile guest: its `unsafe` (reading and writing raw memory) is the probe.
#[allow(unsafe_code, reason = "a hostile guest: writing raw memory is the probe")]
fn leave_traces(key: u8) {
    let m = marker(key);
    // SAFETY: the plugin is single-threaded; nothing else reads these.
    unsafe {
        INITIALISED += 1;
        ZEROED += 1;
        *core::ptr::addr_of_mut!(BUFFER) = m;
    }
    let block: &'static mut [u8; 16] = alloc::boxed::Box::leak(alloc::boxed::Box::new(m));
    black_box(block);
    let on_stack = black_box(m);
    black_box(&on_stack);
    if let Some(page) = grow_one_page() {
        // SAFETY: the page was just added to the memory.
        unsafe { core::ptr::write_volatile(page as *mut [u8; 16], m) };
    }
}

struct RememberCalls;

#[allow(unsafe_code, reason = "reads the statics leave_traces writes")]
impl Probe for RememberCalls {
    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let key = black_box(0xa5u8);
        let self_test = req.config_json().trim() == "\"self-test\"";
        let pages = memory_bytes() / 65536;
        let fresh = black_box(alloc::vec![0u8; 64]);
        let heap_at = fresh.as_ptr() as usize;
        if self_test {
            leave_traces(key);
        }
        let found = scan(key);
        // SAFETY: as in `leave_traces`.
        let (initialised, zeroed) = unsafe { (INITIALISED, ZEROED) };
        if !self_test {
            leave_traces(key);
        }
        let mut left: Vec<String> = Vec::new();
        if !found.is_empty() {
            left.push(format!("the marker at {found:x?}"));
        }
        if initialised != 0x5eed {
            left.push(format!(".data static {initialised:#x}"));
        }
        if zeroed != 0 {
            left.push(format!(".bss static {zeroed}"));
        }
        let seen = format!("{pages} pages, a fresh block at {heap_at:#x}");
        if left.is_empty() {
            Ok(Outcome::success(format!("nothing of an earlier call; {seen}")))
        } else {
            Ok(Outcome::failure(format!("found {}; {seen}", left.join(", "))))
        }
    }
}

sonde_sdk::export!(RememberCalls);
