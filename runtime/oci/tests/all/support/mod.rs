//! Shared test setup: the registries the client is tested against. The
//! tests of sonde-core, sonde-kubernetes and the sonde crate include these
//! files too.

#[allow(
    dead_code,
    reason = "shared with the tests of sonde and sonde-kubernetes (`#[path]`), which use the rest"
)]
pub(crate) mod hostile_registry;
#[allow(
    dead_code,
    reason = "shared with the tests of sonde-core, sonde-kubernetes and sonde (`#[path]`), which use the rest"
)]
pub(crate) mod registry;
pub(crate) mod signed;
