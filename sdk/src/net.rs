//! TCP within the call's deadline.
//!
//! [`host_port`] works with or without `std`. The rest needs `std`: thin
//! wrappers over `std::net`, which on `wasm32-wasip2` goes
//! through the host's `wasi:sockets`: a connection to anything but the
//! probe's target and its `net` grants fails with
//! [`std::io::ErrorKind::PermissionDenied`], and the host records the run as
//! `denied` whatever the plugin returns afterwards.

use alloc::format;
use alloc::vec::Vec;
#[cfg(feature = "std")]
pub use with_std::*;

/// How `describe_error` (with std) and `tls::SessionError::describe` put a
/// timeout and a denial.
pub(crate) const TIMED_OUT: &str = "timed out";

/// How a host call's own deadline reads in the message the SDK makes of
/// it: `timeout: no response within 300ms`.
pub(crate) fn timeout_message(why: &str) -> alloc::string::String {
    alloc::format!("timeout: {why}")
}

/// Whether `message` (the SDK's, perhaps after a `GET URL: ` prefix) says
/// a host call's own deadline passed ([`timeout_message`]).
pub fn is_timeout(message: &str) -> bool {
    message.starts_with("timeout: ") || message.contains(": timeout: ")
}
pub(crate) const NOT_GRANTED: &str = "denied by the host: not granted";

#[cfg(feature = "std")]
mod with_std {
    use crate::Request;
    use std::io::{self, Read, Write};
    use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
    use std::time::{Duration, Instant};

    /// Connects to `addr` (`host:port`), trying each resolved address in turn
    /// until `timeout` has passed. The stream's read and write timeouts are set
    /// to what is left of `timeout`.
    ///
    /// The connect itself blocks: `std`'s `connect_timeout` on wasip2 reports
    /// success for connections that were refused, so it is not used. A connect
    /// that hangs is ended by the host's deadline, which records `timeout`.
    pub fn connect(addr: &str, timeout: Duration) -> io::Result<TcpStream> {
        let start = Instant::now();
        let addrs: Vec<SocketAddr> = addr.to_socket_addrs()?.collect();
        let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{addr}: no address"));
        for sa in addrs {
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{addr}: connect timed out"),
                ));
            }
            match TcpStream::connect(sa) {
                Ok(stream) => {
                    let left = timeout.saturating_sub(start.elapsed()).max(Duration::from_millis(1));
                    stream.set_read_timeout(Some(left))?;
                    stream.set_write_timeout(Some(left))?;
                    return Ok(stream);
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Connects to the request's target within the time the call has left.
    pub fn connect_target(req: &Request) -> io::Result<TcpStream> {
        connect(req.target(), req.remaining())
    }

    /// Why [`open_target`] did not connect.
    #[derive(Debug)]
    pub enum ConnectError {
        /// The target failed: refused, unreachable, timed out. The message
        /// (`connect to TARGET: why`) is for a failure outcome.
        Failed(String),
        /// The check could not be made: the host denied the connection, or the
        /// target is not an address.
        Probe(crate::ProbeError),
    }

    /// Connects to the request's target within the time the call has left, and
    /// sorts what went wrong: a denial or a malformed target is the check's
    /// error, anything else the target's failure.
    pub fn open_target(req: &Request) -> Result<TcpStream, ConnectError> {
        connect_target(req).map_err(|e| match e.kind() {
            io::ErrorKind::PermissionDenied => ConnectError::Probe(crate::ProbeError::denied(format!(
                "connect to {}: {}",
                req.target(),
                describe_error(&e)
            ))),
            io::ErrorKind::InvalidInput => ConnectError::Probe(crate::ProbeError::invalid_config(format!(
                "target {:?}: {e}",
                req.target()
            ))),
            _ => ConnectError::Failed(format!("connect to {}: {}", req.target(), describe_error(&e))),
        })
    }

    /// Writes all of `data` to `stream` (a [`TcpStream`], or a TLS
    /// [`Session`](crate::tls::Session)).
    pub fn send(stream: &mut impl Write, data: &[u8]) -> io::Result<()> {
        stream.write_all(data)?;
        stream.flush()
    }

    /// Reads from `stream` until `done` accepts what was read so far, the peer
    /// closes, `max` bytes have arrived, or a read fails (such as at the read
    /// timeout). Returns what was read, and the error that ended it, if any.
    pub fn read_until(
        stream: &mut impl Read,
        max: usize,
        done: impl FnMut(&[u8]) -> bool,
    ) -> (Vec<u8>, Option<io::Error>) {
        super::read_until_with(
            |chunk| loop {
                match stream.read(chunk) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    other => return other,
                }
            },
            max,
            done,
        )
    }

    /// A short, person-readable reason for a connection error, such as
    /// `connection refused` or `timed out`.
    pub fn describe_error(err: &io::Error) -> String {
        match err.kind() {
            io::ErrorKind::ConnectionRefused => "connection refused".into(),
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => super::TIMED_OUT.into(),
            io::ErrorKind::PermissionDenied => super::NOT_GRANTED.into(),
            io::ErrorKind::HostUnreachable | io::ErrorKind::NetworkUnreachable => "unreachable".into(),
            io::ErrorKind::ConnectionReset => "connection reset".into(),
            _ => err.to_string(),
        }
    }
}

/// The loop of [`read_until`] and [`Session::read_until`](crate::tls::Session::read_until):
/// reads with `read` until `done` accepts what arrived, `read` returns 0
/// (the peer closed), `max` bytes have arrived, or `read` fails.
pub(crate) fn read_until_with<E>(
    mut read: impl FnMut(&mut [u8]) -> Result<usize, E>,
    max: usize,
    mut done: impl FnMut(&[u8]) -> bool,
) -> (Vec<u8>, Option<E>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while buf.len() < max && !done(&buf) {
        match read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n.min(max - buf.len())]),
            Err(e) => return (buf, Some(e)),
        }
    }
    (buf, None)
}

/// Splits a `host:port` target (`[v6]:port` in brackets) into its host and
/// port; a target of another form is an invalid config.
pub fn host_port(target: &str) -> Result<(&str, u16), crate::ProbeError> {
    let bad = || crate::ProbeError::invalid_config(format!("target {target:?}: expected HOST:PORT"));
    let (host, port) = target.rsplit_once(':').ok_or_else(bad)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = port.parse().map_err(|_| bad())?;
    if host.is_empty() {
        return Err(bad());
    }
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source that hands out `data` in `step`-byte reads, then `end`.
    fn source(
        data: &[u8],
        step: usize,
        end: Result<usize, &'static str>,
    ) -> impl FnMut(&mut [u8]) -> Result<usize, &'static str> {
        let mut at = 0;
        move |chunk: &mut [u8]| {
            if at == data.len() {
                return end;
            }
            let n = step.min(chunk.len()).min(data.len() - at);
            chunk[..n].copy_from_slice(&data[at..at + n]);
            at += n;
            Ok(n)
        }
    }

    #[test]
    fn a_deadline_reads_as_a_timeout_wherever_it_is_quoted() {
        let m = super::timeout_message("no response within 300ms");
        assert!(super::is_timeout(&m));
        assert!(super::is_timeout(&alloc::format!("GET http://x/: {m}")));
        assert!(!super::is_timeout("GET http://x/: connection refused"));
    }

    #[test]
    fn reads_until_done_closed_cut_or_failed() {
        let data = b"220 ready\r\nmore";
        let (got, err) = read_until_with(source(data, 1, Ok(0)), 1024, |b| b.ends_with(b"\r\n"));
        assert_eq!((got.as_slice(), err), (&b"220 ready\r\n"[..], None), "done");
        // `done` sees whole reads: the one that completes the line may carry more.
        let (got, _) = read_until_with(source(data, 3, Ok(0)), 1024, |b| b.windows(2).any(|w| w == b"\r\n"));
        assert_eq!(got.as_slice(), &data[..12]);
        let (got, err) = read_until_with(source(data, 4, Ok(0)), 1024, |_| false);
        assert_eq!((got.as_slice(), err), (&data[..], None), "the peer closed");
        let (got, err) = read_until_with(source(data, 4, Ok(0)), 6, |_| false);
        assert_eq!((got.as_slice(), err), (&data[..6], None), "cut at max");
        let (got, err) = read_until_with(source(data, 5, Err("timed out")), 1024, |_| false);
        assert_eq!((got.as_slice(), err), (&data[..], Some("timed out")));
    }
}
