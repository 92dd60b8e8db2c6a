//! Shared test setup: the registries the client is tested against. The
//! tests of sonde-core and of the sonde crate include these files too.

#[allow(
    dead_code,
    reason = "shared with the sonde crate's tests (`#[path]`), which use the rest"
)]
pub(crate) mod hostile_registry;
#[allow(
    dead_code,
    reason = "shared with the tests of sonde-core and sonde (`#[path]`), which use the rest"
)]
pub(crate) mod registry;
