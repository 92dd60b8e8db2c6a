//! sonde's integration tests: one binary, a module per area.

mod agent;
mod cli;
mod exec;
mod grpc;
mod http;
mod sandbox;
mod scheduler;
mod support;
mod tcp;
mod tls;
