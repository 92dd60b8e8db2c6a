//! PostgreSQL and Redis logins by the host on a plugin's session. The
//! plugin opened the session (`tcp.connect`) and names
//! the password by handle; the host expands it toward the session's peer
//! (`Use::Secret`, through [`expand_or_text`]), speaks the login itself
//! ([`super::postgres`], [`super::redis`]) and hands the plugin the
//! outcome, the server's refusal scrubbed.
//!
//! A login reads exactly what belongs to it and nothing after, so what
//! follows (PostgreSQL's ParameterStatus... ReadyForQuery) is the
//! plugin's to read through the session. It is refused on a session that
//! holds data the plugin has not read yet: the login must follow the
//! StartupMessage (PostgreSQL) or the connection (Redis) at once.
//!
//! No message built here holds a byte of the password, and every buffer
//! that held one is zeroed when dropped ([`zeroize::Zeroizing`]).

use super::super::tls::TlsView;
use super::login_io::{LoginIo, Secret};
use super::{expand_or_text, secret_error};
use crate::bindings::Session;
use crate::bindings::sonde::probe::credentials::Login;
use crate::bindings::sonde::probe::tls::TlsError as WitError;
use sonde_policy::grants::{CallGrants, Use};
use std::future::Future;
use std::time::{Duration, Instant};
use wasmtime::component::Resource;

/// `credentials.postgres-login`.
pub(super) async fn postgres(
    view: &mut TlsView<'_>,
    conn: Resource<Session>,
    user: &str,
    password: &str,
    timeout_ms: u64,
) -> wasmtime::Result<Result<Login, WitError>> {
    let TlsView {
        table,
        grants,
        bounds,
        deadline,
        ..
    } = view;
    let session = table.get_mut(&conn)?;
    let secret = match prepare(session, grants, password, "postgres-login") {
        Ok(s) => s,
        Err(e) => return Ok(Err(e)),
    };
    let mut io = LoginIo::new(session, &secret, grants);
    let login = super::postgres::login(&mut io, bounds, user, &secret);
    Ok(within(*deadline, timeout_ms, "PostgreSQL login", login).await)
}

/// `credentials.redis-login`.
pub(super) async fn redis(
    view: &mut TlsView<'_>,
    conn: Resource<Session>,
    username: Option<&str>,
    password: &str,
    timeout_ms: u64,
) -> wasmtime::Result<Result<Login, WitError>> {
    let TlsView {
        table,
        grants,
        deadline,
        ..
    } = view;
    let session = table.get_mut(&conn)?;
    let secret = match prepare(session, grants, password, "redis-login") {
        Ok(s) => s,
        Err(e) => return Ok(Err(e)),
    };
    let mut io = LoginIo::new(session, &secret, grants);
    let login = super::redis::login(&mut io, username, &secret);
    Ok(within(*deadline, timeout_ms, "Redis login", login).await)
}

/// Checks that `session` is where a login starts, and expands `password`
/// toward its peer.
fn prepare(session: &Session, grants: &CallGrants, password: &str, what: &str) -> Result<Secret, WitError> {
    if !session.ready.is_empty() || session.scan.holds() || session.scan.is_withheld() {
        return Err(WitError::Invalid(format!(
            "{what}: the session holds data the plugin has not read; log in right after connecting (and, for PostgreSQL, sending the StartupMessage)"
        )));
    }
    let (host, port) = (session.peer.0.as_str(), session.peer.1);
    let password = expand_or_text(grants, password, Use::Tcp { host, port }).map_err(secret_error)?;
    Ok(Secret {
        password,
        // After the expansion: it scrubs what was built from the secrets too.
        scrubber: grants.scrubber(),
    })
}

/// Runs `login` within `timeout_ms`; a timeout that would end after the
/// call's `deadline` is left to the deadline, which records `timeout`.
async fn within<T>(
    deadline: Instant,
    timeout_ms: u64,
    what: &str,
    login: impl Future<Output = Result<T, WitError>>,
) -> Result<T, WitError> {
    let left = deadline.saturating_duration_since(Instant::now());
    let timeout = Duration::from_millis(timeout_ms);
    if timeout >= left {
        return login.await;
    }
    match tokio::time::timeout(timeout, login).await {
        Ok(result) => result,
        Err(_) => Err(WitError::Timeout(format!("no {what} within {}ms", timeout.as_millis()))),
    }
}
