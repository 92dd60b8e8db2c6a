//! What a host login reads and writes on a plugin's session, whatever its
//! protocol ([`super::postgres`], [`super::redis`]): the password it
//! sends, and the session as it reads it, through the scan a probe that
//! holds secrets puts on what the server sends.

use crate::bindings::Session;
use crate::bindings::sonde::probe::tls::TlsError as WitError;
use sonde_policy::grants::CallGrants;
use sonde_policy::secrets::scrub::{QUIET, Scrubber, WITHHELD};
use std::sync::Arc;
use zeroize::Zeroizing;

/// What a login needs besides the session: the password's bytes, and what
/// to scrub from the server's refusal.
pub(super) struct Secret {
    /// The password, its handles expanded.
    pub(super) password: Zeroizing<Vec<u8>>,
    /// The call's scrubber, when the probe holds secrets.
    pub(super) scrubber: Option<Arc<Scrubber>>,
}

impl Secret {
    /// `text` (the host's words about a server's answer), withheld whole
    /// when it reflects one of the call's secrets.
    pub(super) fn scrub(&self, text: String) -> String {
        match &self.scrubber {
            Some(s) => s.text(&text).into_owned(),
            None => text,
        }
    }

    /// A server's refusal as the plugin reads it: `words` of its `raw`
    /// bytes, or [`sonde_policy::secrets::scrub::WITHHELD`] when those
    /// bytes (checked before any conversion to text) reflect a secret.
    pub(super) fn refusal(&self, raw: &[u8], words: impl FnOnce(&[u8]) -> String) -> String {
        match &self.scrubber {
            Some(s) if s.reflects(raw) => sonde_policy::secrets::scrub::WITHHELD.to_string(),
            _ => words(raw),
        }
    }
}

/// A session as a login reads it. For a probe that holds secrets, what the
/// server sends goes through the session's
/// [`Stream`](sonde_policy::secrets::scrub::Stream) first, as it would
/// for the plugin: an echo of the password is withheld before the host's
/// parser sees any byte of it (a parser that took a reflected password's
/// bytes as a length or a tag would show them through what it does next),
/// and the login's errors quote no byte the server sent.
pub(super) struct LoginIo<'a> {
    session: &'a mut Session,
    scrubber: Option<Arc<Scrubber>>,
    grants: &'a CallGrants,
}

impl<'a> LoginIo<'a> {
    pub(super) fn new(session: &'a mut Session, secret: &Secret, grants: &'a CallGrants) -> Self {
        Self {
            session,
            scrubber: secret.scrubber.clone(),
            grants,
        }
    }

    /// Whether an error may quote what the server sent (not to a probe
    /// that holds secrets).
    pub(super) fn quote(&self) -> bool {
        self.scrubber.is_none()
    }

    /// Sends all of `data`.
    pub(super) async fn send(&mut self, data: &[u8]) -> Result<(), WitError> {
        self.session
            .stream
            .send(data)
            .await
            .map_err(|e| WitError::Connect(format!("send: {e}")))
    }

    /// Some bytes into `buf` (0 when the server closed).
    pub(super) async fn receive(&mut self, buf: &mut [u8]) -> Result<usize, WitError> {
        let Some(scrubber) = self.scrubber.clone() else {
            loop {
                match self.session.stream.receive(buf).await {
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    other => return other.map_err(|e| WitError::Connect(format!("receive: {e}"))),
                }
            }
        };
        let mut chunk = vec![0; buf.len().max(512)];
        loop {
            let ready = &mut self.session.ready;
            if !ready.is_empty() {
                let n = buf.len().min(ready.len());
                buf[..n].copy_from_slice(&ready[..n]);
                ready.drain(..n);
                return Ok(n);
            }
            let scan = &mut self.session.scan;
            if scan.is_withheld() {
                return Err(WitError::Handshake(format!(
                    "the server's answer reflected the password: {WITHHELD}"
                )));
            }
            let holding = scan.holds();
            let read = self.session.stream.receive(&mut chunk);
            let passed = match if holding {
                tokio::time::timeout(QUIET, read).await.ok()
            } else {
                Some(read.await)
            } {
                Some(Ok(0)) | None if holding => self.session.scan.release(&scrubber),
                Some(Ok(0)) => return Ok(0),
                Some(Ok(n)) => self.session.scan.push(&scrubber, &chunk[..n]),
                Some(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Some(Err(e)) => return Err(WitError::Connect(format!("receive: {e}"))),
                None => continue,
            };
            self.session.ready.extend_from_slice(&passed.data);
            if passed.spilled {
                self.grants.secrets_spilled();
            }
        }
    }
}

/// Sends all of `data` for a login.
pub(super) async fn send(io: &mut LoginIo<'_>, data: &[u8]) -> Result<(), WitError> {
    io.send(data).await
}

/// Fills `buf` from the session, reading nothing past it.
pub(super) async fn read_exact(io: &mut LoginIo<'_>, buf: &mut [u8]) -> Result<(), WitError> {
    let mut at = 0;
    while at < buf.len() {
        match io.receive(&mut buf[at..]).await? {
            0 => return Err(closed()),
            n => at += n,
        }
    }
    Ok(())
}

/// The server closed the connection in the middle of the login.
pub(super) fn closed() -> WitError {
    WitError::Connect("the server closed the connection during the login".into())
}

/// A server that does not speak the protocol as it should: the target's
/// failure (the plugin reports it as such), not the probe's config.
pub(super) fn protocol_error(what: impl std::fmt::Display) -> WitError {
    WitError::Handshake(format!("protocol error: {what}"))
}
