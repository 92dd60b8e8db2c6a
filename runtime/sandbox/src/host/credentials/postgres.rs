//! The host's PostgreSQL login (`credentials.postgres-login`): after the
//! plugin's StartupMessage, the host reads the server's Authentication
//! requests and answers them (cleartext password, md5, SCRAM-SHA-256 with
//! the server's signature verified) until AuthenticationOk or an
//! ErrorResponse, reading no byte past either.

use super::login_io::{LoginIo, Secret, protocol_error, read_exact, send};
use super::scram::{Scram, salted_password};
use crate::bindings::sonde::probe::credentials::Login;
use crate::bindings::sonde::probe::tls::TlsError as WitError;
use crate::host::bounds::CallBounds;
use md5::{Digest, Md5};
use zeroize::Zeroizing;

/// The largest backend message a login reads.
pub(super) const MAX_MESSAGE: usize = 64 * 1024;

/// The most messages one login reads (SCRAM takes four, and a few
/// notices may come; a server that keeps talking is not logging anyone
/// in).
const MAX_MESSAGES: usize = 16;

/// One backend message: its type byte and body.
struct Message {
    tag: u8,
    body: Vec<u8>,
}

/// Reads one backend message: a 5-byte header, then exactly its body.
async fn receive(stream: &mut LoginIo<'_>) -> Result<Message, WitError> {
    let mut head = [0u8; 5];
    read_exact(stream, &mut head).await?;
    let tag = head[0];
    let len = i32::from_be_bytes([head[1], head[2], head[3], head[4]]);
    let len = usize::try_from(len)
        .ok()
        .filter(|l| (4..=MAX_MESSAGE + 4).contains(l))
        .ok_or_else(|| {
            protocol_error(if stream.quote() {
                format!(
                    "a message {} of length {len} (at most {MAX_MESSAGE} bytes are read)",
                    shown(tag)
                )
            } else {
                format!("a message longer than the {MAX_MESSAGE} bytes read")
            })
        })?;
    let mut body = vec![0; len - 4];
    read_exact(stream, &mut body).await?;
    Ok(Message { tag, body })
}

/// Sends one frontend message; its buffer is zeroed when dropped (it may
/// hold the password).
async fn send_message(stream: &mut LoginIo<'_>, tag: u8, body: &[u8]) -> Result<(), WitError> {
    let len = i32::try_from(body.len() + 4).map_err(|_| WitError::Invalid("a message too large to send".into()))?;
    let mut msg = Zeroizing::new(Vec::with_capacity(body.len() + 5));
    msg.push(tag);
    msg.extend_from_slice(&len.to_be_bytes());
    msg.extend_from_slice(body);
    send(stream, &msg).await
}

/// A message type as a person reads it.
fn shown(tag: u8) -> String {
    if tag.is_ascii_graphic() {
        format!("{:?}", tag as char)
    } else {
        format!("0x{tag:02x}")
    }
}

/// The fields of an ErrorResponse a person needs, as the plugin words
/// them: `SEVERITY CODE: message (detail)`. The caller scrubs it.
pub(super) fn server_error(body: &[u8]) -> String {
    let (mut severity, mut localized, mut code, mut message, mut detail) = (None, None, None, None, None);
    let mut rest = body;
    while let Some((&field, tail)) = rest.split_first() {
        if field == 0 {
            break;
        }
        let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
        let value = String::from_utf8_lossy(&tail[..end]).into_owned();
        match field {
            b'V' => severity = Some(value),
            b'S' => localized = Some(value),
            b'C' => code = Some(value),
            b'M' => message = Some(value),
            b'D' => detail = Some(value),
            _ => {}
        }
        rest = tail.get(end + 1..).unwrap_or_default();
    }
    let mut text = format!(
        "{} {}: {}",
        severity.or(localized).unwrap_or_default(),
        code.unwrap_or_default(),
        message.unwrap_or_default()
    );
    if let Some(d) = detail {
        text.push_str(&format!(" ({d})"));
    }
    text
}

/// `md5` followed by hex(md5(hex(md5(password + user)) + salt)).
pub(super) fn md5_password(user: &str, password: &[u8], salt: &[u8]) -> Zeroizing<Vec<u8>> {
    let mut inner = Md5::new();
    inner.update(password);
    inner.update(user.as_bytes());
    let inner = Zeroizing::new(hex(&inner.finalize()));
    let mut outer = Md5::new();
    outer.update(inner.as_bytes());
    outer.update(salt);
    let mut out = Zeroizing::new(b"md5".to_vec());
    out.extend_from_slice(hex(&outer.finalize()).as_bytes());
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Where a login stands between the server's requests.
#[derive(Default)]
struct State {
    /// The method the server asked for: one per login, so a server that
    /// started SCRAM cannot ask for the cleartext password next.
    method: Option<&'static str>,
    /// A SCRAM exchange: started, then its client-final sent.
    scram: Option<Scram>,
    sent_final: Option<super::scram::ClientFinal>,
    /// The server proved it knows the password (SASLFinal checked).
    verified: bool,
}

/// Logs in as `user` with `secret`'s password on a session whose
/// StartupMessage was sent.
pub(super) async fn login(
    stream: &mut LoginIo<'_>,
    bounds: &CallBounds,
    user: &str,
    secret: &Secret,
) -> Result<Login, WitError> {
    let mut state = State::default();
    for _ in 0..MAX_MESSAGES {
        let msg = receive(stream).await?;
        match msg.tag {
            b'E' => return Ok(Login::Refused(secret.refusal(&msg.body, server_error))),
            // A NoticeResponse may come at any time.
            b'N' => continue,
            b'R' => {}
            other => {
                return Err(protocol_error(if stream.quote() {
                    format!("a message {} before AuthenticationOk", shown(other))
                } else {
                    "an unexpected message before AuthenticationOk".into()
                }));
            }
        }
        let Some(kind) = msg.body.get(..4).map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]])) else {
            return Err(protocol_error("a short Authentication message"));
        };
        let data = &msg.body[4..];
        match kind {
            0 => return authenticated(&state),
            3 => {
                state.start("password")?;
                cleartext(stream, secret).await?;
            }
            5 => {
                state.start("md5")?;
                let salt = data.get(..4).ok_or_else(|| protocol_error("a short md5 salt"))?;
                send_message(stream, b'p', &cstring(&md5_password(user, &secret.password, salt))).await?;
            }
            10 => {
                state.start("scram-sha-256")?;
                state.scram = Some(sasl_start(stream, data).await?);
            }
            11 => state.sent_final = Some(sasl_continue(stream, bounds, &state, data, secret).await?),
            12 => {
                let fin = state
                    .sent_final
                    .as_ref()
                    .ok_or_else(|| protocol_error("SASLFinal before SASLContinue"))?;
                fin.verify_server(&String::from_utf8_lossy(data))
                    .map_err(|e| WitError::Handshake(format!("SCRAM: {}", secret.scrub(e.to_string()))))?;
                state.verified = true;
            }
            2 | 6 => return Err(unsupported("Kerberos V5 or SCM credential")),
            7..=9 => return Err(unsupported("GSSAPI or SSPI")),
            other if stream.quote() => {
                return Err(protocol_error(format!("an unknown authentication request {other}")));
            }
            _ => return Err(protocol_error("an unknown authentication request")),
        }
    }
    Err(protocol_error(format!(
        "more than {MAX_MESSAGES} messages without AuthenticationOk"
    )))
}

impl State {
    /// The server asks for `method`: the login's first request.
    fn start(&mut self, method: &'static str) -> Result<(), WitError> {
        if let Some(first) = self.method {
            return Err(protocol_error(format!(
                "a request for {method} authentication after one for {first}"
            )));
        }
        self.method = Some(method);
        Ok(())
    }
}

/// AuthenticationOk: accepted, unless a SCRAM exchange was started and the
/// server never proved it knows the password.
fn authenticated(state: &State) -> Result<Login, WitError> {
    if state.scram.is_some() && !state.verified {
        return Err(WitError::Handshake(
            "SCRAM: the server accepted the login without proving it knows the password".into(),
        ));
    }
    Ok(Login::Accepted(state.method.unwrap_or("trust").into()))
}

fn unsupported(what: &str) -> WitError {
    WitError::Invalid(format!(
        "the server asks for {what} authentication, which sonde does not speak"
    ))
}

fn cstring(bytes: &[u8]) -> Zeroizing<Vec<u8>> {
    let mut v = Zeroizing::new(Vec::with_capacity(bytes.len() + 1));
    v.extend_from_slice(bytes);
    v.push(0);
    v
}

/// AuthenticationCleartextPassword: the password, as a C string.
async fn cleartext(stream: &mut LoginIo<'_>, secret: &Secret) -> Result<(), WitError> {
    if secret.password.contains(&0) {
        return Err(WitError::Invalid(
            "the password holds a NUL byte, which PostgreSQL's password message cannot carry".into(),
        ));
    }
    send_message(stream, b'p', &cstring(&secret.password)).await
}

/// AuthenticationSASL: picks SCRAM-SHA-256 and sends the
/// client-first-message.
async fn sasl_start(stream: &mut LoginIo<'_>, data: &[u8]) -> Result<Scram, WitError> {
    let mechanisms: Vec<String> = data
        .split(|&b| b == 0)
        .take_while(|m| !m.is_empty())
        .map(|m| String::from_utf8_lossy(m).into_owned())
        .collect();
    if !mechanisms.iter().any(|m| m == "SCRAM-SHA-256") {
        return Err(WitError::Invalid(format!(
            "the server offers only SASL mechanisms {mechanisms:?}; sonde speaks SCRAM-SHA-256"
        )));
    }
    let scram = Scram::new().map_err(|e| match std::error::Error::source(&e) {
        Some(cause) => WitError::Invalid(format!("{e}: {cause}")),
        None => WitError::Invalid(e.to_string()),
    })?;
    let first = scram.client_first();
    let mut body = b"SCRAM-SHA-256\0".to_vec();
    body.extend_from_slice(&(first.len() as i32).to_be_bytes());
    body.extend_from_slice(first.as_bytes());
    send_message(stream, b'p', &body).await?;
    Ok(scram)
}

/// AuthenticationSASLContinue: derives the salted password (on a blocking
/// thread: up to a million rounds) and sends the client-final-message.
async fn sasl_continue(
    stream: &mut LoginIo<'_>,
    bounds: &CallBounds,
    state: &State,
    data: &[u8],
    secret: &Secret,
) -> Result<super::scram::ClientFinal, WitError> {
    let scram = match (&state.scram, &state.sent_final) {
        (Some(s), None) => s,
        _ => return Err(protocol_error("SASLContinue out of turn")),
    };
    let first = scram
        .server_first(&String::from_utf8_lossy(data))
        .map_err(|e| WitError::Handshake(format!("SCRAM: {e}")))?;
    let (password, salt, iterations) = (secret.password.clone(), first.salt.clone(), first.iterations);
    let salted = bounds
        .run_blocking(None, move || salted_password(&password, &salt, iterations))
        .await
        .map_err(|e| WitError::Invalid(format!("SCRAM: {e}")))?;
    let fin = scram.client_final(&first, salted.as_ref());
    send_message(stream, b'p', fin.message.as_bytes()).await?;
    Ok(fin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn md5_answers_as_libpq_does() {
        // md5(hex(md5("secret" + "postgres")) + 01 02 03 04), computed
        // independently with Python's hashlib.
        let got = md5_password("postgres", b"secret", &[1, 2, 3, 4]);
        assert_eq!(got.as_slice(), b"md5bb41a296aab6baccb36ff243a562abff");
    }

    #[test]
    fn error_responses_keep_the_fields_a_person_needs() {
        let body = b"SFATAL\0VFATAL\0C28P01\0Mpassword authentication failed for user \"x\"\0Fauth.c\0\0";
        assert_eq!(
            server_error(body),
            "FATAL 28P01: password authentication failed for user \"x\""
        );
        assert_eq!(
            server_error(b"SERREUR\0C3D000\0Mno\0Dmore\0\0"),
            "ERREUR 3D000: no (more)"
        );
        assert_eq!(server_error(b"Mcut"), " : cut");
    }

    #[test]
    fn shown_tags_are_printable() {
        assert_eq!(shown(b'Z'), "'Z'");
        assert_eq!(shown(0), "0x00");
    }
}
