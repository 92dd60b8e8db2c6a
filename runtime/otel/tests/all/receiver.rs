//! A collector's OTLP receiver, in process: a real hyper server that takes
//! metrics and trace exports over HTTP/1.1 (`POST /v1/metrics`,
//! `/v1/traces`) or gRPC (HTTP/2, `MetricsService/Export`,
//! `TraceService/Export`), decodes them with the same generated types,
//! keeps them, and answers as it is told: taking them,
//! refusing them (429 or 503 with `Retry-After`, a gRPC status), or never
//! answering at all.

use bytes::{Buf, Bytes};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message as _;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// How the receiver answers.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Answer {
    /// Takes every export.
    Take,
    /// HTTP `status` with `Retry-After: seconds` (over gRPC: the HTTP
    /// status itself).
    Refuse { status: u16, retry_after: Option<u64> },
    /// gRPC status `code` in the trailers.
    GrpcStatus(u32),
    /// Reads the request and never answers.
    Stall,
    /// Answers 200 with a body of this many bytes.
    Flood(usize),
}

/// What came in, and when.
#[derive(Default)]
pub(crate) struct Received {
    pub(crate) requests: Mutex<Vec<(Instant, ExportMetricsServiceRequest, hyper::HeaderMap)>>,
    /// The trace exports, decoded.
    pub(crate) traces: Mutex<Vec<ExportTraceServiceRequest>>,
    /// Requests being answered now (a stalled one stays).
    pub(crate) in_flight: AtomicUsize,
    /// The most in flight at once.
    pub(crate) most_in_flight: AtomicUsize,
}

/// The receiver; stops when dropped.
pub(crate) struct Receiver {
    pub(crate) addr: SocketAddr,
    pub(crate) received: Arc<Received>,
    answer: Arc<Mutex<Answer>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Receiver {
    /// A receiver answering `answer`, on a free loopback port.
    pub(crate) async fn start(answer: Answer) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(Received::default());
        let answer = Arc::new(Mutex::new(answer));
        let (r, a) = (received.clone(), answer.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (r, a) = (r.clone(), a.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| serve(req, r.clone(), *a.lock().unwrap()));
                    // HTTP/1.1 and HTTP/2 (gRPC's prior knowledge) alike.
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            received,
            answer,
            task,
        }
    }

    /// Answers `answer` from now on.
    pub(crate) fn answer(&self, answer: Answer) {
        *self.answer.lock().unwrap() = answer;
    }

    /// How many exports came in.
    pub(crate) fn count(&self) -> usize {
        self.received.requests.lock().unwrap().len()
    }

    /// Waits until `n` exports came in (at most 30 s).
    pub(crate) async fn until(&self, n: usize) {
        let deadline = Instant::now() + std::time::Duration::from_secs(30);
        while self.count() < n {
            assert!(Instant::now() < deadline, "{} of {n} exports came in", self.count());
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Every span that came in.
    pub(crate) fn spans(&self) -> Vec<opentelemetry_proto::tonic::trace::v1::Span> {
        let traces = self.received.traces.lock().unwrap();
        traces
            .iter()
            .flat_map(|t| &t.resource_spans)
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| s.spans.clone())
            .collect()
    }

    /// The last export that came in.
    pub(crate) fn last(&self) -> ExportMetricsServiceRequest {
        self.received
            .requests
            .lock()
            .unwrap()
            .last()
            .expect("an export")
            .1
            .clone()
    }
}

struct InFlight<'a>(&'a Received);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn serve(
    req: Request<Incoming>,
    received: Arc<Received>,
    answer: Answer,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let now = received.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    received.most_in_flight.fetch_max(now, Ordering::SeqCst);
    let _in_flight = InFlight(&received);
    let grpc = req
        .headers()
        .get("content-type")
        .is_some_and(|v| v == "application/grpc");
    let path = req.uri().path();
    let traces = path.ends_with("/v1/traces") || path.ends_with("TraceService/Export");
    let headers = req.headers().clone();
    let mut body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    if grpc {
        // The 5-byte frame: not compressed, then the length.
        assert_eq!(body.get_u8(), 0, "an uncompressed message");
        let len = body.get_u32() as usize;
        assert_eq!(len, body.len(), "one whole message");
    }
    if traces {
        let message = ExportTraceServiceRequest::decode(body).expect("an ExportTraceServiceRequest");
        received.traces.lock().unwrap().push(message);
    } else {
        let message = ExportMetricsServiceRequest::decode(body).expect("an ExportMetricsServiceRequest");
        received
            .requests
            .lock()
            .unwrap()
            .push((Instant::now(), message, headers));
    }
    let reply = |status: u16| Response::builder().status(status);
    let response = match (answer, grpc) {
        (Answer::Stall, _) => std::future::pending().await,
        (Answer::Flood(n), _) => reply(200).body(Full::new(Bytes::from(vec![b'x'; n]))),
        (Answer::Refuse { status, retry_after }, _) => {
            let mut r = reply(status);
            if let Some(s) = retry_after {
                r = r.header("retry-after", s.to_string());
            }
            r.body(Full::new(Bytes::new()))
        }
        (Answer::Take, false) => reply(200)
            .header("content-type", "application/x-protobuf")
            .body(Full::new(Bytes::new())),
        // A trailers-only answer: the status in the headers.
        (Answer::Take, true) => grpc_answer(0),
        (Answer::GrpcStatus(code), true) => grpc_answer(code),
        (Answer::GrpcStatus(_), false) => reply(500).body(Full::new(Bytes::new())),
    };
    Ok(response.expect("a response"))
}

fn grpc_answer(code: u32) -> Result<Response<Full<Bytes>>, http::Error> {
    Response::builder()
        .status(200)
        .header("content-type", "application/grpc")
        .header("grpc-status", code.to_string())
        .body(Full::new(Bytes::new()))
}
