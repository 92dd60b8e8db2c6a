//! sonde-kubernetes's contract tests: the shipped CRDs and gate injection
//! read against the crate's types, the status Lease against the mocked API
//! server on tokio's paused clock, and the controllers — readiness gates,
//! Services, namespace tenants, SondeNodeChecks and the node-problem
//! monitors' conditions, SondeCheck status — against the mocked API server,
//! driven by a node agent started without the sonde binary crate
//! (`support::node_agent`). What needs the binary (its HTTP API, its CLI,
//! a real cluster) is in the sonde crate's tests (`kubernetes::`). One
//! binary, a module per area.

// An agent's start, awaited inside a test's own future, nests deeper than
// the compiler's default of 128 when it lays the test's future out.
#![recursion_limit = "256"]

mod crd;
mod gates;
mod injection;
mod namespaces;
mod nodes;
mod npd_nodes;
mod secrets;
mod services;
mod status;
mod support;
