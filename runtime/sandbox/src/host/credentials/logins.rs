//! PostgreSQL and Redis logins by the host on a plugin's session.

use super::super::tls::TlsView;
use crate::bindings::Session;
use crate::bindings::sonde::probe::credentials::Login;
use crate::bindings::sonde::probe::tls::TlsError as WitError;
use wasmtime::component::Resource;

/// `credentials.postgres-login`.
pub(super) async fn postgres(
    _view: &mut TlsView<'_>,
    _conn: Resource<Session>,
    _user: &str,
    _password: &str,
    _timeout_ms: u64,
) -> wasmtime::Result<Result<Login, WitError>> {
    Ok(Err(WitError::Invalid("postgres-login: under construction".into())))
}

/// `credentials.redis-login`.
pub(super) async fn redis(
    _view: &mut TlsView<'_>,
    _conn: Resource<Session>,
    _username: Option<&str>,
    _password: &str,
    _timeout_ms: u64,
) -> wasmtime::Result<Result<Login, WitError>> {
    Ok(Err(WitError::Invalid("redis-login: under construction".into())))
}
