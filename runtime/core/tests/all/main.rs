//! sonde-core's contract tests, on the config, a loaded `Catalog` and the
//! scheduler with no agent around them: the kubelet's probe semantics on
//! tokio's paused clock, incremental catalog changes, the config parser
//! (the docs' configs, and under fuzzing), plugins pulled and run,
//! node-problem-detector's system-log monitor on real logs. One
//! binary, a module per area.

mod catalog;
mod config;
mod fuzz;
mod metrics;
mod npd_syslog;
mod oci;
mod scheduler;
mod support;
