//! The built-in plugins as the `sonde` command runs them; their contract
//! against real servers is in sonde-sandbox's tests (`probes::`).

mod dialect;
mod dns;
mod postgres;
