//! Which build of sonde is running: its version and the commit it was
//! built from (`SONDE_COMMIT`, set by this crate's build script). Only
//! this crate reads the commit, so a new commit rebuilds the binary crate
//! and nothing below it; the crates below get it as a value
//! ([`sonde_core::metrics::BuildInfo`]).

use sonde_core::metrics::BuildInfo;

/// The version and commit of this build.
pub const INFO: BuildInfo = BuildInfo {
    version: env!("CARGO_PKG_VERSION"),
    commit: env!("SONDE_COMMIT"),
};

/// `sonde --version`: the version and the commit it was built from.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("SONDE_COMMIT"), ")");
