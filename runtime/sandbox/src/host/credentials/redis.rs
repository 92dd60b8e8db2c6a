//! The host's Redis login (`credentials.redis-login`): `AUTH [username]
//! password` as a RESP array, and the server's one reply line.

use super::login_io::{LoginIo, Secret, closed, protocol_error, send};
use crate::bindings::sonde::probe::credentials::Login;
use crate::bindings::sonde::probe::tls::TlsError as WitError;
use zeroize::Zeroizing;

/// The longest reply line read, its CRLF included.
pub(super) const MAX_LINE: usize = 4096;

/// The AUTH command: a RESP array of bulk strings. Zeroed when dropped.
pub(super) fn auth_command(username: Option<&str>, password: &[u8]) -> Zeroizing<Vec<u8>> {
    let mut args: Vec<&[u8]> = vec![b"AUTH"];
    if let Some(user) = username {
        args.push(user.as_bytes());
    }
    args.push(password);
    let mut out = Zeroizing::new(format!("*{}\r\n", args.len()).into_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Reads the one reply line, its CRLF removed. A server sends nothing
/// after its reply to AUTH until the next command: anything more is
/// refused, so no byte the plugin should read is taken.
async fn reply_line(stream: &mut LoginIo<'_>) -> Result<Vec<u8>, WitError> {
    let mut line = Vec::new();
    let mut chunk = [0u8; 512];
    loop {
        let n = match stream.receive(&mut chunk).await? {
            0 => return Err(closed()),
            n => n,
        };
        line.extend_from_slice(&chunk[..n]);
        if let Some(end) = line.windows(2).position(|w| w == b"\r\n") {
            if end + 2 != line.len() {
                return Err(protocol_error("more than one reply to AUTH"));
            }
            line.truncate(end);
            return Ok(line);
        }
        if line.len() >= MAX_LINE {
            return Err(protocol_error(format!("a reply to AUTH longer than {MAX_LINE} bytes")));
        }
    }
}

/// What the reply line says: `+OK` accepted, an error refused (its text
/// scrubbed), anything else the server's failure.
pub(super) fn judge(line: &[u8], secret: &Secret) -> Result<Login, WitError> {
    match line.split_first() {
        Some((b'+', b"OK")) => Ok(Login::Accepted("auth".into())),
        Some((b'-', error)) => Ok(Login::Refused(
            secret.refusal(error, |e| String::from_utf8_lossy(e).into_owned()),
        )),
        Some((b'+' | b':' | b'$' | b'*', _)) => Err(protocol_error("an unexpected reply to AUTH")),
        _ => Err(protocol_error("not a RESP reply (is this a Redis server?)")),
    }
}

/// Logs in with `AUTH [username] password`.
pub(super) async fn login(
    stream: &mut LoginIo<'_>,
    username: Option<&str>,
    secret: &Secret,
) -> Result<Login, WitError> {
    if username.is_some_and(str::is_empty) {
        return Err(WitError::Invalid("redis-login: an empty username".into()));
    }
    send(stream, &auth_command(username, &secret.password)).await?;
    let line = reply_line(stream).await?;
    judge(&line, secret)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sonde_policy::secrets::scrub::Scrubber;
    use std::sync::Arc;

    fn secret(password: &str) -> Secret {
        Secret {
            password: Zeroizing::new(password.as_bytes().to_vec()),
            scrubber: Some(Arc::new(Scrubber::new([password.as_bytes()]))),
        }
    }

    #[test]
    fn auth_is_a_resp_array_with_or_without_a_user() {
        assert_eq!(
            auth_command(None, b"pw").as_slice(),
            b"*2\r\n$4\r\nAUTH\r\n$2\r\npw\r\n"
        );
        assert_eq!(
            auth_command(Some("probe"), b"p\r\nw").as_slice(),
            b"*3\r\n$4\r\nAUTH\r\n$5\r\nprobe\r\n$4\r\np\r\nw\r\n"
        );
    }

    #[test]
    fn replies_are_judged_and_refusals_scrubbed() {
        let s = secret("correct-horse-battery");
        assert!(matches!(judge(b"+OK", &s), Ok(Login::Accepted(m)) if m == "auth"));
        let Ok(Login::Refused(m)) = judge(b"-ERR bad password correct-horse-battery", &s) else {
            panic!("not refused");
        };
        assert_eq!(m, sonde_policy::secrets::scrub::WITHHELD);
        let Ok(Login::Refused(m)) = judge(b"-WRONGPASS invalid username-password pair", &s) else {
            panic!("not refused");
        };
        assert_eq!(m, "WRONGPASS invalid username-password pair");
        assert!(matches!(judge(b"+QUEUED", &s), Err(WitError::Handshake(_))));
        assert!(matches!(judge(b"HTTP/1.1 400", &s), Err(WitError::Handshake(m)) if m.contains("not a RESP")));
        assert!(matches!(judge(b"", &s), Err(WitError::Handshake(_))));
    }
}
