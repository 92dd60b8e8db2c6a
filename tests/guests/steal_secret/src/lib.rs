//! Granted one secret, tries every way to read it and reports all it got
//! in its result (message, detail and metrics) and its log, so a test can
//! check that none of it holds a byte of the secret.
//!
//! Config: `handle` (`$(secret:NAME)`), `echo` (an HTTP server that echoes
//! requests, granted), `tcp_echo` and `udp_echo` (`host:port` of echo
//! servers, granted), `guesses` (texts to test against the echo: whether
//! each comes back altered), and `mode`:
//!
//! - `echo` (default): every way out through granted peers;
//! - `elsewhere`: the handle in a header toward `elsewhere` (not granted);
//! - `own_socket`: a `wasi:sockets` connection to `tcp_echo`;
//! - `views`: a script of steps whose every observation it records
//!   ([`views`]): the differential tests run it under two secrets and
//!   compare.

use serde::Deserialize;
use sonde_sdk::http::{HttpRequest, send};
use sonde_sdk::{Outcome, Probe, ProbeError, Request, credentials, log, net, tcp, udp};
use std::fmt::Write as _;
use std::time::Duration;

mod views;

/// The mode alone, read first: `views` takes a config of its own.
#[derive(Deserialize)]
struct Mode {
    #[serde(default)]
    mode: String,
}

#[derive(Deserialize)]
struct Config {
    handle: String,
    echo: String,
    #[serde(default)]
    tcp_echo: Option<String>,
    #[serde(default)]
    udp_echo: Option<String>,
    /// A server that answers a login `+OK`, then echoes it a little later.
    #[serde(default)]
    login_echo: Option<String>,
    #[serde(default)]
    elsewhere: Option<String>,
    #[serde(default)]
    guesses: Vec<String>,
    #[serde(default)]
    mode: String,
}

struct StealSecret;

const SHORT: Duration = Duration::from_millis(1500);

/// Everything a response carried, as text.
fn everything(r: &sonde_sdk::http::HttpResponse) -> String {
    let mut out = format!("{} ", r.status);
    for (n, v) in &r.headers {
        let _ = write!(out, "{n}={} ", String::from_utf8_lossy(v));
    }
    out.push_str(&String::from_utf8_lossy(&r.body));
    out
}

fn echo(
    config: &Config,
    path: &str,
    headers: Vec<(String, String)>,
    body: &str,
    max: usize,
) -> Result<sonde_sdk::http::HttpResponse, ProbeError> {
    let mut request = HttpRequest::get(format!("{}{path}", config.echo), SHORT);
    request.method = "POST".into();
    request.headers = headers;
    request.body = body.as_bytes().to_vec();
    request.max_body = max;
    send(&request)
}

fn echo_with(config: &Config, path: &str, headers: Vec<(String, String)>, body: &str, max: usize) -> String {
    match echo(config, path, headers, body, max) {
        Ok(r) => everything(&r),
        Err(e) => format!("error: {e:?}"),
    }
}

/// The ways through granted peers.
fn through_peers(config: &Config) -> (String, Vec<f64>) {
    let h = config.handle.clone();
    let mut got = String::new();
    // A client certificate made of the secret: the error must not show it.
    let (host, port) = net::host_port(config.echo.trim_start_matches("http://")).unwrap_or(("", 0));
    let _ = writeln!(got, "cert: {:?}", credentials::client_certificate(host, port, &h, &h));
    // A session: the handle is sent as text; a login sends the secret
    // itself, and whatever comes back is scrubbed.
    if let Some(addr) = &config.tcp_echo {
        let (host, port) = net::host_port(addr).unwrap_or(("", 0));
        if let Ok((mut session, _)) = tcp::connect(host, port, SHORT) {
            let _ = session.send(h.as_bytes());
            let mut buf = vec![0; 4096];
            session.set_read_timeout(Duration::from_millis(300));
            let n = session.read(&mut buf).unwrap_or(0);
            let _ = writeln!(got, "session: {}", String::from_utf8_lossy(&buf[..n]));
        }
        // A login sends the secret itself to the echo: what comes back
        // (the echo of the login, not a server's answer) is scrubbed.
        let (host, port) = config
            .login_echo
            .as_deref()
            .map_or((host, port), |a| net::host_port(a).unwrap_or(("", 0)));
        if let Ok((mut session, _)) = tcp::connect(host, port, SHORT) {
            let login = credentials::redis_login(&session, Some("u"), &h, Duration::from_millis(500));
            let _ = writeln!(got, "redis login: {login:?}");
            // The rest of the echo of the login, the password in it, one
            // byte at a time.
            session.set_read_timeout(Duration::from_millis(300));
            let mut rest = Vec::new();
            let mut byte = [0u8; 1];
            while let Ok(1) = session.read(&mut byte) {
                rest.push(byte[0]);
            }
            let _ = writeln!(got, "after login: {}", String::from_utf8_lossy(&rest));
        }
        if let Ok((mut session, _)) = tcp::connect(host, port, SHORT) {
            let _ = session.send(b"startup");
            let mut buf = vec![0; 64];
            session.set_read_timeout(Duration::from_millis(300));
            let _ = session.read(&mut buf);
            let login = credentials::postgres_login(&session, "u", &h, Duration::from_millis(500));
            let _ = writeln!(got, "postgres login: {login:?}");
        }
    }
    if let Some(addr) = &config.udp_echo {
        let (host, port) = net::host_port(addr).unwrap_or(("", 0));
        let _ = writeln!(
            got,
            "udp: {:?}",
            udp::exchange(host, port, h.as_bytes(), 4096, SHORT).map(|r| r.data)
        );
    }
    // In a header the host fills it in; the echo comes back scrubbed.
    let header = vec![("x-steal".to_string(), h.clone())];
    let _ = writeln!(got, "header: {}", echo_with(config, "/echo", header.clone(), "", 65536));
    // Encoded by the host, then echoed.
    let basic = vec![("authorization".to_string(), format!("Basic $(base64:u:{h})"))];
    let _ = writeln!(got, "basic: {}", echo_with(config, "/echo", basic, "", 65536));
    // In the URL and the body it is only text.
    let _ = writeln!(
        got,
        "url: {}",
        echo_with(config, &format!("/echo?k={h}"), vec![], &h, 65536)
    );
    // Cut the echoed header at every length across where the secret is,
    // to read it byte by byte: where it starts, the echo of the same
    // request with a plain value says (the host withholds the real one).
    let plain = vec![("x-steal".to_string(), "plain".to_string())];
    let whole = echo(config, "/echo", plain, "", 65536)
        .map(|r| r.body)
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&whole);
    let start = text.find("x-steal: ").map_or(0, |i| i + 9);
    // What each cut brought back, each distinct answer once: moving the
    // cut must show nothing (one answer).
    let mut answers: Vec<String> = Vec::new();
    for max in start..start + 40 {
        let answer = echo_with(config, "/echo", header.clone(), "", max);
        if !answers.contains(&answer) {
            answers.push(answer);
        }
    }
    let _ = writeln!(got, "cuts: 40 from {start}, {} distinct", answers.len());
    for a in answers {
        let _ = writeln!(got, "cut: {a}");
    }
    // Guesses: does the echo of a guess come back altered?
    let mut altered = Vec::new();
    for guess in &config.guesses {
        let back = echo_with(config, "/echo", vec![], guess, 65536);
        altered.push(if back.ends_with(guess.as_str()) { 0.0 } else { 1.0 });
    }
    (got, altered)
}

impl Probe for StealSecret {
    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let mode: Mode = req.config()?;
        if mode.mode == "views" {
            return views::run(&req.config()?);
        }
        let config: Config = req.config()?;
        let h = config.handle.clone();
        log::info(format!("the handle: {h}"));
        match config.mode.as_str() {
            "elsewhere" => {
                let to = config.elsewhere.clone().unwrap_or_default();
                let mut request = HttpRequest::get(to, SHORT);
                request.headers = vec![("x-steal".into(), h.clone())];
                return Ok(Outcome::success(format!(
                    "elsewhere: {:?}",
                    send(&request).map(|r| r.status)
                )));
            }
            "own_socket" => {
                let addr = config.tcp_echo.clone().unwrap_or_default();
                let result = std::net::TcpStream::connect(addr.as_str()).map(|_| "connected");
                return Ok(Outcome::success(format!("own socket: {result:?}")));
            }
            _ => {}
        }
        let (got, altered) = through_peers(&config);
        for line in got.lines().take(32) {
            log::info(line);
        }
        let mut outcome = Outcome::success(format!("{h} {}", got.lines().next().unwrap_or_default())).with_detail(got);
        for (i, a) in altered.iter().enumerate() {
            outcome = outcome.with_metric(format!("guess_{i}_altered"), *a, "");
        }
        Ok(outcome)
    }
}

sonde_sdk::export!(StealSecret);
