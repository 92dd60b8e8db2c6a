//! sonde-sandbox's contract tests, through `sonde_sandbox::engine::Engine`
//! alone: hostile guests against every limit and grant, the built-in
//! plugins against the real servers they check, secrets on the wire,
//! containment of exec'd programs. One binary, a module per area.

mod backend;
mod bounds;
mod containment;
mod fuzz;
mod hostile;
mod instance_pool;
mod plugin_text;
mod probes;
mod secrets;
mod support;
