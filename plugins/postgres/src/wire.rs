//! The PostgreSQL frontend/backend protocol, version 3.0: just what a
//! health check needs (startup, authentication messages, simple query).

use sonde_sdk::tls::Session;
use std::fmt;
use std::io::{self, Read};

/// The largest backend message read; a bigger one ends the check.
const MAX_MESSAGE: usize = 1024 * 1024;

/// Protocol 3.0, as the startup message's version field.
const PROTOCOL_3_0: i32 = 196_608;

/// One backend message: its type byte and body.
pub(crate) struct Message {
    pub tag: u8,
    pub body: Vec<u8>,
}

/// A server's ErrorResponse or NoticeResponse, the fields a person needs.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct ServerError {
    pub severity: String,
    pub code: String,
    pub message: String,
    pub detail: Option<String>,
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.severity, self.code, self.message)?;
        if let Some(d) = &self.detail {
            write!(f, " ({d})")?;
        }
        Ok(())
    }
}

impl ServerError {
    /// Parses the body of an ErrorResponse or NoticeResponse.
    pub(crate) fn parse(body: &[u8]) -> Self {
        let mut err = Self::default();
        let mut localized_severity = String::new();
        let mut rest = body;
        while let Some((&field, tail)) = rest.split_first() {
            if field == 0 {
                break;
            }
            let (value, tail) = cstr(tail);
            match field {
                b'S' => localized_severity = value,
                b'V' => err.severity = value,
                b'C' => err.code = value,
                b'M' => err.message = value,
                b'D' => err.detail = Some(value),
                _ => {}
            }
            rest = tail;
        }
        if err.severity.is_empty() {
            err.severity = localized_severity;
        }
        err
    }
}

/// Splits a NUL-terminated string off the front of `bytes`.
pub(crate) fn cstr(bytes: &[u8]) -> (String, &[u8]) {
    match bytes.iter().position(|&b| b == 0) {
        Some(i) => (String::from_utf8_lossy(&bytes[..i]).into_owned(), &bytes[i + 1..]),
        None => (String::from_utf8_lossy(bytes).into_owned(), &[]),
    }
}

/// Reads a big-endian i32 at `at`.
pub(crate) fn be_i32(bytes: &[u8], at: usize) -> Option<i32> {
    bytes
        .get(at..at + 4)
        .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

fn be_i16(bytes: &[u8], at: usize) -> Option<i16> {
    bytes.get(at..at + 2).map(|b| i16::from_be_bytes([b[0], b[1]]))
}

pub(crate) fn protocol_error(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("protocol error: {}", what.into()))
}

/// A connection speaking the protocol, over a session the host holds
/// (`tcp`): a probe granted secrets opens no socket of its own.
pub(crate) struct Conn {
    stream: Session,
    buf: Vec<u8>,
}

impl Conn {
    pub(crate) fn new(stream: Session) -> Self {
        Self {
            stream,
            buf: Vec::new(),
        }
    }

    /// The session, for a login by the host; `None` once a backend message
    /// was read past (the host must read from where the plugin stopped).
    pub(crate) fn session(&self) -> Option<&Session> {
        self.buf.is_empty().then_some(&self.stream)
    }

    /// Sends the StartupMessage with `params` (name, value pairs).
    pub(crate) fn startup(&mut self, params: &[(&str, &str)]) -> io::Result<()> {
        let mut body = PROTOCOL_3_0.to_be_bytes().to_vec();
        for (name, value) in params {
            body.extend_from_slice(name.as_bytes());
            body.push(0);
            body.extend_from_slice(value.as_bytes());
            body.push(0);
        }
        body.push(0);
        let mut msg = ((body.len() + 4) as i32).to_be_bytes().to_vec();
        msg.extend_from_slice(&body);
        sonde_sdk::net::send(&mut self.stream, &msg)
    }

    /// Sends one frontend message.
    pub(crate) fn send(&mut self, tag: u8, body: &[u8]) -> io::Result<()> {
        let mut msg = Vec::with_capacity(body.len() + 5);
        msg.push(tag);
        msg.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
        msg.extend_from_slice(body);
        sonde_sdk::net::send(&mut self.stream, &msg)
    }

    fn fill(&mut self, want: usize) -> io::Result<()> {
        let mut chunk = [0u8; 8192];
        while self.buf.len() < want {
            match Read::read(&mut self.stream, &mut chunk) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the server closed the connection",
                    ));
                }
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Reads one backend message.
    pub(crate) fn recv(&mut self) -> io::Result<Message> {
        self.fill(5)?;
        let tag = self.buf[0];
        let len = be_i32(&self.buf, 1).unwrap_or(0);
        if len < 4 {
            return Err(protocol_error(format!("message {:?} with length {len}", tag as char)));
        }
        let len = len as usize;
        if len > MAX_MESSAGE {
            return Err(protocol_error(format!(
                "message {:?} of {len} bytes, more than 1 MiB",
                tag as char
            )));
        }
        self.fill(1 + len)?;
        let body = self.buf[5..1 + len].to_vec();
        self.buf.drain(..1 + len);
        Ok(Message { tag, body })
    }

    /// Sends Terminate; the server closes its side.
    pub(crate) fn terminate(&mut self) {
        let _ = self.send(b'X', &[]);
    }
}

/// What a simple query returned: the rows' text values (at most a few
/// rows are kept), or the server's error.
pub(crate) struct QueryResult {
    pub rows: Vec<Vec<Option<String>>>,
    pub error: Option<ServerError>,
}

/// How many rows of a result are kept.
const KEPT_ROWS: usize = 4;

/// Runs `sql` with the simple query protocol and reads until ReadyForQuery.
pub(crate) fn simple_query(conn: &mut Conn, sql: &str) -> io::Result<QueryResult> {
    let mut body = sql.as_bytes().to_vec();
    body.push(0);
    conn.send(b'Q', &body)?;
    let mut result = QueryResult {
        rows: Vec::new(),
        error: None,
    };
    loop {
        let msg = conn.recv()?;
        match msg.tag {
            b'D' if result.rows.len() < KEPT_ROWS => result.rows.push(data_row(&msg.body)?),
            b'E' => result.error = Some(ServerError::parse(&msg.body)),
            b'Z' => return Ok(result),
            // RowDescription, DataRow past the kept ones, CommandComplete,
            // EmptyQueryResponse, NoticeResponse, ParameterStatus: nothing to keep.
            b'T' | b'D' | b'C' | b'I' | b'N' | b'S' | b'A' => {}
            // COPY would wait for data we never send.
            b'G' | b'H' | b'W' => return Err(protocol_error("the query started a COPY; use a plain query")),
            other => return Err(protocol_error(format!("unexpected message {:?}", other as char))),
        }
    }
}

fn data_row(body: &[u8]) -> io::Result<Vec<Option<String>>> {
    let columns = be_i16(body, 0).ok_or_else(|| protocol_error("short DataRow"))?;
    let mut at = 2;
    let mut row = Vec::new();
    for _ in 0..columns.max(0) {
        let len = be_i32(body, at).ok_or_else(|| protocol_error("short DataRow"))?;
        at += 4;
        if len < 0 {
            row.push(None);
            continue;
        }
        let value = body
            .get(at..at + len as usize)
            .ok_or_else(|| protocol_error("short DataRow"))?;
        row.push(Some(String::from_utf8_lossy(value).into_owned()));
        at += len as usize;
    }
    Ok(row)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_responses_keep_the_fields_a_person_needs() {
        let body = b"SFATAL\0VFATAL\0C28P01\0Mpassword authentication failed for user \"x\"\0Fauth.c\0\0";
        let e = ServerError::parse(body);
        assert_eq!(
            e.to_string(),
            "FATAL 28P01: password authentication failed for user \"x\""
        );
    }

    #[test]
    fn data_rows_parse_nulls_and_values() {
        let mut body = 2i16.to_be_bytes().to_vec();
        body.extend_from_slice(&1i32.to_be_bytes());
        body.push(b'1');
        body.extend_from_slice(&(-1i32).to_be_bytes());
        assert_eq!(data_row(&body).unwrap(), vec![Some("1".into()), None]);
        assert!(data_row(&body[..5]).is_err());
    }
}
