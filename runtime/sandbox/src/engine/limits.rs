//! Per-call limits: the deadline, fuel, memory, and caps on what a plugin
//! may hand back. Every limit has a default; breaching one is a typed
//! [`Reason`](crate::verdict::Reason), never a crash.

use std::time::Duration;
use wasmtime::ResourceLimiter;

/// Default deadline of one call (`timeout`), as the kubelet's.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default fuel budget of one call (`fuel`): about a second of busy CPU.
pub const DEFAULT_FUEL: u64 = 1_000_000_000;
/// Default memory cap of one call (`memory`).
pub const DEFAULT_MEMORY: u64 = 64 * 1024 * 1024;
/// The largest memory cap any call may have; the pooling allocator reserves
/// address space for it.
pub const MAX_MEMORY: u64 = 1024 * 1024 * 1024;

pub use crate::host::log::{MAX_LOG_RECORD_BYTES, MAX_LOG_RECORDS};
pub use crate::verdict::{MAX_DETAIL_BYTES, MAX_MESSAGE_BYTES, MAX_METRIC_NAME_BYTES, MAX_METRICS};
/// Cap on table elements (indirect-call tables) per table.
const MAX_TABLE_ELEMENTS: usize = 1 << 20;

/// The limits of one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock deadline, counted from instantiation (config `timeout`,
    /// default 1s).
    pub timeout: Duration,
    /// Fuel budget; roughly one unit per wasm instruction (config
    /// `limits.fuel`, default 1,000,000,000).
    pub fuel: u64,
    /// Cap on linear memory, in bytes (config `limits.memory`, default
    /// 64MiB, at most 1GiB).
    pub memory: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            timeout: DEFAULT_TIMEOUT,
            fuel: DEFAULT_FUEL,
            memory: DEFAULT_MEMORY,
        }
    }
}

/// The store's resource limiter: refuses memory growth past the cap and
/// remembers that it did, so the trap that follows is reported as `memory`.
///
/// The host memory a call's resources can pin
/// ([`HostLimits::host_memory_per_call`](crate::host::bounds::HostLimits::host_memory_per_call))
/// counts against the cap: linear memory may grow to the rest, and never
/// below half the cap.
#[derive(Debug)]
pub(crate) struct MemoryCap {
    cap: usize,
    pub(crate) exceeded: bool,
    /// The most linear memory granted so far.
    peak: usize,
}

impl MemoryCap {
    /// A cap of `cap` bytes, of which `host_memory` (the call's
    /// [`HostLimits::host_memory_per_call`](crate::host::bounds::HostLimits::host_memory_per_call))
    /// is kept for what the host holds for the call.
    pub(crate) fn new(cap: u64, host_memory: u64) -> Self {
        let cap = cap.min(MAX_MEMORY);
        let linear = cap.saturating_sub(host_memory).max(cap / 2);
        Self {
            cap: usize::try_from(linear).unwrap_or(usize::MAX),
            exceeded: false,
            peak: 0,
        }
    }
}

impl MemoryCap {
    /// The bytes linear memory may grow to.
    #[cfg(test)]
    pub(crate) fn cap(&self) -> usize {
        self.cap
    }
}

impl MemoryCap {
    /// The most linear memory granted so far (its creation included).
    pub(crate) fn peak(&self) -> usize {
        self.peak
    }
}

impl ResourceLimiter for MemoryCap {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.cap {
            self.exceeded = true;
            return Ok(false);
        }
        self.peak = self.peak.max(desired);
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::bounds::HOST_MEMORY_PER_CALL;

    #[test]
    fn memory_cap_refuses_and_remembers() {
        let mut cap = MemoryCap::new(1024 * 1024, HOST_MEMORY_PER_CALL);
        assert!(cap.memory_growing(0, 65536, None).unwrap());
        assert!(!cap.exceeded);
        assert!(!cap.memory_growing(65536, 1024 * 1024, None).unwrap());
        assert!(cap.exceeded);
    }

    #[test]
    fn memory_cap_is_clamped() {
        let cap = MemoryCap::new(u64::MAX, HOST_MEMORY_PER_CALL);
        assert_eq!(cap.cap as u64, MAX_MEMORY - HOST_MEMORY_PER_CALL);
        let cap = MemoryCap::new(DEFAULT_MEMORY, HOST_MEMORY_PER_CALL);
        assert_eq!(
            cap.cap as u64,
            DEFAULT_MEMORY - 8 * 1024 * 1024,
            "the host's share is taken out"
        );
    }
}
