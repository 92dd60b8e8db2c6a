//! Abuses `session.starttls` against its target, a STARTTLS line server
//! (`STARTTLS` answers `220 go` and upgrades; `EXTRA` answers `220 go`
//! and then, plain, `INJECTED`; `CLOSE` closes; other lines are echoed),
//! and against `tls_target`, a TLS server. Every abuse is a line of the
//! outcome's detail, `name: result`, for the test to check. With
//! `password` (a secret's handle) it only logs in to the target over TLS
//! after STARTTLS, and reports what the echo of the login gave it.

use serde::Deserialize;
use sonde_sdk::tls::{HandshakeError, Session, TlsOptions};
use sonde_sdk::{Outcome, Probe, ProbeError, Request};
use std::time::Duration;

#[derive(Deserialize)]
struct Config {
    tls_target: String,
    ca_pem: String,
    password: Option<String>,
}

const WAIT: Duration = Duration::from_secs(2);

/// Between the lines of the detail (where the host escapes a newline).
const SEPARATOR: &str = " || ";

fn kind(e: &HandshakeError) -> String {
    match e {
        HandshakeError::Failed(m) => format!("failed: {m}"),
        HandshakeError::Probe(p) => format!("probe: {p:?}"),
    }
}

/// What `session.starttls` gives, as a line.
fn starttls(session: &mut Session, options: &TlsOptions) -> String {
    match session.starttls(options, WAIT) {
        Ok(h) => format!("ok {}", h.info.version),
        Err(e) => kind(&e),
    }
}

/// Sends `line` and reads until `want` arrived (or fails).
fn say(session: &mut Session, line: &str, want: &str) -> String {
    if let Err(e) = session.send(line.as_bytes()) {
        return format!("send: {e}");
    }
    session.set_read_timeout(WAIT);
    let (got, err) = session.read_until(4096, |b| b.windows(want.len()).any(|w| w == want.as_bytes()));
    match err {
        Some(e) => format!("read: {e} after {:?}", String::from_utf8_lossy(&got)),
        None => String::from_utf8_lossy(&got).into_owned(),
    }
}

fn open(req: &Request) -> Result<Session, ProbeError> {
    match sonde_sdk::tcp::open_target(req) {
        Ok((s, _)) => Ok(s),
        Err(e) => Err(ProbeError::io(format!("{e:?}"))),
    }
}

/// Upgrades a new session to TLS as a client should.
fn upgraded(req: &Request, ca: &TlsOptions) -> Result<Session, ProbeError> {
    let mut s = open(req)?;
    say(&mut s, "", "220 ready");
    say(&mut s, "STARTTLS\r\n", "220 go\r\n");
    s.starttls(ca, WAIT).map_err(|e| ProbeError::io(kind(&e)))?;
    Ok(s)
}

struct AbuseStarttls;

impl Probe for AbuseStarttls {
    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let config: Config = req.config()?;
        let ca = TlsOptions {
            ca_pem: Some(config.ca_pem.clone()),
            ..TlsOptions::default()
        };
        let mut lines = Vec::new();
        // A login over TLS whose server echoes the password afterwards.
        if let Some(password) = &config.password {
            // Alone: a probe that holds secrets reads through the scrubber.
            let s = upgraded(&req, &ca)?;
            let login = sonde_sdk::credentials::redis_login(&s, None, password, WAIT);
            lines.push(format!("login: {login:?}"));
            let mut s = s;
            s.set_read_timeout(WAIT);
            let (got, _) = s.read_until(4096, |_| false);
            lines.push(format!("echo: {}", String::from_utf8_lossy(&got)));
            return Ok(Outcome::success("logged in").with_detail(lines.join(SEPARATOR)));
        }
        // Twice: the second on a session that is TLS by then. Each abuse
        // replaces the session before (a call holds at most 4).
        let mut s = upgraded(&req, &ca)?;
        lines.push(format!("twice: {}", starttls(&mut s, &ca)));
        lines.push(format!(
            "after twice: {}",
            say(&mut s, "PING\r\n", "PING\r\n").trim_end()
        ));
        // On a session that was TLS from the start.
        let (host, port) = sonde_sdk::net::host_port(&config.tls_target)?;
        match sonde_sdk::tls::connect(host, port, &ca, WAIT) {
            Ok((mut t, _)) => lines.push(format!("tls session: {}", starttls(&mut t, &ca))),
            Err(e) => lines.push(format!("tls session: connect {}", kind(&e))),
        }
        // A server name of 1 MiB, then garbage: refused, the session kept.
        s = open(&req)?;
        say(&mut s, "", "220 ready");
        for (name, server_name) in [
            ("huge name", "a".repeat(1 << 20)),
            ("garbage name", "\0/../\u{202e}*".into()),
        ] {
            let options = TlsOptions {
                server_name: Some(server_name),
                ..ca.clone()
            };
            lines.push(format!("{name}: {}", starttls(&mut s, &options)));
        }
        lines.push(format!(
            "after names: {}",
            say(&mut s, "PING\r\n", "PING\r\n").trim_end()
        ));
        // Plain text the server sends after its `220`: refused, and still
        // readable as it was.
        say(&mut s, "EXTRA\r\n", "220 go\r\n");
        std::thread::sleep(Duration::from_millis(200));
        lines.push(format!("injected: {}", starttls(&mut s, &ca)));
        lines.push(format!(
            "after injected: {}",
            say(&mut s, "", "INJECTED\r\n").trim_end()
        ));
        // Racing the server: STARTTLS sent, the upgrade started before its
        // `220` was read.
        s = open(&req)?;
        say(&mut s, "", "220 ready");
        let _ = s.send(b"STARTTLS\r\n");
        lines.push(format!(
            "raced: {}",
            starttls(&mut s, &ca).split(':').next().unwrap_or("")
        ));
        lines.push(format!(
            "after raced: {}",
            say(&mut s, "PING\r\n", "PING\r\n").split(':').next().unwrap_or("")
        ));
        // A wrong name: the handshake fails and closes the session.
        s = open(&req)?;
        say(&mut s, "", "220 ready");
        say(&mut s, "STARTTLS\r\n", "220 go\r\n");
        let wrong = TlsOptions {
            server_name: Some("wrong.sonde.test".into()),
            ..ca.clone()
        };
        lines.push(format!("wrong name: {}", starttls(&mut s, &wrong)));
        lines.push(format!(
            "after failed send: {:?}",
            s.send(b"PING\r\n").map_err(|e| e.to_string())
        ));
        let mut buf = [0u8; 16];
        lines.push(format!(
            "after failed read: {:?}",
            s.read(&mut buf).map_err(|e| e.to_string())
        ));
        lines.push(format!("again: {}", starttls(&mut s, &ca)));
        // After the peer closed.
        s = open(&req)?;
        say(&mut s, "", "220 ready");
        let _ = s.send(b"CLOSE\r\n");
        std::thread::sleep(Duration::from_millis(200));
        lines.push(format!("closed: {}", starttls(&mut s, &ca)));
        let lines: Vec<String> = lines.iter().map(|l| l.chars().take(200).collect()).collect();
        Ok(Outcome::success("abused starttls").with_detail(lines.join(SEPARATOR)))
    }
}

sonde_sdk::export!(AbuseStarttls);
