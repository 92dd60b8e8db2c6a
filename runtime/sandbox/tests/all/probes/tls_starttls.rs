//! `session.starttls`: the tcp plugin's `starttls` step against a line
//! server that upgrades after `STARTTLS`, and the hostile guest
//! `abuse_starttls`, which abuses the call every way it can; each abuse
//! gets a typed error and the agent goes on.

use crate::secrets::{TOKEN, grants, holds};
use crate::support::{builtin, guest, run};
use sonde_sandbox::host::Grants;
use sonde_sandbox::verdict::{RunResult, Status};
use sonde_tests::{HttpServer, TestCert, guests};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const TIMEOUT: Duration = Duration::from_secs(20);

/// Over TLS: echoes what it reads; a Redis `AUTH` is answered `+OK`, then,
/// a little later, echoed (a login accepted, then reflected).
async fn echo_tls(stream: TcpStream, acceptor: tokio_rustls::TlsAcceptor) {
    let Ok(mut tls) = acceptor.accept(stream).await else {
        return;
    };
    let mut buf = vec![0; 4096];
    while let Ok(n) = tls.read(&mut buf).await {
        if n == 0 {
            return;
        }
        if buf.starts_with(b"*") {
            let _ = tls.write_all(b"+OK\r\n").await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if tls.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// A line server with STARTTLS: `220 ready` first; `STARTTLS` answers
/// `220 go` and upgrades with `config`; `EXTRA` answers `220 go` and then,
/// in plain text, `INJECTED`; `CLOSE` closes; other lines are echoed.
async fn starttls_server(config: Arc<rustls::ServerConfig>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let mut s = BufReader::new(stream);
                let _ = s.write_all(b"220 ready\r\n").await;
                let mut line = String::new();
                while s.read_line(&mut line).await.unwrap_or(0) > 0 {
                    let reply = match line.trim_end() {
                        "STARTTLS" => {
                            let _ = s.write_all(b"220 go\r\n").await;
                            // A client that did not wait for the 220 gets no TLS.
                            if s.buffer().is_empty() {
                                echo_tls(s.into_inner(), acceptor).await;
                            }
                            return;
                        }
                        "EXTRA" => {
                            let _ = s.write_all(b"220 go\r\n").await;
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            b"INJECTED\r\n".to_vec()
                        }
                        "CLOSE" => return,
                        other => format!("{other}\r\n").into_bytes(),
                    };
                    if s.write_all(&reply).await.is_err() {
                        return;
                    }
                    line.clear();
                }
            });
        }
    });
    addr
}

fn metric(r: &RunResult, name: &str) -> Option<f64> {
    r.metrics.iter().find(|m| m.name == name).map(|m| m.value)
}

/// The tcp plugin's STARTTLS exchange with `server`, trusting `ca_pem`.
async fn smtp_like(server: SocketAddr, ca_pem: Option<&str>, after: &str) -> RunResult {
    let mut config = serde_json::json!({"steps": [
        {"expect": "^220 ready"},
        {"send": after},
        {"expect": "^220 go"},
        {"starttls": true},
        {"send": "PING\r\n"},
        {"expect": "^PING"},
    ]});
    if let Some(pem) = ca_pem {
        config["ca_pem"] = pem.into();
    }
    run(
        &builtin("tcp").await,
        &server.to_string(),
        &config.to_string(),
        &Grants::default(),
        TIMEOUT,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starttls_step_upgrades_the_connection() {
    let cert = TestCert::new(2030, 1, 1);
    let server = starttls_server(cert.server_config()).await;
    let r = smtp_like(server, Some(&cert.ca_pem), "STARTTLS\r\n").await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(r.message.contains("by STARTTLS: certificate of"), "{}", r.message);
    assert!(metric(&r, "tls_seconds").unwrap() > 0.0, "{r:?}");
    let left = cert.not_after as f64
        - std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
    assert!(
        (metric(&r, "cert_expiry_seconds").unwrap() - left).abs() < 60.0,
        "{r:?}"
    );
    // Not trusted: the step fails and says why.
    let r = smtp_like(server, None, "STARTTLS\r\n").await;
    assert_eq!(r.status, Status::Failure, "{r:?}");
    assert!(
        r.message.starts_with("step 4: starttls: tls: certificate not trusted"),
        "{}",
        r.message
    );
    // Plain text after the 220: never taken for what came over TLS.
    let r = smtp_like(server, Some(&cert.ca_pem), "EXTRA\r\n").await;
    assert_eq!(r.status, Status::Failure, "{r:?}");
    assert!(r.message.starts_with("step 4: starttls: tls: "), "{}", r.message);
}

/// The line of `detail` (lines between ` || `) that starts with
/// `name: `, without it.
fn line<'a>(detail: &'a str, name: &str) -> &'a str {
    let prefix = format!("{name}: ");
    detail
        .split(" || ")
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {name} in\n{detail}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abusing_starttls_gets_typed_errors_and_harms_nothing() {
    let cert = TestCert::new(2030, 1, 1);
    let server = starttls_server(cert.server_config()).await;
    let tls = HttpServer::start_tls(&cert).await;
    let tls_target = tls.addr.to_string();
    let config = serde_json::json!({"tls_target": tls_target, "ca_pem": cert.ca_pem});
    let plugin = guest(guests::ABUSE_STARTTLS).await;
    let granted = grants(&[], &[&tls_target]);
    let r = run(&plugin, &server.to_string(), &config.to_string(), &granted, TIMEOUT).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    let detail = r.detail.clone().unwrap_or_default();
    let invalid = "probe: InvalidConfig(\"starttls: the session is TLS already\")";
    assert_eq!(line(&detail, "twice"), invalid, "{detail}");
    assert_eq!(line(&detail, "after twice"), "PING", "{detail}");
    assert_eq!(line(&detail, "tls session"), invalid, "{detail}");
    for name in ["huge name", "garbage name"] {
        assert!(
            line(&detail, name).starts_with("probe: InvalidConfig(\"server name "),
            "{detail}"
        );
    }
    assert_eq!(line(&detail, "after names"), "PING", "{detail}");
    assert!(
        line(&detail, "injected").starts_with("failed: tls: starttls: the peer sent data before the upgrade"),
        "{detail}"
    );
    assert_eq!(line(&detail, "after injected"), "INJECTED", "{detail}");
    assert_eq!(line(&detail, "raced"), "failed", "{detail}");
    assert!(
        line(&detail, "wrong name").starts_with("failed: tls: certificate not valid for \"wrong.sonde.test\""),
        "{detail}"
    );
    for name in ["after failed send", "after failed read"] {
        assert!(
            line(&detail, name).contains("closed when its TLS upgrade failed"),
            "{detail}"
        );
    }
    assert_eq!(
        line(&detail, "again"),
        "failed: connect: starttls: the connection was closed when an earlier TLS upgrade failed",
        "{detail}"
    );
    assert_eq!(
        line(&detail, "closed"),
        "failed: connect: starttls: the peer closed the connection",
        "{detail}"
    );
    // The agent goes on: the same engine runs a good upgrade next.
    let r = smtp_like(server, Some(&cert.ca_pem), "STARTTLS\r\n").await;
    assert_eq!(r.status, Status::Success, "{r:?}");
}

/// After the upgrade, what the peer sends goes through the same scrubbing:
/// a password a login sent over TLS and the server echoed is withheld.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_comes_over_tls_after_starttls_is_scrubbed() {
    let cert = TestCert::new(2030, 1, 1);
    let server = starttls_server(cert.server_config()).await;
    let tls = HttpServer::start_tls(&cert).await;
    let tls_target = tls.addr.to_string();
    let config = serde_json::json!({
        "tls_target": tls_target,
        "ca_pem": cert.ca_pem,
        "password": "$(secret:token)",
    });
    let granted = grants(&[("token", TOKEN)], &[&tls_target]);
    let plugin = guest(guests::ABUSE_STARTTLS).await;
    let r = run(&plugin, &server.to_string(), &config.to_string(), &granted, TIMEOUT).await;
    let detail = r.detail.clone().unwrap_or_default();
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(line(&detail, "login"), "Ok(Accepted(\"auth\"))", "{detail}");
    assert!(
        line(&detail, "echo").contains(sonde_policy::secrets::scrub::WITHHELD),
        "{detail}"
    );
    assert!(!holds(&format!("{r:?}"), TOKEN), "{r:?}");
}
