//! The built-in icmp plugin and the host's `icmp` capability, against the
//! machine's own loopback in both versions (real ping sockets), an address
//! that never answers, and a hostile guest.

use crate::support::{builtin, guest, run};
use sonde_sandbox::host::Grants;
use sonde_sandbox::verdict::{Reason, RunResult, Status};
use sonde_tests::guests;
use sonde_tests::tools::ping_sockets;
use std::time::{Duration, Instant};

const SECOND: Duration = Duration::from_secs(1);

async fn icmp(target: &str, config: &str, timeout: Duration) -> RunResult {
    run(&builtin("icmp").await, target, config, &Grants::default(), timeout).await
}

fn metric(r: &RunResult, name: &str) -> Option<f64> {
    r.metrics.iter().find(|m| m.name == name).map(|m| m.value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_answers_in_both_versions_with_phases_and_hop_limit() {
    if !ping_sockets() {
        return;
    }
    for (target, version) in [("127.0.0.1", 4.0), ("::1", 6.0), ("[::1]", 6.0)] {
        let r = icmp(target, "{}", SECOND).await;
        assert_eq!((r.status, r.reason), (Status::Success, None), "{target}: {r:?}");
        assert!(r.message.starts_with("echo reply from "), "{}", r.message);
        assert_eq!(metric(&r, "ip_protocol"), Some(version), "{target}: {r:?}");
        for phase in ["resolve_seconds", "setup_seconds", "rtt_seconds"] {
            let v = metric(&r, phase).unwrap_or(-1.0);
            assert!((0.0..1.0).contains(&v), "{target} {phase}: {r:?}");
        }
        // Loopback replies leave with the system's default of 64.
        assert_eq!(metric(&r, "reply_hop_limit"), Some(64.0), "{target}: {r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackbox_options_apply() {
    if !ping_sockets() {
        return;
    }
    let config = r#"{"payload_size": 1200, "dont_fragment": true, "ttl": 3, "preferred_ip_protocol": "ip4", "ip_protocol_fallback": false}"#;
    for target in ["127.0.0.1", "::1"] {
        let r = icmp(target, config, SECOND).await;
        assert_eq!(r.status, Status::Success, "{target}: {r:?}");
        assert!(r.message.contains("(1200 bytes"), "{}", r.message);
    }
    // `localhost` is loopback by definition: a name, resolved once by the
    // host, with the version the options prefer.
    let r = icmp("localhost", r#"{"preferred_ip_protocol": "ip4"}"#, SECOND).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(metric(&r, "ip_protocol"), Some(4.0), "{r:?}");
    // Too large to send in one unfragmented packet on loopback's MTU.
    let r = icmp("127.0.0.1", r#"{"payload_size": 16384, "dont_fragment": true}"#, SECOND).await;
    assert_eq!(r.status, Status::Success, "loopback's MTU is 64 KiB: {r:?}");
    let r = icmp("127.0.0.1", r#"{"payload_size": 16385}"#, SECOND).await;
    assert_eq!(
        (r.status, r.reason),
        (Status::Unknown, Some(Reason::InvalidConfig)),
        "{r:?}"
    );
    let r = icmp("127.0.0.1:80", "{}", SECOND).await;
    assert_eq!(
        (r.status, r.reason),
        (Status::Unknown, Some(Reason::InvalidConfig)),
        "{r:?}"
    );
}

/// An address that never answers (TEST-NET-2: TEST-NET-1's 192.0.2.1 is
/// this machine's gateway, which answers) is a failure at the timeout,
/// never a hang past the call's deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_that_never_answers_is_a_failure_within_the_deadline() {
    if !ping_sockets() {
        return;
    }
    let start = Instant::now();
    let r = icmp("198.51.100.7", "{}", Duration::from_millis(300)).await;
    assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
    assert!(
        r.status == Status::Failure && r.reason.is_none() || r.reason == Some(Reason::Timeout),
        "{r:?}"
    );
}

/// The hostile guest pings what its grant does not cover, in every
/// spelling of loopback: each is denied before a socket is opened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_hosts_in_any_spelling_are_denied() {
    let plugin = guest(guests::ICMP_ABUSE).await;
    let hosts = [
        "127.1",
        "0x7f.1",
        "2130706433",
        "[::ffff:127.0.0.1]",
        "::1",
        "localhost",
        "10.1.2.3",
        "169.254.169.254",
    ];
    let config = serde_json::json!({ "hosts": hosts }).to_string();
    let r = run(&plugin, "192.0.2.1", &config, &Grants::default(), SECOND).await;
    assert_eq!((r.status, r.reason), (Status::Unknown, Some(Reason::Denied)), "{r:?}");
    assert!(r.message.starts_with("denied: ICMP echo to 127.1"), "{}", r.message);
    assert!(r.message.ends_with("(and 7 more)"), "{}", r.message);
    // A grant of the host with one port does not cover ICMP; any port does.
    let one_port = Grants {
        net: vec!["10.1.2.3:443".parse().unwrap()],
        ..Grants::default()
    };
    let config = serde_json::json!({ "hosts": ["10.1.2.3"], "timeout_ms": 1 }).to_string();
    let r = run(&plugin, "192.0.2.1", &config, &one_port, SECOND).await;
    assert_eq!(r.reason, Some(Reason::Denied), "{r:?}");
    assert!(
        r.message.contains("no `net` grant of it with any port"),
        "{}",
        r.message
    );
    let any_port = Grants {
        net: vec!["10.1.2.3:*".parse().unwrap()],
        ..Grants::default()
    };
    let r = run(&plugin, "192.0.2.1", &config, &any_port, SECOND).await;
    assert_eq!((r.status, r.reason), (Status::Success, None), "{r:?}");
}

/// What the guest may ping, it pings as the grant check read it: another
/// spelling of its target reaches the target's address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_spelling_of_the_target_reaches_the_target() {
    if !ping_sockets() {
        return;
    }
    let plugin = guest(guests::ICMP_ABUSE).await;
    let config = serde_json::json!({ "hosts": ["127.1", "0x7f.0.0.1", "[::ffff:127.0.0.1]"] }).to_string();
    let r = run(&plugin, "127.0.0.1", &config, &Grants::default(), SECOND).await;
    assert_eq!(
        r.message, "127.1=ok 127.0.0.1; 0x7f.0.0.1=ok 127.0.0.1; [::ffff:127.0.0.1]=ok 127.0.0.1",
        "{r:?}"
    );
}

/// Many echoes in one call, a huge payload, a timeout of 0 or of
/// u64::MAX: each is refused or bounded, and the agent carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echoes_are_bounded_per_call_in_number_size_and_time() {
    if !ping_sockets() {
        return;
    }
    let plugin = guest(guests::ICMP_ABUSE).await;
    let config = serde_json::json!({ "hosts": ["127.0.0.1"], "repeat": 20 }).to_string();
    let r = run(&plugin, "127.0.0.1", &config, &Grants::default(), SECOND).await;
    assert_eq!(
        (r.status, r.reason),
        (Status::Unknown, Some(Reason::HostLimit)),
        "{r:?}"
    );
    assert!(r.message.contains("more than 8 ICMP echoes"), "{}", r.message);

    let config = serde_json::json!({ "hosts": ["127.0.0.1"], "payload_size": u32::MAX }).to_string();
    let r = run(&plugin, "127.0.0.1", &config, &Grants::default(), SECOND).await;
    assert!(
        r.message
            .contains("invalid (payload-size 4294967295 is over the host's cap"),
        "{r:?}"
    );

    let config = serde_json::json!({ "hosts": ["127.0.0.1"], "timeout_ms": 0 }).to_string();
    let r = run(&plugin, "127.0.0.1", &config, &Grants::default(), SECOND).await;
    assert_eq!(r.message, "127.0.0.1=timeout", "{r:?}");

    let start = Instant::now();
    let config = serde_json::json!({ "hosts": ["198.51.100.7"], "timeout_ms": u64::MAX }).to_string();
    let r = run(
        &plugin,
        "198.51.100.7",
        &config,
        &Grants::default(),
        Duration::from_millis(300),
    )
    .await;
    assert!(start.elapsed() < Duration::from_secs(2), "{:?}: {r:?}", start.elapsed());
    assert!(
        r.reason == Some(Reason::Timeout) || r.message == "198.51.100.7=timeout",
        "{r:?}"
    );

    // The agent is unharmed: the next call answers.
    let r = icmp("127.0.0.1", "{}", SECOND).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
}
