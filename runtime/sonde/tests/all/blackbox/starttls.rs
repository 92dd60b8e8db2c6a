//! `starttls` beside blackbox_exporter: an SMTP-like server that upgrades
//! its connection to TLS after `STARTTLS`, probed by blackbox_exporter's
//! `query_response` with `starttls: true` and by the tcp plugin's
//! `starttls` step, the answers compared as the other cases are.

use super::{Blackbox, Case, OP, compare, json};
use crate::support::{secret, start_agent};
use sonde_tests::TestCert;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt, BufReader};

/// Reads one line (without its end); `None` when the peer closed.
async fn line<S: AsyncBufRead + Unpin>(s: &mut S) -> Option<String> {
    let mut text = String::new();
    match s.read_line(&mut text).await {
        Ok(n) if n > 0 => Some(text.trim_end().to_string()),
        _ => None,
    }
}

/// Answers SMTP-like commands until `QUIT` or `STARTTLS`: whether the
/// client asked for STARTTLS (answered `220`), its buffer empty.
async fn commands<S: AsyncBufRead + AsyncWrite + Unpin>(s: &mut S, offer: bool) -> bool {
    while let Some(command) = line(s).await {
        let reply: &[u8] = match command.to_ascii_uppercase().as_str() {
            "QUIT" => {
                let _ = s.write_all(b"221 bye\r\n").await;
                return false;
            }
            "STARTTLS" if offer => {
                let _ = s.write_all(b"220 2.0.0 ready to start TLS\r\n").await;
                return true;
            }
            c if c.starts_with("EHLO") && offer => b"250-sonde.test\r\n250-STARTTLS\r\n250 SIZE 1000\r\n",
            c if c.starts_with("EHLO") => b"250-sonde.test\r\n250-AUTH PLAIN\r\n250 SIZE 1000\r\n",
            _ => b"502 no\r\n",
        };
        if s.write_all(reply).await.is_err() {
            return false;
        }
    }
    false
}

/// A server as SMTP with STARTTLS: `220` first; `EHLO` offers STARTTLS,
/// which it answers `220` and then a TLS handshake with `config`; over TLS,
/// `EHLO` offers AUTH and `QUIT` ends it with `221`.
async fn smtp_starttls(config: Arc<rustls::ServerConfig>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let mut plain = BufReader::new(stream);
                let _ = plain.write_all(b"220 sonde.test ESMTP ready\r\n").await;
                if !commands(&mut plain, true).await {
                    return;
                }
                // Nothing may come before the client's hello.
                assert!(plain.buffer().is_empty(), "bytes after STARTTLS, before TLS");
                let Ok(tls) = acceptor.accept(plain.into_inner()).await else {
                    return;
                };
                commands(&mut BufReader::new(tls), false).await;
            });
        }
    });
    addr
}

/// blackbox_exporter's `smtp_starttls` (its example.yml) against a server
/// that honours it, and against one whose certificate is not trusted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starttls_answers_the_series_blackbox_exporter_answers() {
    let dir = tempfile::tempdir().unwrap();
    let valid = TestCert::new(2030, 1, 1);
    let other = TestCert::new(2031, 1, 1);
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &valid.ca_pem).unwrap();
    let ca = ca.display();
    // As `sonde import blackbox` writes them: blackbox_exporter's newline
    // after each send, and its line-by-line match as `(?mR)`.
    let steps = |bb: bool| {
        let (end, lines) = if bb { ("\\r", "") } else { ("\\r\\n", "(?mR)") };
        let send = |text: &str| format!(r#"{{ send: "{text}{end}" }}"#);
        let expect = |re: &str| format!(r#"{{ expect: "{lines}{re}" }}"#);
        [
            expect("^220 "),
            send("EHLO prober"),
            expect("^250-STARTTLS"),
            send("STARTTLS"),
            expect("^220"),
            "{ starttls: true }".to_string(),
            send("EHLO prober"),
            expect("^250-AUTH"),
            send("QUIT"),
            expect("^221"),
        ]
        .join(", ")
    };
    let bb_steps = steps(true);
    let bb_config = format!(
        r#"modules:
  smtp_starttls: {{ prober: tcp, timeout: 5s, tcp: {{ tls_config: {{ ca_file: "{ca}" }}, query_response: [{bb_steps}] }} }}
"#
    );
    let exporters = Blackbox::start_each(dir.path(), &bb_config).await;
    if exporters.is_empty() {
        return;
    }
    let ca_pem = json(&valid.ca_pem);
    let sonde_steps = steps(false);
    secret(dir.path(), "op.token", OP);
    let sonde_config = format!(
        r#"operator_token_file: op.token
modules:
  smtp_starttls: {{ plugin: tcp, timeout: 5s, config: {{ ca_pem: {ca_pem}, steps: [{sonde_steps}] }}, grants: {{ net: ["127.0.0.1:*"] }} }}
"#
    );
    let config = dir.path().join("sonde.yaml");
    std::fs::write(&config, sonde_config).unwrap();
    let (_agent, api) = start_agent(&config).await;
    let trusted = smtp_starttls(valid.server_config()).await;
    let untrusted = smtp_starttls(other.server_config()).await;
    let cases: Vec<Case> = vec![
        ("tcp starttls", "smtp_starttls", "smtp_starttls", trusted.to_string()),
        (
            "tcp starttls, certificate not trusted",
            "smtp_starttls",
            "smtp_starttls",
            untrusted.to_string(),
        ),
    ];
    // The upgrade is seen: sonde's own answer has the certificate's expiry.
    let (_, ours) = super::get(api, &format!("/probe?module=smtp_starttls&target={trusted}"), Some(OP)).await;
    let expiry = format!("probe_ssl_earliest_cert_expiry {}", valid.not_after);
    for want in ["probe_success 1", expiry.as_str()] {
        assert!(ours.lines().any(|l| l == want), "{want} in\n{ours}");
    }
    compare(&exporters, api, &cases).await;
}
