//! The OTLP export against a receiver that decodes what it gets
//! ([`receiver`]): what arrives over HTTP/protobuf and gRPC, the headers
//! sent, and how the export behaves when the collector is down, stalls,
//! or answers 429/503: it keeps one export at a time, counts each failure
//! by reason, waits as asked, and carries on when the collector is back.

#[allow(
    dead_code,
    reason = "the receiver keeps spans for the sonde crate's tests, which share it; these export no span"
)]
mod receiver;

use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use receiver::{Answer, Receiver};
use sonde_core::catalog::otlp::{OtlpHeader, OtlpProtocol, OtlpSettings};
use sonde_otel::{Exporter, Source, Stats};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// What the export sends: a scrape as `/metrics` writes it.
const EXPOSITION: &str = "# HELP sonde_probe_runs Runs, by status.\n\
# TYPE sonde_probe_runs counter\n\
sonde_probe_runs_total{probe=\"web\",status=\"success\"} 12\n\
# HELP sonde_probe_state The probe's state.\n\
# TYPE sonde_probe_state gauge\n\
sonde_probe_state{probe=\"web\",state=\"success\"} 1\n\
# HELP sonde_run_duration_seconds Run durations.\n\
# TYPE sonde_run_duration_seconds histogram\n\
sonde_run_duration_seconds_sum{plugin=\"http\"} 0.25\n\
sonde_run_duration_seconds_count{plugin=\"http\"} 12\n\
sonde_run_duration_seconds_bucket{le=\"0.01\",plugin=\"http\"} 10\n\
sonde_run_duration_seconds_bucket{le=\"+Inf\",plugin=\"http\"} 12\n\
# EOF\n";

fn settings(addr: SocketAddr, protocol: OtlpProtocol, interval: Duration) -> OtlpSettings {
    OtlpSettings {
        endpoint: format!("http://{addr}"),
        protocol,
        headers: vec![OtlpHeader::text("X-Scope-OrgID", "edge")],
        ca: None,
        identity: None,
        interval,
        timeout: interval,
        resource: BTreeMap::from([("deployment.environment.name".into(), "test".into())]),
        traces: None,
        tenant: None,
    }
}

fn source() -> Source {
    Arc::new(|| EXPOSITION.to_string())
}

fn start(settings: &OtlpSettings) -> (Exporter, Arc<Stats>) {
    let stats = Arc::new(Stats::default());
    let exporter = Exporter::spawn(
        settings,
        source(),
        SystemTime::now(),
        stats.clone(),
        &Default::default(),
    )
    .unwrap();
    (exporter, stats)
}

/// The failures counted for `reason`.
fn failures(stats: &Stats, reason: &str) -> u64 {
    stats
        .snapshot()
        .failed
        .iter()
        .find(|(_, r, _)| *r == reason)
        .map_or(0, |(_, _, n)| *n)
}

async fn every_family_arrives(protocol: OtlpProtocol) {
    let receiver = Receiver::start(Answer::Take).await;
    let (_exporter, stats) = start(&settings(receiver.addr, protocol, Duration::from_secs(1)));
    receiver.until(2).await;
    let request = receiver.last();
    let rm = &request.resource_metrics[0];
    let resource = &rm.resource.as_ref().unwrap().attributes;
    let attribute = |k: &str| {
        resource
            .iter()
            .find(|a| a.key == k)
            .and_then(|a| match a.value.as_ref()?.value.as_ref()? {
                opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(s) => Some(s.clone()),
                _ => None,
            })
    };
    assert_eq!(attribute("service.name").as_deref(), Some("sonde"));
    assert_eq!(attribute("service.version").as_deref(), Some(env!("CARGO_PKG_VERSION")));
    assert_eq!(attribute("deployment.environment.name").as_deref(), Some("test"));
    let metrics = &rm.scope_metrics[0].metrics;
    let names: Vec<(&str, &str)> = metrics.iter().map(|m| (m.name.as_str(), m.unit.as_str())).collect();
    assert_eq!(
        names,
        [
            ("sonde.probe.runs", "{runs}"),
            ("sonde.probe.state", ""),
            ("sonde.run.duration", "s")
        ]
    );
    let Some(Data::Histogram(h)) = &metrics[2].data else {
        panic!("{:?}", metrics[2]);
    };
    assert_eq!(h.data_points[0].bucket_counts, [10, 2]);
    let headers = &receiver.received.requests.lock().unwrap()[0].2;
    assert_eq!(headers.get("x-scope-orgid").unwrap(), "edge");
    assert!(stats.snapshot().sent[0].1 >= 2);
}

#[tokio::test]
async fn every_family_arrives_over_http_protobuf() {
    every_family_arrives(OtlpProtocol::HttpProtobuf).await;
}

#[tokio::test]
async fn every_family_arrives_over_grpc() {
    every_family_arrives(OtlpProtocol::Grpc).await;
}

#[tokio::test]
async fn a_collector_that_is_down_is_counted_and_tried_again() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (_exporter, stats) = start(&settings(port, OtlpProtocol::HttpProtobuf, Duration::from_secs(1)));
    let deadline = Instant::now() + Duration::from_secs(20);
    while failures(&stats, "unreachable") < 2 {
        assert!(Instant::now() < deadline, "{:?}", stats.snapshot());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(stats.snapshot().sent[0].1, 0);
}

/// A collector that takes the request and never answers holds one export,
/// never two: each times out, is counted, and the next waits.
#[tokio::test]
async fn a_stalled_collector_holds_one_export_at_a_time() {
    let receiver = Receiver::start(Answer::Stall).await;
    let (_exporter, stats) = start(&settings(receiver.addr, OtlpProtocol::Grpc, Duration::from_secs(1)));
    receiver.until(3).await;
    assert_eq!(
        receiver
            .received
            .most_in_flight
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    assert!(failures(&stats, "timeout") >= 2, "{:?}", stats.snapshot());
    // Back to answering: the next export lands.
    receiver.answer(Answer::Take);
    let deadline = Instant::now() + Duration::from_secs(30);
    while stats.snapshot().sent[0].1 == 0 {
        assert!(Instant::now() < deadline, "{:?}", stats.snapshot());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// 429 with `Retry-After: 3`: the next export comes no sooner than asked.
#[tokio::test]
async fn a_busy_collector_is_left_alone_as_long_as_it_asks() {
    let receiver = Receiver::start(Answer::Refuse {
        status: 429,
        retry_after: Some(3),
    })
    .await;
    let (_exporter, stats) = start(&settings(
        receiver.addr,
        OtlpProtocol::HttpProtobuf,
        Duration::from_secs(1),
    ));
    receiver.until(2).await;
    let at: Vec<Instant> = receiver.received.requests.lock().unwrap().iter().map(|r| r.0).collect();
    assert!(at[1] - at[0] >= Duration::from_secs(3), "{:?}", at[1] - at[0]);
    assert!(failures(&stats, "busy") >= 1, "{:?}", stats.snapshot());
}

/// 503 and gRPC UNAVAILABLE are "busy"; a 401 is "refused".
#[tokio::test]
async fn refusals_are_counted_by_what_they_mean() {
    let receiver = Receiver::start(Answer::GrpcStatus(14)).await;
    let (_grpc, stats) = start(&settings(receiver.addr, OtlpProtocol::Grpc, Duration::from_secs(1)));
    receiver.until(1).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while failures(&stats, "busy") < 1 {
        assert!(Instant::now() < deadline, "{:?}", stats.snapshot());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let receiver = Receiver::start(Answer::Refuse {
        status: 401,
        retry_after: None,
    })
    .await;
    let (_http, stats) = start(&settings(
        receiver.addr,
        OtlpProtocol::HttpProtobuf,
        Duration::from_secs(1),
    ));
    receiver.until(1).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while failures(&stats, "refused") < 1 {
        assert!(Instant::now() < deadline, "{:?}", stats.snapshot());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A collector that answers with more than [`sonde_otel::transport::MAX_ANSWER_BYTES`]:
/// the answer is read no further, the export counts as failed (`answer`),
/// and the exporter goes on.
#[tokio::test]
async fn an_answer_past_its_bound_is_cut_and_counted() {
    let receiver = Receiver::start(Answer::Flood(16 * sonde_otel::transport::MAX_ANSWER_BYTES)).await;
    let (_exporter, stats) = start(&settings(
        receiver.addr,
        OtlpProtocol::HttpProtobuf,
        Duration::from_secs(1),
    ));
    let deadline = Instant::now() + Duration::from_secs(10);
    while failures(&stats, "answer") < 1 {
        assert!(Instant::now() < deadline, "{:?}", stats.snapshot());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(stats.snapshot().sent[0].1, 0);
}
