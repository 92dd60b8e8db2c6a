//! sonde's `credentials` interface: what the host does with the probe's
//! secrets for the plugin, which names them by handle and never reads
//! them ([`sonde_policy::secrets`]).
//!
//! - `client-certificate` registers a client certificate for a peer;
//!   every TLS handshake of the call with that peer (`tls`, `http`,
//!   `grpc`) presents it ([`super::client_certs`]).
//! - `postgres-login` and `redis-login` log in on a session the plugin
//!   opened, the host answering the server's requests ([`logins`],
//!   [`postgres`], [`redis`]).
//!
//! Each secret is expanded through [`CallGrants::expand`], which checks
//! it (`Use::Secret`) toward the peer; what the peer answers reaches the
//! plugin scrubbed.

mod login_io;
mod logins;
mod postgres;
mod redis;
mod scram;

use super::client_certs::ClientCert;
use super::tls::{Tls, TlsView};
use crate::bindings::Session;
use crate::bindings::sonde::probe::credentials as probe_credentials;
use crate::bindings::sonde::probe::tls::TlsError as WitError;
use probe_credentials::Login;
use sonde_policy::grants::{CallGrants, SecretUseError, Use};
use std::sync::Arc;
use wasmtime::component::{Linker, Resource};
use zeroize::Zeroizing;

/// Adds the `credentials` interface to `linker` (the once-per-process
/// phase); `get` gives the same view of the call as `tls`.
pub(crate) fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    get: fn(&mut T) -> TlsView<'_>,
) -> wasmtime::Result<()> {
    probe_credentials::add_to_linker::<T, Tls>(linker, get)
}

/// A refused use of a secret, as the `tls-error` a plugin gets.
pub(crate) fn secret_error(e: SecretUseError) -> WitError {
    match e {
        SecretUseError::Denied(d) => WitError::Denied(d.0),
        SecretUseError::Invalid(m) | SecretUseError::Unavailable(m) => WitError::Invalid(m),
    }
}

/// The bytes `text` stands for toward `toward`: its handles expanded, or
/// the text itself when it holds none.
pub(crate) fn expand_or_text(
    grants: &CallGrants,
    text: &str,
    toward: Use<'_>,
) -> Result<Zeroizing<Vec<u8>>, SecretUseError> {
    Ok(grants
        .expand(text, toward)?
        .unwrap_or_else(|| Zeroizing::new(text.as_bytes().to_vec())))
}

impl probe_credentials::Host for TlsView<'_> {
    fn client_certificate(
        &mut self,
        host: String,
        port: u16,
        cert: String,
        key: String,
    ) -> wasmtime::Result<Result<(), WitError>> {
        Ok(self.register_client_cert(&host, port, &cert, &key))
    }

    async fn postgres_login(
        &mut self,
        conn: Resource<Session>,
        user: String,
        password: String,
        timeout_ms: u64,
    ) -> wasmtime::Result<Result<Login, WitError>> {
        logins::postgres(self, conn, &user, &password, timeout_ms).await
    }

    async fn redis_login(
        &mut self,
        conn: Resource<Session>,
        username: Option<String>,
        password: String,
        timeout_ms: u64,
    ) -> wasmtime::Result<Result<Login, WitError>> {
        logins::redis(self, conn, username.as_deref(), &password, timeout_ms).await
    }
}

impl TlsView<'_> {
    fn register_client_cert(&mut self, host: &str, port: u16, cert: &str, key: &str) -> Result<(), WitError> {
        if host.is_empty() {
            return Err(WitError::Invalid("no host".into()));
        }
        let toward = Use::Tls { host, port };
        self.grants.authorize(toward).map_err(|d| WitError::Denied(d.0))?;
        let cert_pem = expand_or_text(self.grants, cert, toward).map_err(secret_error)?;
        let key_pem = expand_or_text(self.grants, key, toward).map_err(secret_error)?;
        let parsed = ClientCert::parse(&cert_pem, &key_pem)
            .map_err(|e| WitError::Invalid(format!("client certificate for {host}:{port}: {e}")))?;
        self.certs.set(host, port, Arc::new(parsed))
    }
}
