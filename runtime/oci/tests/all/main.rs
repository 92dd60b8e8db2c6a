//! sonde-oci's contract tests: the registry client against a real
//! registry and against hostile ones, and plugin signatures. One binary,
//! a module per area.

mod hostile;
mod registry;
mod signing;
mod support;
