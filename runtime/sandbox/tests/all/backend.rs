//! The http plugin's `backend` check through a real balancer: an
//! in-process round-robin TCP relay in front of hyper backends, each on
//! its own loopback address and answering with its own `Pod-IPv4`, as a
//! Service in front of a StatefulSet's Pods; and behind the same balancer,
//! the rollout example's nginx of docs/kubernetes.md.

use crate::support::check;
use sonde_sandbox::verdict::{Reason, RunResult, Status};
use sonde_tests::processes::start_nginx_serving;
use sonde_tests::{PodBackend, RoundRobin};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(5);

async fn through(balancer: &RoundRobin, backend: serde_json::Value) -> RunResult {
    let config = serde_json::json!({"path": "/healthz", "backend": backend});
    check("http", &balancer.addr.to_string(), &config.to_string(), TIMEOUT).await
}

fn metric(r: &RunResult, name: &str) -> f64 {
    r.metrics
        .iter()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("no metric {name} in {r:?}"))
        .value
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_passes_only_once_the_balancer_routes_to_this_backend() {
    let (a, b, me) = tokio::join!(
        PodBackend::start("127.0.0.2", true),
        PodBackend::start("127.0.0.3", true),
        PodBackend::start("127.0.0.4", true)
    );
    let balancer = RoundRobin::start(&[a.addr, b.addr]).await;
    let wanted = serde_json::json!({"header": "Pod-IPv4", "equals": "127.0.0.4", "attempts": 6});

    // Not routed yet: every attempt reaches another Pod, and says which.
    let r = through(&balancer, wanted.clone()).await;
    assert_eq!(r.status, Status::Failure, "{r:?}");
    assert!(
        r.message
            .contains("not routed to this backend (Pod-IPv4: 127.0.0.4) in 6 attempts"),
        "{}",
        r.message
    );
    assert!(
        r.message.contains("127.0.0.2 ×3") && r.message.contains("127.0.0.3 ×3"),
        "{}",
        r.message
    );
    assert_eq!(metric(&r, "backend_attempts"), 6.0);
    let detail = r.detail.clone().expect("the attempts as the detail");
    let attempts: Vec<&str> = detail.split("; ").collect();
    assert_eq!(attempts.len(), 6, "{detail}");
    assert!(
        attempts.iter().all(|a| a.contains(": answered by 127.0.0.")),
        "{detail}"
    );

    // Routed: within one run, whatever the balancer's turn.
    balancer.route_to(&[a.addr, b.addr, me.addr]);
    for _ in 0..3 {
        let r = through(&balancer, wanted.clone()).await;
        assert_eq!(r.status, Status::Success, "{r:?}");
        assert!(
            r.message
                .contains(": 200 from this backend (Pod-IPv4: 127.0.0.4, attempt"),
            "{}",
            r.message
        );
        assert!(metric(&r, "backend_attempts") <= 3.0, "{r:?}");
    }

    // This Pod answers, unhealthy: a failure naming the status, not "not routed".
    me.set_status(503);
    let r = through(&balancer, wanted).await;
    assert_eq!(r.status, Status::Failure, "{r:?}");
    assert!(
        r.message
            .contains("GET /healthz: 503 Service Unavailable from this backend"),
        "{}",
        r.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_without_the_header_passes_as_unverified_or_fails_when_so_configured() {
    let older = PodBackend::start("127.0.0.5", false).await;
    let balancer = RoundRobin::start(&[older.addr]).await;

    let r = through(
        &balancer,
        serde_json::json!({"header": "Pod-IPv4", "equals": "127.0.0.6"}),
    )
    .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(
        r.message.ends_with("backend not verified (no Pod-IPv4 header)"),
        "{}",
        r.message
    );
    assert_eq!(metric(&r, "backend_attempts"), 1.0);

    let strict = serde_json::json!({"header": "Pod-IPv4", "equals": "127.0.0.6", "missing": "fail"});
    let r = through(&balancer, strict).await;
    assert_eq!(r.status, Status::Failure, "{r:?}");
    assert!(
        r.message
            .contains("cannot verify the backend: the response (200) has no Pod-IPv4 header"),
        "{}",
        r.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_attempts_are_counted_and_the_last_error_named() {
    let balancer = RoundRobin::start(&[sonde_tests::closed_port()]).await;
    let r = through(
        &balancer,
        serde_json::json!({"header": "Pod-IPv4", "equals": "127.0.0.4", "attempts": 2}),
    )
    .await;
    assert_eq!(r.status, Status::Failure, "{r:?}");
    assert!(
        r.message.contains("in 2 attempts; 2 failed, the last: GET http://"),
        "{}",
        r.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_check_refuses_what_cannot_work() {
    let balancer = RoundRobin::start(&[]).await;
    for (config, says) in [
        (
            serde_json::json!({"keepalive": true, "backend": {"header": "Pod-IPv4", "equals": "127.0.0.4"}}),
            "not with keepalive",
        ),
        (
            serde_json::json!({"backend": {"header": "Pod-IPv4", "equals": "127.0.0.4", "attempts": 61}}),
            "backend.attempts 61: from 1 to 60",
        ),
        (
            serde_json::json!({"backend": {"header": "Pod-IPv4", "equals": " "}}),
            "backend.equals is empty",
        ),
    ] {
        let r = check("http", &balancer.addr.to_string(), &config.to_string(), TIMEOUT).await;
        assert_eq!(r.reason, Some(Reason::InvalidConfig), "{config}: {r:?}");
        assert!(r.message.contains(says), "{config}: {}", r.message);
    }
}

/// The nginx config of docs/kubernetes.md's "Gate a rollout on Service
/// routing" (its ConfigMap's `default.conf`, as shipped) names the Pod
/// that answered: two real nginx "Pods" on their own loopback addresses
/// behind a round-robin balancer, and the http plugin's backend check
/// passes only once the balancer routes to the one it wants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rollout_example_s_nginx_says_which_pod_answered() {
    use sonde_tests::RoundRobin;
    let map: serde_json::Value = sonde_tests::doc_documents(
        "docs/kubernetes.md",
        "## Gate a rollout on Service routing",
        "yaml kubernetes",
    )
    .iter()
    .map(|o| serde_saphyr::from_str::<serde_json::Value>(o).unwrap())
    .find(|o| o["kind"] == "ConfigMap")
    .expect("the ConfigMap");
    let conf = map["data"]["default.conf"].as_str().unwrap();
    assert!(conf.contains("listen 8080;"), "{conf}");
    let mut pods = Vec::new();
    let mut addrs = Vec::new();
    for ip in ["127.0.0.41", "127.0.0.42"] {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind((ip, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr: SocketAddr = format!("{ip}:{port}").parse().unwrap();
        let nginx = start_nginx_serving(dir.path(), &conf.replace("listen 8080;", &format!("listen {addr};")));
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            assert!(Instant::now() < deadline, "nginx did not listen on {addr}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        pods.push((dir, nginx));
        addrs.push(addr);
    }
    let balancer = RoundRobin::start(&addrs[1..]).await;
    let config = serde_json::json!({"path": "/healthz",
        "backend": {"header": "Pod-IPv4", "equals": "127.0.0.41", "attempts": 4}});
    let (target, config) = (balancer.addr.to_string(), config.to_string());
    let run = || crate::support::check("http", &target, &config, Duration::from_secs(5));
    let r = run().await;
    assert_eq!(r.status, sonde_sandbox::verdict::Status::Failure, "{r:?}");
    assert!(r.message.contains("answered by 127.0.0.42 ×4"), "{}", r.message);
    balancer.route_to(&addrs);
    let r = run().await;
    assert_eq!(r.status, sonde_sandbox::verdict::Status::Success, "{r:?}");
    assert!(
        r.message.contains("from this backend (Pod-IPv4: 127.0.0.41"),
        "{}",
        r.message
    );
}
