//! HTTP/1.1 by hand on a new connection each time: requests to a server
//! under test (an agent's API, a blackbox exporter), the marker that
//! proves a listener accepted nothing more, and a server with one fixed
//! reply.

use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How many connections a listener at `addr` had accepted of those made
/// before this call, `accepted()` being its running count. A listener
/// accepts in the order connections complete, so this makes one more and
/// waits until the listener has taken it (its answer or its closing
/// arrives): every earlier one has been counted by then. It is the event
/// that proves "nothing else connected", where a sleep would only hope so.
pub async fn accepted_before_now(addr: std::net::SocketAddr, accepted: impl Fn() -> usize) -> usize {
    let mut marker = tokio::net::TcpStream::connect(addr).await.expect("connect the marker");
    // Enough bytes for any server to decide it does not like them (an
    // HTTP/2 server reads the 24-byte preface first), then wait for its
    // reply or its close.
    let _ = marker.write_all(b"GET / HTTP/1.1\r\nHost: sonde-test\r\n\r\n").await;
    let mut buf = [0u8; 64];
    let answered = tokio::time::timeout(Duration::from_secs(10), marker.read(&mut buf)).await;
    assert!(
        answered.is_ok(),
        "the listener at {addr} never took the marker connection"
    );
    // Every marker sent to this listener so far is in its count.
    static MARKERS: std::sync::Mutex<Vec<std::net::SocketAddr>> = std::sync::Mutex::new(Vec::new());
    let mut markers = MARKERS.lock().unwrap_or_else(|e| e.into_inner());
    markers.push(addr);
    accepted() - markers.iter().filter(|a| **a == addr).count()
}

/// One request on a new connection, with an optional bearer token and a
/// body: the status and body (status 0 when the connection closed without
/// an answer). A refused upload may be answered before the whole body is
/// sent.
pub async fn call(
    api: std::net::SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &[u8],
) -> (u16, String) {
    call_with(api, method, path, token, &[], body).await
}

/// [`call`] with more request headers (`name`, `value`).
pub async fn call_with(
    api: std::net::SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(api).await.unwrap();
    let mut auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    for (name, value) in headers {
        auth += &format!("{name}: {value}\r\n");
    }
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: sonde\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let _ = s.write_all(body).await;
    let mut text = Vec::new();
    let _ = s.read_to_end(&mut text).await;
    parse_response(&text)
}

/// [`call`] for a test that expects the agent to go away: `None` when it
/// cannot be reached or closes without an answer, instead of a panic or
/// status 0.
pub async fn try_call(
    api: std::net::SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &[u8],
) -> Option<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(api).await.ok()?;
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: sonde\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.ok()?;
    let _ = s.write_all(body).await;
    let mut text = Vec::new();
    s.read_to_end(&mut text).await.ok()?;
    Some(parse_response(&text)).filter(|(status, _)| *status != 0)
}

/// The status and body of a raw HTTP/1.1 response (status 0 if none).
pub fn parse_response(text: &[u8]) -> (u16, String) {
    let text = String::from_utf8_lossy(text).to_string();
    let status = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_string();
    (status, body)
}

/// A server that answers every connection with `reply`: after the
/// request's head when `http`, at once otherwise (a banner).
pub async fn fixed(reply: &'static [u8], http: bool) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while http && !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = stream.write_all(reply).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    addr
}
