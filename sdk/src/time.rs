//! Clocks for plugins, the same with or without `std`: a monotonic
//! [`Instant`] for measuring phases, and the wall clock in Unix seconds.
//!
//! In the sandbox both read the host's WASI clocks directly; on the host
//! (a plugin's unit tests) they read `std`'s.

use core::time::Duration;

/// A point on the monotonic clock, for measuring how long something took.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Instant {
    nanos: u64,
}

impl Instant {
    /// Now.
    pub fn now() -> Self {
        Self {
            nanos: monotonic_nanos(),
        }
    }

    /// The time since `self`; zero if the clock reads earlier.
    pub fn elapsed(&self) -> Duration {
        Self::now().duration_since(*self)
    }

    /// The time from `earlier` to `self`; zero if `earlier` is later.
    pub fn duration_since(&self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.nanos.saturating_sub(earlier.nanos))
    }
}

/// Seconds since the Unix epoch, by the wall clock.
pub fn unix_seconds() -> f64 {
    since_unix_epoch().as_secs_f64()
}

/// The time since the Unix epoch, by the wall clock; zero if the clock
/// reads earlier.
pub fn since_unix_epoch() -> Duration {
    #[cfg(target_arch = "wasm32")]
    {
        let now = wasip2::clocks::wall_clock::now();
        Duration::new(now.seconds, now.nanoseconds)
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
    }
}

#[cfg(target_arch = "wasm32")]
fn monotonic_nanos() -> u64 {
    wasip2::clocks::monotonic_clock::now()
}

#[cfg(not(target_arch = "wasm32"))]
fn monotonic_nanos() -> u64 {
    use std::sync::OnceLock;
    static EPOCH: OnceLock<std::time::Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(std::time::Instant::now);
    u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_do_not_go_backwards() {
        let a = Instant::now();
        let b = Instant::now();
        assert!(b >= a);
        assert_eq!(a.duration_since(b), Duration::ZERO);
        assert!(unix_seconds() > 1.7e9);
        assert!(since_unix_epoch() > Duration::from_secs(1_700_000_000));
    }
}
