//! sonde's integration tests: one binary, a module per area.

mod cli;
mod exec;
mod grpc;
mod http;
mod sandbox;
mod support;
mod tcp;
