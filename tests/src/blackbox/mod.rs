//! blackbox_exporter beside sonde: each release the answers are compared
//! with, run on a loopback port ([`exporter`]), and the comparison of one
//! case's answers series by series ([`compare`]). The side-by-side tests
//! themselves start sonde's agent, so they live in the `sonde` crate's
//! tests (`blackbox`); what is here names no sonde crate.
//!
//! The releases ([`Release`]): 0.23, `/usr/bin/prometheus-blackbox-exporter`
//! (Debian 12's `prometheus-blackbox-exporter`), and 0.28, the current one,
//! at the path in `SONDE_BLACKBOX_028` (`scripts/tools.sh` builds it from
//! the Go module proxy; scripts/test exports it). Without one, its half of
//! each test is skipped, unless `SONDE_REQUIRE_TOOLS` is set.

pub mod compare;
pub mod exporter;

pub use compare::differences;
pub use exporter::{Blackbox, Release, get};
