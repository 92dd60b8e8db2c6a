//! The hostile guest `steal_secret`, granted one secret, tries every way
//! to read it; none yields a byte of it (docs/security.md, "A plugin never
//! reads a secret it uses").

use super::differential::{RUN, WITHHELD, WITHHELD_HEADER};
use super::{TOKEN, grants, holds};
use crate::support::{guest, run};
use sonde_sandbox::verdict::{Reason, Status};
use sonde_tests::guests;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(20);

/// A TCP server that echoes what it reads, and a UDP one.
async fn echoes() -> (std::net::SocketAddr, std::net::SocketAddr) {
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tcp_addr = tcp.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = tcp.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    let udp = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let udp_addr = udp.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0; 65536];
        while let Ok((n, from)) = udp.recv_from(&mut buf).await {
            let _ = udp.send_to(&buf[..n], from).await;
        }
    });
    (tcp_addr, udp_addr)
}

/// A server that answers what it reads first with `+OK`, then, a little
/// later, sends it back: a login accepted, then echoed.
async fn login_echo() -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0; 4096];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let _ = s.write_all(b"+OK\r\n").await;
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                let _ = s.write_all(&buf[..n]).await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_never_reads_a_secret_it_uses() {
    let server = super::token_server().await;
    let (tcp, udp) = echoes().await;
    let login = login_echo().await;
    // An attacker who guessed the secret's start (6 bytes, then RUN - 1),
    // then a run of it, then all of it.
    let guesses = [&TOKEN[..6], &TOKEN[..RUN - 1], &TOKEN[..RUN], TOKEN];
    let config = serde_json::json!({
        "handle": "$(secret:token)",
        "echo": format!("http://{}", server.addr),
        "tcp_echo": tcp.to_string(),
        "udp_echo": udp.to_string(),
        "login_echo": login.to_string(),
        "guesses": guesses,
    });
    let net = [tcp.to_string(), udp.to_string(), login.to_string()];
    let net: Vec<&str> = net.iter().map(String::as_str).collect();
    let plugin = guest(guests::STEAL_SECRET).await;
    let r = run(
        &plugin,
        &server.addr.to_string(),
        &config.to_string(),
        &grants(&[("token", TOKEN)], &net),
        TIMEOUT,
    )
    .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    let seen = format!("{r:?}");
    assert!(!holds(&seen, TOKEN), "the run shows the secret: {seen}");
    let detail = r.detail.clone().unwrap_or_default();
    // The host writes the detail's newlines as `\n` (plugin text is data).
    let line = |name: &str| -> String {
        detail
            .split("\\n")
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .unwrap_or_else(|| panic!("no {name} line: {detail}"))
            .to_string()
    };
    // It tried: the header went out, and its echo came back withheld
    // whole: the echoed header as the withheld pair, the body as the
    // marker (docs/security.md).
    let withheld_pair = format!("{WITHHELD_HEADER}={WITHHELD}");
    for name in ["header", "basic"] {
        let echo = line(name);
        assert!(echo.starts_with("200 "), "{name}: {echo}");
        assert!(echo.contains(&withheld_pair), "{name}: {echo}");
        assert!(echo.ends_with(&format!(" {WITHHELD}")), "{name}: {echo}");
    }
    assert_eq!(line("session"), "$(secret:token)", "a handle in data is text");
    assert!(
        line("url").starts_with("200 ") && detail.contains("\\n$(secret:token)\\ncuts: "),
        "a handle in a URL and a body is text: {detail}"
    );
    assert!(line("cert").starts_with("Err(InvalidConfig("), "{detail}");
    assert_eq!(line("redis login"), "Ok(Accepted(\"auth\"))", "{detail}");
    // The echo of the login, read a byte at a time: the marker (or as much
    // of it as the one-byte reads took before the session finished), and
    // nothing else.
    let after = line("after login");
    assert!(!after.is_empty() && WITHHELD.starts_with(&after), "{detail}");
    // Moving `max-body` over the echoed secret, a byte at a time, changes
    // nothing: the host reads `max-body` + LAG and withholds the whole
    // body whatever the cut.
    assert!(line("cuts").ends_with(", 1 distinct"), "{detail}");
    let cut = line("cut");
    assert!(cut.contains(&withheld_pair) && cut.ends_with(WITHHELD), "{cut}");
    // A guess is told apart only when it holds a run of the secret.
    let altered: Vec<f64> = r.metrics.iter().map(|m| m.value).collect();
    assert_eq!(altered, [0.0, 0.0, 1.0, 1.0], "{:?}", r.metrics);
    // The server got the secret only where the host put it: the
    // `x-steal` and `authorization` headers (the guesses' bodies are the
    // test's own text).
    for received in server.received() {
        if guesses.iter().any(|g| received.body == g.as_bytes()) {
            continue;
        }
        let others: String = received
            .headers
            .lines()
            .filter(|l| !l.starts_with("x-steal: ") && !l.starts_with("authorization: "))
            .collect();
        assert!(
            !holds(&received.target, TOKEN)
                && !holds(&others, TOKEN)
                && !holds(&String::from_utf8_lossy(&received.body), TOKEN),
            "{received:?}"
        );
    }
    assert!(
        server
            .received()
            .iter()
            .any(|r| r.headers.contains(&format!("x-steal: {TOKEN}"))),
        "the secret reached the echo: {:?}",
        server.received()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_toward_a_peer_outside_the_grants_is_denied_and_sends_nothing() {
    let server = super::token_server().await;
    let elsewhere = super::token_server().await;
    let config = serde_json::json!({
        "handle": "$(secret:token)",
        "echo": format!("http://{}", server.addr),
        "mode": "elsewhere",
        "elsewhere": format!("http://{}/echo", elsewhere.addr),
    });
    let plugin = guest(guests::STEAL_SECRET).await;
    let r = run(
        &plugin,
        &server.addr.to_string(),
        &config.to_string(),
        &grants(&[("token", TOKEN)], &[]),
        TIMEOUT,
    )
    .await;
    assert_eq!(r.reason, Some(Reason::Denied), "{r:?}");
    assert!(
        r.message.contains(&format!("HTTP request to {}", elsewhere.addr)),
        "{}",
        r.message
    );
    assert!(elsewhere.received().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_granted_secrets_opens_no_socket_of_its_own() {
    let server = super::token_server().await;
    let (tcp, _) = echoes().await;
    let config = serde_json::json!({
        "handle": "$(secret:token)",
        "echo": format!("http://{}", server.addr),
        "mode": "own_socket",
        "tcp_echo": tcp.to_string(),
    });
    let plugin = guest(guests::STEAL_SECRET).await;
    let net = [tcp.to_string()];
    let r = run(
        &plugin,
        &server.addr.to_string(),
        &config.to_string(),
        &grants(&[("token", TOKEN)], &[net[0].as_str()]),
        TIMEOUT,
    )
    .await;
    assert_eq!(r.reason, Some(Reason::Denied), "{r:?}");
    assert!(r.message.contains("through the host's transports"), "{}", r.message);
}
