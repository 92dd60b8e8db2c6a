//! A span per scheduled probe run: the scheduler's observer ([`Tracing`])
//! turns each finished run an export samples into a span and its phases'
//! child spans, into that export's bounded queue ([`RunTracer`]), which
//! the export empties ([`RunTracer::take`]); a full queue drops the span
//! and counts it. The operator's export gets every tenant's runs; a
//! tenant's export (its own `otlp:`) only its own, in a queue of its own,
//! so one tenant's spans never wait behind, or reach, another's.
//!
//! **The run's span** (`sonde.run`, kind internal) lasts the run, ends when
//! it finished, and says what the run was and how it ended: the probe, its
//! target, kind and tenant, the plugin and its digest, the outcome and its
//! cause, the fuel it burned. A run that did not pass has status `ERROR`
//! with its message (scrubbed of secrets, as everywhere). A denial of a
//! grant is an event, `sonde.grant.denied`, naming what was denied.
//!
//! **Its phases** are what the host measured of the run's first
//! connection: the name lookup, the connect, the TLS handshake and the
//! HTTP exchange (or the gRPC call), each a child span laid end to end from
//! the run's start — the host times each phase, not when it began.
//!
//! **Sampling** decides on the outcome, which is known when the span is
//! made: every run that does not pass, and `success_ratio` of those that
//! do (one draw per run, so an export with a larger ratio gets every run
//! one with a smaller ratio gets); and every run of a probe that
//! propagates its trace context (its requests carried the run's ids,
//! which the span then takes), so the target's spans always have their
//! parent.
//!
//! **Exemplars**: the last traced run of each plugin and kind is kept, and
//! the metrics export attaches it to that series of the run duration
//! histogram, so a chart's point links to a run's trace.

use crate::attributes::{attribute, int};
use opentelemetry_proto::tonic::trace::v1::{Span, Status, span, status};
use sonde_core::catalog::ProbeSpec;
use sonde_core::scheduler::Observer;
use sonde_sandbox::verdict::{Reason, RunResult, Status as RunStatus};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// The most spans waiting for the export; past it a new one is dropped.
pub const MAX_QUEUED_SPANS: usize = 4096;

/// A traced run's ids and value, for an exemplar.
#[derive(Clone, Debug, PartialEq)]
pub struct Exemplar {
    /// The run's trace.
    pub trace_id: [u8; 16],
    /// The run's span.
    pub span_id: [u8; 8],
    /// The run's duration, in seconds.
    pub seconds: f64,
    /// When it ended, in nanoseconds since the Unix epoch.
    pub at: u64,
}

/// One export's spans: the runs it samples, queued until sent, and the
/// last of each plugin and kind, for exemplars.
pub struct RunTracer {
    success_ratio: f64,
    queue: Mutex<VecDeque<Span>>,
    dropped: AtomicU64,
    /// The last traced run, by plugin then kind.
    exemplars: Mutex<HashMap<String, HashMap<&'static str, Exemplar>>>,
}

impl std::fmt::Debug for RunTracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunTracer")
            .field("success_ratio", &self.success_ratio)
            .field("dropped", &self.dropped())
            .finish_non_exhaustive()
    }
}

impl RunTracer {
    /// A tracer of every failed run and `success_ratio` of the others.
    pub fn new(success_ratio: f64) -> Self {
        Self {
            success_ratio,
            queue: Mutex::default(),
            dropped: AtomicU64::new(0),
            exemplars: Mutex::default(),
        }
    }

    /// Up to `n` spans, oldest first.
    pub fn take(&self, n: usize) -> Vec<Span> {
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let n = n.min(queue.len());
        queue.drain(..n).collect()
    }

    /// Spans dropped so far: the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// The last traced run of `plugin` and `kind`.
    pub fn exemplar(&self, plugin: &str, kind: &str) -> Option<Exemplar> {
        let exemplars = self.exemplars.lock().unwrap_or_else(|e| e.into_inner());
        exemplars.get(plugin)?.get(kind).cloned()
    }

    /// Whether a run ending as `result` is traced, given the run's one
    /// `draw` (from 0 to 1).
    fn samples(&self, result: &RunResult, draw: f64) -> bool {
        match result.status {
            RunStatus::Success | RunStatus::Warning => draw < self.success_ratio,
            _ => true,
        }
    }

    /// Queues `spans`, the run of `exemplar` (a `plugin` run of `kind`),
    /// unless the queue is full (then they are counted as dropped).
    fn push(&self, spans: Vec<Span>, exemplar: Exemplar, plugin: &str, kind: &'static str) {
        {
            let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            if queue.len() + spans.len() > MAX_QUEUED_SPANS {
                self.dropped.fetch_add(spans.len() as u64, Ordering::Relaxed);
                return;
            }
            queue.extend(spans);
        }
        let mut exemplars = self.exemplars.lock().unwrap_or_else(|e| e.into_inner());
        // The plugin's name is copied once, at its first traced run.
        match exemplars.get_mut(plugin) {
            Some(by_kind) => {
                by_kind.insert(kind, exemplar);
            }
            None => {
                exemplars.insert(plugin.to_string(), HashMap::from([(kind, exemplar)]));
            }
        }
    }
}

/// The scheduler's observer when an export traces: what `inner` is told
/// (the histograms), and the spans of each run to the tracers that sample
/// it: the operator's export's, and the run's tenant's.
pub struct Tracing {
    inner: Arc<dyn Observer>,
    operator: Option<Arc<RunTracer>>,
    tenants: HashMap<String, Arc<RunTracer>>,
}

impl Tracing {
    /// Passes everything on to `inner`; traces runs for the operator's
    /// export (`operator`) and for each tenant's (`tenants`, by id).
    pub fn new(
        inner: Arc<dyn Observer>,
        operator: Option<Arc<RunTracer>>,
        tenants: HashMap<String, Arc<RunTracer>>,
    ) -> Self {
        Self {
            inner,
            operator,
            tenants,
        }
    }

    /// Traces a `/probe` run of the module `spec` against `target` that
    /// propagated its trace context: its span, in the operator's export
    /// and its tenant's, always (the target's spans name it as their
    /// parent). Other `/probe` runs are not traced.
    pub fn probe_run(&self, spec: &ProbeSpec, target: &str, result: &RunResult) {
        if result.observed.as_ref().is_some_and(|o| o.trace.is_some()) {
            self.record(spec, target, result);
        }
    }

    fn record(&self, spec: &ProbeSpec, address: &str, result: &RunResult) {
        // A run that sent its trace context is always traced: the target's
        // spans name it as their parent.
        let sent = result.observed.as_ref().and_then(|o| o.trace);
        let draw = fastrand::f64();
        // At most two exports take a run (the operator's, its tenant's):
        // chosen without allocating, on every run.
        let takes = |t: &&Arc<RunTracer>| sent.is_some() || t.samples(result, draw);
        let operator = self.operator.as_ref().filter(takes);
        let tenant = self.tenants.get(spec.tenant.as_ref()).filter(takes);
        let (first, last) = match (operator, tenant) {
            (None, None) => return,
            (Some(one), None) | (None, Some(one)) => (None, one),
            (Some(o), Some(t)) => (Some(o), t),
        };
        let end = SystemTime::now();
        let ids = sent.map_or_else(Ids::random, |t| Ids {
            trace: t.trace_id,
            run: t.span_id,
        });
        let spans = spans(&Facts::of(spec, address), result, end, &ids);
        let exemplar = Exemplar {
            trace_id: ids.trace,
            span_id: ids.run,
            seconds: result.duration.as_secs_f64(),
            at: nanos(end),
        };
        let (plugin, kind) = (spec.plugin_ref.as_str(), spec.kind.as_str());
        if let Some(t) = first {
            t.push(spans.clone(), exemplar.clone(), plugin, kind);
        }
        last.push(spans, exemplar, plugin, kind);
    }
}

impl Observer for Tracing {
    fn run_started(&self, spec: &ProbeSpec, late: Duration) {
        self.inner.run_started(spec, late);
    }

    fn run_finished(&self, spec: &ProbeSpec, result: &RunResult) {
        self.inner.run_finished(spec, result);
        self.record(spec, &spec.address, result);
    }
}

/// A run's trace id and its span's.
struct Ids {
    trace: [u8; 16],
    run: [u8; 8],
}

impl Ids {
    fn random() -> Self {
        // W3C trace context: all-zero ids are invalid.
        let trace = fastrand::u128(1..).to_be_bytes();
        let run = fastrand::u64(1..).to_be_bytes();
        Self { trace, run }
    }
}

pub(crate) fn nanos(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// What a span says of the probe that ran.
struct Facts<'a> {
    name: &'a str,
    kind: &'static str,
    target: &'a str,
    address: &'a str,
    tenant: &'a str,
    plugin: &'a str,
    digest: String,
}

impl<'a> Facts<'a> {
    /// `spec`'s facts, as it ran against `address`.
    fn of(spec: &'a ProbeSpec, address: &'a str) -> Self {
        Self {
            name: &spec.name,
            kind: spec.kind.as_str(),
            target: &spec.target,
            address,
            tenant: &spec.tenant,
            plugin: &spec.plugin_ref,
            digest: spec.plugin.digest().to_string(),
        }
    }
}

/// The run's span and its phases' (see the module's documentation).
fn spans(probe: &Facts<'_>, result: &RunResult, end: SystemTime, ids: &Ids) -> Vec<Span> {
    let end_ns = nanos(end);
    let start_ns = end_ns.saturating_sub(u64::try_from(result.duration.as_nanos()).unwrap_or(u64::MAX));
    let mut attributes = vec![
        attribute("sonde.probe.name", probe.name),
        attribute("sonde.probe.kind", probe.kind),
        attribute("sonde.target.name", probe.target),
        attribute("server.address", probe.address),
        attribute("sonde.tenant", probe.tenant),
        attribute("sonde.plugin.name", probe.plugin),
        attribute("sonde.plugin.digest", &probe.digest),
        attribute("sonde.run.outcome", result.status.as_str()),
        int(
            "sonde.run.fuel",
            i64::try_from(result.fuel_consumed).unwrap_or(i64::MAX),
        ),
        int(
            "sonde.run.memory",
            i64::try_from(result.memory_bytes).unwrap_or(i64::MAX),
        ),
    ];
    if let Some(cause) = result.cause() {
        attributes.push(attribute("sonde.run.reason", cause.as_str()));
    }
    let passed = matches!(result.status, RunStatus::Success | RunStatus::Warning);
    let mut events = Vec::new();
    if result.reason == Some(Reason::Denied) {
        events.push(span::Event {
            time_unix_nano: end_ns,
            name: "sonde.grant.denied".into(),
            attributes: vec![attribute("sonde.denial", &result.message)],
            ..span::Event::default()
        });
    }
    let run = Span {
        trace_id: ids.trace.to_vec(),
        span_id: ids.run.to_vec(),
        name: "sonde.run".into(),
        kind: span::SpanKind::Internal as i32,
        start_time_unix_nano: start_ns,
        end_time_unix_nano: end_ns,
        attributes,
        events,
        status: Some(if passed {
            Status {
                code: status::StatusCode::Ok as i32,
                ..Status::default()
            }
        } else {
            Status {
                code: status::StatusCode::Error as i32,
                message: result.message.clone(),
            }
        }),
        flags: 0x100 | 0x01,
        ..Span::default()
    };
    let mut out = vec![run];
    out.extend(phases(result, start_ns, ids));
    out
}

/// The host's phases of the run's connections as child spans, laid end to
/// end from `start`.
fn phases(result: &RunResult, start: u64, ids: &Ids) -> Vec<Span> {
    let Some(o) = &result.observed else {
        return Vec::new();
    };
    let mut steps: Vec<(&str, Duration)> = vec![("lookup", o.dns), ("connect", o.connect), ("tls", o.handshake)];
    if let Some(h) = &o.http {
        steps.push(("http", h.processing + h.transfer));
    }
    if let Some(g) = &o.grpc {
        steps.push(("grpc", g.check));
    }
    let mut at = start;
    let mut out = Vec::new();
    for (i, (name, took)) in steps.into_iter().enumerate() {
        if took.is_zero() {
            continue;
        }
        let end = at.saturating_add(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX));
        let mut span_id = ids.run;
        span_id[0] ^= 0x80 | (i as u8 + 1);
        out.push(Span {
            trace_id: ids.trace.to_vec(),
            span_id: span_id.to_vec(),
            parent_span_id: ids.run.to_vec(),
            name: format!("sonde.host.{name}"),
            kind: span::SpanKind::Client as i32,
            start_time_unix_nano: at,
            end_time_unix_nano: end,
            flags: 0x100 | 0x01,
            ..Span::default()
        });
        at = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::any_value;
    use sonde_sandbox::verdict::observed::{HttpSeen, Observed};

    fn facts() -> Facts<'static> {
        Facts {
            name: "web-ready",
            kind: "readiness",
            target: "web",
            address: "127.0.0.1:8080",
            tenant: "default",
            plugin: "http",
            digest: "sha256:ab".into(),
        }
    }

    /// A run the plugin judged `status`.
    fn judged(status: RunStatus, message: &str) -> RunResult {
        let mut r = RunResult::error(Reason::Io, message);
        (r.status, r.reason) = (status, None);
        r
    }

    fn ids() -> Ids {
        Ids {
            trace: [1; 16],
            run: [2; 8],
        }
    }

    fn string(span: &Span, key: &str) -> Option<String> {
        span.attributes
            .iter()
            .find(|a| a.key == key)
            .and_then(|a| match a.value.as_ref()?.value.as_ref()? {
                any_value::Value::StringValue(s) => Some(s.clone()),
                _ => None,
            })
    }

    #[test]
    fn a_failed_run_is_an_error_span_with_its_phases_end_to_end() {
        let mut result = judged(RunStatus::Failure, "GET /ready: 503 Service Unavailable");
        result.duration = Duration::from_millis(30);
        result.observed = Some(Box::new(Observed {
            dns: Duration::from_millis(2),
            connect: Duration::from_millis(3),
            http: Some(HttpSeen {
                responses: 1,
                processing: Duration::from_millis(10),
                ..HttpSeen::default()
            }),
            ..Observed::default()
        }));
        let end = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let spans = spans(&facts(), &result, end, &ids());
        let run = &spans[0];
        assert_eq!(run.name, "sonde.run");
        assert_eq!(run.end_time_unix_nano - run.start_time_unix_nano, 30_000_000);
        assert_eq!(string(run, "sonde.probe.name").as_deref(), Some("web-ready"));
        assert_eq!(string(run, "sonde.run.outcome").as_deref(), Some("failure"));
        let status = run.status.as_ref().unwrap();
        assert_eq!(status.code, status::StatusCode::Error as i32);
        assert_eq!(status.message, "GET /ready: 503 Service Unavailable");
        let names: Vec<&str> = spans[1..].iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["sonde.host.lookup", "sonde.host.connect", "sonde.host.http"]);
        for pair in spans[1..].windows(2) {
            assert_eq!(pair[0].end_time_unix_nano, pair[1].start_time_unix_nano);
        }
        assert!(
            spans[1..]
                .iter()
                .all(|s| s.parent_span_id == run.span_id && s.trace_id == run.trace_id)
        );
        let ids: std::collections::BTreeSet<_> = spans.iter().map(|s| s.span_id.clone()).collect();
        assert_eq!(ids.len(), spans.len(), "each span its own id");
    }

    #[test]
    fn a_denial_is_an_event_naming_what_was_denied() {
        let result = RunResult::error(Reason::Denied, "net: 10.0.0.1:22 is not granted");
        let spans = spans(&facts(), &result, SystemTime::now(), &ids());
        let event = &spans[0].events[0];
        assert_eq!(event.name, "sonde.grant.denied");
        assert_eq!(event.attributes[0].key, "sonde.denial");
        assert_eq!(string(&spans[0], "sonde.run.reason").as_deref(), Some("denied"));
    }

    #[test]
    fn failures_are_always_traced_and_successes_by_their_share() {
        let (none, half, all) = (RunTracer::new(0.0), RunTracer::new(0.5), RunTracer::new(1.0));
        let passed = judged(RunStatus::Success, "ok");
        let failed = judged(RunStatus::Failure, "no");
        assert!(!none.samples(&passed, 0.0));
        assert!(none.samples(&failed, 0.99));
        assert!(all.samples(&passed, 0.99));
        // One draw per run: the larger share takes every run the smaller does.
        assert!(half.samples(&passed, 0.3) && all.samples(&passed, 0.3));
        assert!(!half.samples(&passed, 0.7));
    }
}
