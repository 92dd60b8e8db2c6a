//! The `sonde` command and agent. [`agent`] wires the crates below into
//! `sonde run` (the sandbox, the agent core, Kubernetes), [`api`] is its
//! HTTP API and [`cli`] the command line; [`build`] says which build is
//! running. The layers and why the crates are cut where they are:
//! docs/architecture.md.

#![deny(missing_docs)]

pub mod agent;
pub mod api;
pub mod build;
pub mod cli;
