//! The dns plugin against a real `dnsmasq` (answers, NXDOMAIN, validation,
//! SOA serial, TCP), against an in-test UDP responder that answers the way
//! a broken or hostile server would (SERVFAIL, compression loops, truncated
//! records, impossible counts, oversized datagrams, wrong IDs, replies from
//! another socket, the TC bit), and the host's `udp` capability under a
//! guest that abuses it.

use crate::support::{check, guest, run};
use sonde_sandbox::host::Grants;
use sonde_sandbox::host::bounds::SOCKETS_PER_CALL;
use sonde_sandbox::verdict::{Reason, RunResult, Status};
use sonde_tests::dns::{Answer, Dnsmasq, RECORDS, RESPONSE, Responder, TRUNCATED, ZONE, a_record, dnsmasq_with, reply};
use sonde_tests::guests;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

const SECOND: Duration = Duration::from_secs(1);

/// Starts a dnsmasq serving [`RECORDS`], or `None` (the test skips,
/// unless `SONDE_REQUIRE_TOOLS` is set) when it is not installed.
fn dnsmasq() -> Option<Dnsmasq> {
    dnsmasq_with(RECORDS)
}

async fn dns(server: &SocketAddr, config: serde_json::Value) -> RunResult {
    check("dns", &server.to_string(), &config.to_string(), SECOND).await
}

fn metric(r: &RunResult, name: &str) -> Option<f64> {
    r.metrics.iter().find(|m| m.name == name).map(|m| m.value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_is_counted_and_validated_as_blackbox_does() {
    let Some(server) = dnsmasq() else { return };
    let query = serde_json::json!({"query_name": "a.example.test", "query_type": "A"});
    let r = dns(&server.addr, query.clone()).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(r.message.contains("NOERROR"), "{}", r.message);
    assert_eq!(metric(&r, "answer_rrs"), Some(1.0), "{r:?}");
    assert_eq!(metric(&r, "rcode"), Some(0.0), "{r:?}");
    assert_eq!(metric(&r, "query_succeeded"), Some(1.0), "{r:?}");
    for m in [
        "resolve_seconds",
        "connect_seconds",
        "request_seconds",
        "authority_rrs",
        "additional_rrs",
    ] {
        assert!(metric(&r, m).is_some(), "{m}: {r:?}");
    }

    // The record's text: name, TTL, class, type and data, tab-separated.
    let mut passing = query.clone();
    passing["validate_answer_rrs"] = serde_json::json!({
        "fail_if_not_matches_regexp": ["^a\\.example\\.test\\.\t\\d+\tIN\tA\t192\\.0\\.2\\.1$"],
        "fail_if_none_matches_regexp": ["192\\.0\\.2\\.1"],
    });
    let r = dns(&server.addr, passing).await;
    assert_eq!(r.status, Status::Success, "{r:?}");

    let mut failing = query.clone();
    failing["validate_answer_rrs"] = serde_json::json!({"fail_if_matches_regexp": ["192\\.0\\.2\\.1"]});
    let r = dns(&server.addr, failing).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(r.message.contains("answer section"), "{}", r.message);
    assert_eq!(metric(&r, "answer_rrs"), Some(1.0), "{r:?}");

    // blackbox_exporter's fail_if_all_match_regexp, whatever its name says:
    // every record matching passes, one that does not fails.
    let mut all = query.clone();
    all["validate_answer_rrs"] = serde_json::json!({"fail_if_all_match_regexp": ["\tA\t"]});
    let r = dns(&server.addr, all).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    let mut all = query;
    all["validate_answer_rrs"] = serde_json::json!({"fail_if_all_match_regexp": ["\tAAAA\t"]});
    let r = dns(&server.addr, all).await;
    assert_eq!(r.status, Status::Failure, "{r:?}");

    // An MX and a TXT, matched by their data (a TXT's strings in quotes,
    // as blackbox writes them).
    let r = dns(
        &server.addr,
        serde_json::json!({"query_name": "example.test", "query_type": "MX",
            "validate_answer_rrs": {"fail_if_none_matches_regexp": ["\tMX\t10 mail\\.example\\.test\\.$"]}}),
    )
    .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    let r = dns(
        &server.addr,
        serde_json::json!({"query_name": "t.example.test", "query_type": "TXT",
            "validate_answer_rrs": {"fail_if_not_matches_regexp": ["\tTXT\t\"hello world\"$"]}}),
    )
    .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nxdomain_fails_unless_it_is_a_valid_rcode() {
    let Some(server) = dnsmasq() else { return };
    let query = serde_json::json!({"query_name": "nope.example.test", "query_type": "A"});
    let r = dns(&server.addr, query.clone()).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(
        r.message.contains("NXDOMAIN is not one of valid_rcodes"),
        "{}",
        r.message
    );
    assert_eq!(metric(&r, "rcode"), Some(3.0), "{r:?}");
    assert_eq!(metric(&r, "query_succeeded"), Some(1.0), "{r:?}");
    let mut valid = query;
    valid["valid_rcodes"] = serde_json::json!(["NOERROR", "NXDOMAIN"]);
    let r = dns(&server.addr, valid).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zones_soa_serial_is_reported() {
    let Some(server) = dnsmasq_with(ZONE) else { return };
    let r = dns(
        &server.addr,
        serde_json::json!({"query_name": "zone.test", "query_type": "SOA", "recursion_desired": false}),
    )
    .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(metric(&r, "serial"), Some(2026112701.0), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_asks_over_tcp() {
    let Some(server) = dnsmasq() else { return };
    let r = dns(
        &server.addr,
        serde_json::json!({"query_name": "h.example.test", "query_type": "A", "transport_protocol": "tcp",
            "validate_answer_rrs": {"fail_if_not_matches_regexp": ["192\\.0\\.2\\.7$"]}}),
    )
    .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(r.message.ends_with("(over TCP)"), "{}", r.message);
    assert_eq!(metric(&r, "answer_rrs"), Some(1.0), "{r:?}");
}

fn a_query() -> String {
    serde_json::json!({"query_name": "x.example.test", "query_type": "A"}).to_string()
}

async fn ask(server: &Responder) -> RunResult {
    check("dns", &server.addr.to_string(), &a_query(), SECOND).await
}

fn assert_failed(r: &RunResult, why: &str) {
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(r.message.contains(why), "not {why:?}: {}", r.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servfail_is_a_failure_unless_valid() {
    let server = Responder::answering(|q| reply(q, RESPONSE | 2, [0, 0, 0], &[])).await;
    let r = ask(&server).await;
    assert_failed(&r, "SERVFAIL is not one of valid_rcodes");
    assert_eq!(metric(&r, "rcode"), Some(2.0), "{r:?}");
    let config = serde_json::json!({"query_name": "x.example.test", "query_type": "A", "valid_rcodes": ["SERVFAIL"]});
    let r = check("dns", &server.addr.to_string(), &config.to_string(), SECOND).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_replies_are_failed_probes_with_a_reason() {
    // A record whose name is a compression pointer to itself.
    let looped = Responder::answering(|q| {
        let at = q.len() as u16;
        let mut rec = vec![0xc0 | (at >> 8) as u8, at as u8];
        rec.extend_from_slice(&[0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 192, 0, 2, 1]);
        reply(q, RESPONSE, [1, 0, 0], &rec)
    })
    .await;
    assert_failed(&ask(&looped).await, "malformed reply");

    // An A record cut off in its data.
    let cut = Responder::answering(|q| {
        let rec = a_record([192, 0, 2, 1]);
        reply(q, RESPONSE, [1, 0, 0], &rec[..rec.len() - 2])
    })
    .await;
    assert_failed(&ask(&cut).await, "malformed reply");

    // 65535 answers claimed, none there.
    let huge = Responder::answering(|q| reply(q, RESPONSE, [65535, 65535, 65535], &[])).await;
    assert_failed(&ask(&huge).await, "more than its");

    // A datagram far over what a reply without EDNS may be.
    let oversized = Responder::answering(|q| {
        let padding = vec![0; 60_000];
        reply(q, RESPONSE, [0, 0, 0], &padding)
    })
    .await;
    assert_failed(&ask(&oversized).await, "more than the 4096 allowed");

    // Another query's ID.
    let wrong_id = Responder::answering(|q| {
        let mut r = reply(q, RESPONSE, [1, 0, 0], &a_record([192, 0, 2, 1]));
        r[0] ^= 0xff;
        r
    })
    .await;
    assert_failed(&ask(&wrong_id).await, "differs from the query's");

    // A reply from another port: the connected socket never reads it, and
    // the wait ends in a timeout.
    let answer: Answer = Arc::new(|q| vec![reply(q, RESPONSE, [1, 0, 0], &a_record([192, 0, 2, 1]))]);
    let elsewhere = Responder::start(answer, true, None).await;
    let r = check(
        "dns",
        &elsewhere.addr.to_string(),
        &a_query(),
        Duration::from_millis(500),
    )
    .await;
    assert_failed(&r, "timeout");
    assert_eq!(elsewhere.received(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_reply_is_asked_again_over_tcp() {
    let udp: Answer = Arc::new(|q| vec![reply(q, RESPONSE | TRUNCATED, [0, 0, 0], &[])]);
    let tcp: Answer = Arc::new(|q| {
        let mut records = a_record([192, 0, 2, 1]);
        records.extend(a_record([192, 0, 2, 2]));
        vec![reply(q, RESPONSE, [2, 0, 0], &records)]
    });
    let server = Responder::start(udp, false, Some(tcp)).await;
    let r = ask(&server).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(
        r.message.contains("over TCP after a truncated UDP reply"),
        "{}",
        r.message
    );
    assert_eq!(metric(&r, "answer_rrs"), Some(2.0), "{r:?}");
    assert_eq!(metric(&r, "tcp_fallback"), Some(1.0), "{r:?}");
}

async fn abuse(target: &Responder, config: serde_json::Value, grants: &Grants) -> RunResult {
    let plugin = guest(guests::ABUSE_UDP).await;
    run(&plugin, &target.addr.to_string(), &config.to_string(), grants, SECOND).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hosts_udp_reaches_only_the_target_and_grants() {
    let target = Responder::answering(|q| q.to_vec()).await;
    let elsewhere = Responder::answering(|q| q.to_vec()).await;
    let port = elsewhere.addr.port();
    // Another port of the target's address, and the same address spelled
    // otherwise: both denied, nothing sent.
    for (host, port) in [
        ("127.0.0.1", port),
        ("127.1", port),
        ("127.0.0.1", target.addr.port() ^ 1),
    ] {
        let r = abuse(
            &target,
            serde_json::json!({"mode": "elsewhere", "host": host, "port": port}),
            &Grants::default(),
        )
        .await;
        assert_eq!(
            (r.status, r.reason),
            (Status::Unknown, Some(Reason::Denied)),
            "{host}:{port} {r:?}"
        );
        assert!(r.message.contains("UDP exchange with"), "{}", r.message);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(elsewhere.received(), 0, "nothing sent");
    // Granted, the exchange is made.
    let grants = Grants {
        net: vec![format!("127.0.0.1:{port}").parse().unwrap()],
        ..Grants::default()
    };
    let config = serde_json::json!({"mode": "elsewhere", "host": "127.0.0.1", "port": port});
    let r = abuse(&target, config, &grants).await;
    assert_eq!(
        (r.status, r.message.as_str()),
        (Status::Success, "reply of 1 bytes"),
        "{r:?}"
    );
    assert_eq!(elsewhere.received(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hosts_udp_is_bounded() {
    let silent = Responder::start(Arc::new(|_| vec![]), false, None).await;
    // Each exchange is a socket: a flood ends at the call's bound.
    let r = abuse(&silent, serde_json::json!({"mode": "flood"}), &Grants::default()).await;
    assert_eq!(
        (r.status, r.reason),
        (Status::Unknown, Some(Reason::HostLimit)),
        "{r:?}"
    );
    assert!(
        r.message.contains(&format!("more than {SOCKETS_PER_CALL} sockets")),
        "{}",
        r.message
    );
    assert_eq!(silent.received(), SOCKETS_PER_CALL);

    // A reply is never more than 64 KiB, whatever `max` asks; one over
    // `max` is refused.
    let big = Responder::answering(|_| vec![7; 1000]).await;
    let r = abuse(
        &big,
        serde_json::json!({"mode": "max", "max": u32::MAX}),
        &Grants::default(),
    )
    .await;
    assert_eq!(r.message, "reply of 1000 bytes", "{r:?}");
    let r = abuse(&big, serde_json::json!({"mode": "max", "max": 10}), &Grants::default()).await;
    assert!(
        r.message.contains("a reply of 1000 bytes, more than the 10 allowed"),
        "{r:?}"
    );

    // No time: nothing sent. All the time in the world: the call's
    // deadline still ends the wait.
    let r = abuse(
        &silent,
        serde_json::json!({"mode": "timeout", "timeout_ms": 0}),
        &Grants::default(),
    )
    .await;
    assert!(r.message.contains("timeout"), "{r:?}");
    let before = silent.received();
    let start = Instant::now();
    let r = abuse(
        &silent,
        serde_json::json!({"mode": "timeout", "timeout_ms": u64::MAX}),
        &Grants::default(),
    )
    .await;
    assert!(start.elapsed() < Duration::from_secs(3), "{:?} {r:?}", start.elapsed());
    assert_ne!(r.status, Status::Success, "{r:?}");
    assert_eq!(silent.received(), before + 1);
}
