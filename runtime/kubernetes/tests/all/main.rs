//! sonde-kubernetes's contract tests, with no agent around the crate: the
//! shipped CRDs and gate injection read against the crate's types, and
//! the status Lease against the mocked API server on tokio's paused clock.
//! The controllers driven by a running agent are in the sonde crate's
//! tests (`kubernetes::`). One binary, a module per area.

mod crd;
mod injection;
mod status;
mod support;
