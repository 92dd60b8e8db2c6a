//! The SDK's allocator without std, against what `GlobalAlloc` promises:
//! with config `"aligned"`, blocks of 1 to 4096-byte alignment, grown
//! through `realloc` (a stricter alignment than `malloc`'s is moved by
//! hand), must stay aligned and keep their contents; with `"exhaust"`, the
//! plugin allocates until the host's memory cap refuses more.
//!
//! Built twice: as `alloc_no_std` (wasi-libc's `malloc`) and as
//! `alloc_arena` (the SDK's `arena` feature). Two more configs tell them
//! apart: `"lifo"` allocates and frees 1 MiB 100 times (both reuse it),
//! `"churn"` frees each 1 MiB block after allocating a small one (`malloc`
//! reuses it; the arena keeps it until the call ends, so 100 of them
//! meet the default 64 MiB memory cap).

#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::format;
use alloc::vec::Vec;
use sonde_sdk::{Outcome, Probe, ProbeError, Request};

#[derive(Clone, Copy)]
#[repr(align(16))]
struct A16(u8);
#[derive(Clone, Copy)]
#[repr(align(64))]
struct A64(u8);
#[derive(Clone, Copy)]
#[repr(align(4096))]
struct A4096(u8);

/// Pushes `n` values made by `make` one at a time (so the vector is
/// reallocated as it grows), checking its alignment after each growth and
/// every value at the end.
fn grow<T: Copy>(n: usize, make: impl Fn(usize) -> T, read: impl Fn(&T) -> u8) -> Result<(), alloc::string::String> {
    let align = core::mem::align_of::<T>();
    let mut v: Vec<T> = Vec::new();
    for i in 0..n {
        v.push(make(i));
        if !(v.as_ptr() as usize).is_multiple_of(align) {
            return Err(format!(
                "align {align}: a block at {:p} after {} pushes",
                v.as_ptr(),
                i + 1
            ));
        }
    }
    match v.iter().enumerate().find(|(i, x)| read(x) != *i as u8) {
        Some((i, _)) => Err(format!("align {align}: element {i} lost its value")),
        None => Ok(()),
    }
}

struct AllocNoStd;

impl Probe for AllocNoStd {
    fn check(req: Request) -> Result<Outcome, ProbeError> {
        match req.config_json().trim() {
            "\"exhaust\"" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(alloc::vec![1u8; 1 << 20]);
                    core::hint::black_box(&hoard);
                }
            }
            "\"lifo\"" => {
                for i in 0..100u32 {
                    let block = alloc::vec![i as u8; 1 << 20];
                    core::hint::black_box(&block);
                }
                Ok(Outcome::success("100 MiB allocated and freed, 1 MiB at a time"))
            }
            "\"churn\"" => {
                let mut kept: Vec<Vec<u8>> = Vec::with_capacity(100);
                for i in 0..100u32 {
                    let block = alloc::vec![i as u8; 1 << 20];
                    kept.push(alloc::vec![i as u8; 8]);
                    core::hint::black_box(&block);
                }
                Ok(Outcome::success(format!("{} small blocks kept", kept.len())))
            }
            "\"aligned\"" => {
                let checks = [
                    grow(3000, |i| i as u8, |x| *x),
                    grow(3000, |i| i as u64, |x| *x as u8),
                    grow(1000, |i| A16(i as u8), |x| x.0),
                    grow(1000, |i| A64(i as u8), |x| x.0),
                    grow(40, |i| A4096(i as u8), |x| x.0),
                ];
                match checks.into_iter().find_map(Result::err) {
                    Some(why) => Ok(Outcome::failure(why)),
                    None => Ok(Outcome::success("aligned and kept")),
                }
            }
            other => Err(ProbeError::invalid_config(format!(
                "config {other}: \"aligned\", \"exhaust\", \"lifo\" or \"churn\""
            ))),
        }
    }
}

sonde_sdk::export!(AllocNoStd);
