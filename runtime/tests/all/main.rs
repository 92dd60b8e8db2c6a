//! sonde's integration tests: one binary, a module per area.

mod cli;
mod exec;
mod http;
mod sandbox;
mod support;
mod tcp;
mod tls;
