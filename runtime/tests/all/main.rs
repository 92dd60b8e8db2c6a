//! sonde's integration tests: one binary, a module per area.

mod cli;
mod sandbox;
mod support;
mod tcp;
