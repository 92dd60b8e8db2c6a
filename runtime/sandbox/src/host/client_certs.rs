//! The client certificates one call registered (`credentials.client-certificate`),
//! by peer: what `tls`, `http` and `grpc` present in a handshake with it.

use super::pool::canonical_host;
use crate::bindings::sonde::probe::tls::TlsError as WitError;
use std::sync::{Arc, Mutex};

pub(crate) use super::tls_client::ClientCert;

/// The most client certificates one call may register.
pub(crate) const MAX_CLIENT_CERTS: usize = 4;

/// The client certificates a call registered, by peer (its host in
/// canonical spelling, and port).
#[derive(Default)]
pub(crate) struct ClientCerts(Mutex<Vec<(String, u16, Arc<ClientCert>)>>);

impl ClientCerts {
    /// The certificate to present to `host:port`, if one was registered.
    pub(crate) fn for_peer(&self, host: &str, port: u16) -> Option<Arc<ClientCert>> {
        let host = canonical_host(host);
        let certs = self.0.lock().unwrap_or_else(|e| e.into_inner());
        certs
            .iter()
            .find(|(h, p, _)| *h == host && *p == port)
            .map(|(_, _, c)| c.clone())
    }

    pub(crate) fn set(&self, host: &str, port: u16, cert: Arc<ClientCert>) -> Result<(), WitError> {
        let host = canonical_host(host);
        let mut certs = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = certs.iter_mut().find(|(h, p, _)| *h == host && *p == port) {
            slot.2 = cert;
            return Ok(());
        }
        if certs.len() >= MAX_CLIENT_CERTS {
            return Err(WitError::Invalid(format!(
                "at most {MAX_CLIENT_CERTS} client certificates per call"
            )));
        }
        certs.push((host, port, cert));
        Ok(())
    }
}
