//! sonde-core's contract tests, on a loaded `Catalog` and the scheduler
//! with no agent around them: the kubelet's probe semantics on tokio's
//! paused clock, incremental registry changes, the config parser under
//! fuzzing. One binary, a module per area.

mod catalog;
mod fuzz;
mod oci;
mod scheduler;
mod support;
