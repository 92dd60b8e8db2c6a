//! `GET /probe?target=T&module=M[&debug=true]`: blackbox_exporter's
//! multi-target endpoint. Prometheus discovers targets and relabels each
//! into `target=`; sonde runs module `M` (`modules:`) against it
//! and answers in the Prometheus text format: `probe_success`,
//! `probe_duration_seconds` and what the plugin measured
//! (`sonde_probe_metric`, in base units by [`sonde_core::metrics::base_unit`]).
//!
//! Unlike blackbox_exporter's, this `/probe` reaches only what the module
//! may reach:
//!
//! - **Admission.** `T` must be inside one of the module's `net` grants
//!   (the comparison grants and ceilings use, on canonical addresses:
//!   `127.1` is `127.0.0.1`) and inside its tenant's ceiling (the check a
//!   probe's target passes); it may not be one of the agent's own
//!   listeners. Anything else is `probe_success 0` with the denial in the
//!   debug output, and nothing is dialled. A name is admitted by a name
//!   grant; what it resolves to is checked when the plugin connects, by the
//!   host's one grant check ([`sonde_policy::reach`]): as for any probe.
//! - **The executor.** The run goes through the executor a scheduled
//!   probe's does, with the module's tenant's permits, fairness and stats.
//! - **A share of its own.** At most `api: max_probe_runs` runs at once and
//!   `api: max_probe_queue` requests waiting; past that, 429 at once. A
//!   flood of scrapes therefore holds at most that many of the executor's
//!   permits, and the scheduled probes keep the rest.
//! - **The deadline.** `X-Prometheus-Scrape-Timeout-Seconds` less a margin
//!   ([`deadline`]), capped by the module's `timeout`. A request still
//!   queued at its deadline is answered 503 (the scrape fails, as it
//!   would have).
//! - **Tenants.** A tenant's module answers only its tenant's token (and
//!   the operator's); to anyone else it does not exist (400, as an
//!   unknown module).

use super::{ApiState, error, full};
use axum::extract::{RawQuery, State};
use axum::response::Response;
use http::{HeaderMap, StatusCode};
use sonde_core::auth::Principal;
use sonde_core::catalog::ProbeSpec;
use sonde_sandbox::engine::Call;
use sonde_sandbox::host::NetPattern;
use sonde_sandbox::verdict::RunResult;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The header Prometheus sends with each scrape: its timeout, in seconds.
pub(crate) const SCRAPE_TIMEOUT_HEADER: &str = "x-prometheus-scrape-timeout-seconds";

/// Taken from the scrape's timeout so the answer reaches Prometheus before
/// Prometheus gives up (blackbox_exporter's default offset).
pub(crate) const SCRAPE_MARGIN: Duration = Duration::from_millis(500);

/// How long a `/probe` without a scrape timeout waits for a reload in
/// progress to end.
const RELOAD_WAIT: Duration = Duration::from_secs(10);

/// The content type of the answer.
const TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The `/probe` runs in flight and the requests waiting for one, bounded
/// by `api: max_probe_runs` and `api: max_probe_queue`. Clones share it.
#[derive(Clone, Debug, Default)]
pub(crate) struct ScrapeGate(Arc<GateInner>);

#[derive(Debug, Default)]
struct GateInner {
    /// Runs in flight, requests waiting.
    counts: Mutex<(usize, usize)>,
    freed: tokio::sync::Notify,
}

/// A `/probe` run's place in the gate, given back when dropped.
struct ScrapePermit(Arc<GateInner>);

impl Drop for ScrapePermit {
    fn drop(&mut self) {
        self.0.counts.lock().unwrap_or_else(|e| e.into_inner()).0 -= 1;
        self.0.freed.notify_one();
    }
}

/// A waiting request's place in the queue, given back when dropped
/// (admitted, or given up at its deadline).
struct Queued<'a>(&'a GateInner);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.counts.lock().unwrap_or_else(|e| e.into_inner()).1 -= 1;
    }
}

/// Why a `/probe` request was not run.
#[derive(Debug, thiserror::Error)]
enum GateError {
    /// Every run slot and every queue place is taken.
    #[error(
        "{runs} /probe runs are in flight and {queue} requests wait already (api: max_probe_runs, max_probe_queue)"
    )]
    Full {
        /// `api: max_probe_runs`.
        runs: usize,
        /// `api: max_probe_queue`.
        queue: usize,
    },
}

impl ScrapeGate {
    /// Runs and requests waiting now.
    #[cfg(test)]
    fn counts(&self) -> (usize, usize) {
        *self.0.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A run slot, at once if one is free, else after waiting in the queue;
    /// [`GateError::Full`] when the queue is full too.
    async fn enter(&self, runs: usize, queue: usize) -> Result<ScrapePermit, GateError> {
        let inner = &*self.0;
        {
            let mut c = inner.counts.lock().unwrap_or_else(|e| e.into_inner());
            if c.0 < runs {
                c.0 += 1;
                return Ok(ScrapePermit(self.0.clone()));
            }
            if c.1 >= queue {
                return Err(GateError::Full { runs, queue });
            }
            c.1 += 1;
        }
        let _queued = Queued(inner);
        loop {
            let freed = inner.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut c = inner.counts.lock().unwrap_or_else(|e| e.into_inner());
                if c.0 < runs {
                    c.0 += 1;
                    return Ok(ScrapePermit(self.0.clone()));
                }
            }
            freed.await;
        }
    }
}

/// The deadline of one `/probe` run: the scrape's timeout (`scrape`, from
/// [`SCRAPE_TIMEOUT_HEADER`]) less [`SCRAPE_MARGIN`] — or less half of
/// it, when it is under twice the margin — capped by the module's
/// `timeout`; the module's timeout alone without the header.
pub(crate) fn deadline(scrape: Option<Duration>, module: Duration) -> Duration {
    match scrape {
        None => module,
        Some(s) => {
            let margin = SCRAPE_MARGIN.min(s / 2);
            (s - margin).min(module)
        }
    }
}

/// A scrape timeout header that is not a positive number of seconds.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{SCRAPE_TIMEOUT_HEADER}: {value:?} is not a positive number of seconds")]
struct BadScrapeTimeout {
    /// The header's value, as sent.
    value: String,
}

/// The scrape's timeout from its header: seconds, a positive number.
fn scrape_timeout(headers: &HeaderMap) -> Result<Option<Duration>, BadScrapeTimeout> {
    let Some(v) = headers.get(SCRAPE_TIMEOUT_HEADER) else {
        return Ok(None);
    };
    let text = String::from_utf8_lossy(v.as_bytes());
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s > 0.0)
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .map(Some)
        .ok_or_else(|| BadScrapeTimeout {
            value: text.to_string(),
        })
}

/// Why a `/probe` target was refused: nothing was dialled.
#[derive(Debug, thiserror::Error)]
enum Denial {
    /// The target is neither `host:port` nor an http(s) URL.
    #[error("{0}; nothing was dialled")]
    Target(#[from] sonde_sandbox::host::GrantError),
    /// No net grant of the module covers the target.
    #[error("{target} is not inside the module's net grant ({}); nothing was dialled", grants.join(", "))]
    OutsideGrant {
        /// The target, as sent.
        target: String,
        /// The module's net grants.
        grants: Vec<String>,
    },
    /// The module tenant's ceiling does not cover the target.
    #[error("{0}; nothing was dialled")]
    Ceiling(sonde_core::tenants::CeilingError),
    /// The target is the agent's own listener.
    #[error("{target} is the agent's own listener {own}, which /probe never probes; nothing was dialled")]
    OwnListener {
        /// The target, as sent.
        target: String,
        /// The listener it reaches.
        own: std::net::SocketAddr,
    },
}

/// The module's net grant that admits `target`, or why `target` may not be
/// probed with `module`: the same comparisons a probe's grants and its
/// tenant's ceiling make. The module's own grants and limits were checked
/// against the ceiling when the file loaded; only the target is new.
fn admit<'m>(state: &ApiState, module: &'m ProbeSpec, target: &str) -> Result<&'m NetPattern, Denial> {
    let pattern = NetPattern::for_target(target)?;
    let grant = module
        .grants
        .net
        .iter()
        .find(|g| pattern.within(g))
        .ok_or_else(|| Denial::OutsideGrant {
            target: target.to_string(),
            grants: module.grants.net.iter().map(|g| g.to_string()).collect(),
        })?;
    if let Some(tenant) = state.control.tenants().get(&module.tenant) {
        tenant
            .check_target(&module.name, target, &pattern)
            .map_err(Denial::Ceiling)?;
    }
    if let Ok(addr) = target.parse::<std::net::SocketAddr>()
        && let Some(own) = state.control.engine().own_listeners().reached_by(addr)
    {
        return Err(Denial::OwnListener {
            target: target.to_string(),
            own,
        });
    }
    Ok(grant)
}

/// What a debug answer tells, line by line; nothing (and no formatting)
/// unless the request asked for it.
struct DebugLog(Option<String>);

impl DebugLog {
    fn new(debug: bool) -> Self {
        Self(debug.then(String::new))
    }

    fn line(&mut self, text: impl FnOnce() -> String) {
        if let Some(log) = &mut self.0 {
            log.push_str(&text());
            log.push('\n');
        }
    }

    /// How the run ended, what the plugin said and measured.
    fn outcome(&mut self, result: &RunResult, took: Duration) {
        self.line(|| {
            format!(
                "outcome: {}{} in {} (plugin {}, fuel {})",
                result.status.as_str(),
                result.reason.map_or(String::new(), |r| format!(" ({r})")),
                humantime::format_duration(truncate_micros(took)),
                humantime::format_duration(truncate_micros(result.duration)),
                result.fuel_consumed
            )
        });
        self.line(|| format!("message: {}", result.message));
        if let Some(d) = &result.detail {
            self.line(|| format!("detail: {d}"));
        }
        for m in &result.metrics {
            self.line(|| format!("metric {} = {} {}", m.name, m.value, m.unit));
        }
    }
}

/// The answer's metrics: `probe_success`, `probe_duration_seconds`,
/// blackbox_exporter's series for what the run did, and sonde's own
/// ([`super::blackbox`]).
fn exposition(result: &RunResult, took: Duration) -> String {
    super::blackbox::exposition(result, took)
}

/// The parameters of a `/probe` request, read in one pass over its query.
#[derive(Default)]
struct Params<'a> {
    module: Option<std::borrow::Cow<'a, str>>,
    target: Option<std::borrow::Cow<'a, str>>,
    debug: bool,
}

impl<'a> Params<'a> {
    /// The first `module` and `target`, and `debug`; other keys are ignored.
    fn parse(query: Option<&'a str>) -> Self {
        let mut p = Params::default();
        for (k, v) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
            match &*k {
                "module" if p.module.is_none() => p.module = Some(v),
                "target" if p.target.is_none() => p.target = Some(v),
                "debug" => p.debug = v == "true" || v == "1",
                _ => {}
            }
        }
        p
    }
}

/// `GET /probe`.
pub(super) async fn probe(
    who: Principal,
    State(state): State<ApiState>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Response {
    let start = Instant::now();
    let params = Params::parse(q.as_deref());
    let Some(module_name) = params.module.filter(|m| !m.is_empty()) else {
        return error(
            StatusCode::BAD_REQUEST,
            "module: missing (/probe?target=...&module=...)",
        );
    };
    let Some(target) = params.target.as_deref().map(str::trim).filter(|t| !t.is_empty()) else {
        return error(
            StatusCode::BAD_REQUEST,
            "target: missing (/probe?target=...&module=...)",
        );
    };
    let scrape = match scrape_timeout(&headers) {
        Ok(s) => s,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    // A reload holds the catalog while it loads: wait for it no longer
    // than the scrape would.
    let wait = scrape.unwrap_or(RELOAD_WAIT);
    let Ok(catalog) = tokio::time::timeout(wait, state.control.catalog().lock()).await else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the config is being reloaded; try again (the modules are not known until it is)",
        );
    };
    let modules = catalog.modules.clone();
    drop(catalog);
    let Some(module) = modules.get(&module_name).filter(|m| who.sees(&m.tenant)) else {
        return error(StatusCode::BAD_REQUEST, format!("no module named {module_name:?}"));
    };
    let mut log = DebugLog::new(params.debug);
    log.line(|| {
        format!(
            "module {module_name}: plugin {}, tenant {}, timeout {}",
            module.plugin_ref,
            &*module.tenant,
            humantime::format_duration(module.limits.timeout)
        )
    });
    log.line(|| format!("target {target}"));
    let result = match admit(&state, module, target) {
        Err(denial) => {
            log.line(|| format!("admission: denied: {denial}"));
            RunResult::error(sonde_sandbox::verdict::Reason::Denied, denial.to_string())
        }
        Ok(grant) => {
            log.line(|| format!("admission: allowed: {target} is inside the module's net grant {grant}"));
            let deadline = deadline(scrape, module.limits.timeout);
            log.line(|| {
                format!(
                    "deadline {} ({})",
                    humantime::format_duration(deadline),
                    match scrape {
                        Some(s) => format!(
                            "the scrape's {}s less its margin, capped by the module's timeout",
                            s.as_secs_f64()
                        ),
                        None => "the module's timeout: no scrape timeout header".into(),
                    }
                )
            });
            match run(&state, module, target, deadline, start).await {
                Ok(r) => r,
                Err(response) => return response,
            }
        }
    };
    let took = start.elapsed();
    log.outcome(&result, took);
    let metrics = exposition(&result, took);
    if let Some(mut text) = log.0 {
        text.push_str("\nmetrics:\n");
        text.push_str(&metrics);
        return full(StatusCode::OK, "text/plain; charset=utf-8", text);
    }
    full(StatusCode::OK, TEXT, metrics)
}

/// `d` to whole microseconds, for a readable log.
fn truncate_micros(d: Duration) -> Duration {
    Duration::from_micros(d.as_micros().try_into().unwrap_or(u64::MAX))
}

/// Runs `module` against `target` through the gate and the executor,
/// within `deadline` of `start`: the run's result, or the answer that the
/// gate is full (429) or the deadline passed in the queue (503). The run
/// takes its tenant's permit and CPU share as any run does, but runs on
/// this request's own thread ([`sonde_core::executor::Executor::run_here`]):
/// the request only waits for it, and the gate bounds how many there are.
async fn run(
    state: &ApiState,
    module: &ProbeSpec,
    target: &str,
    deadline: Duration,
    start: Instant,
) -> Result<RunResult, Response> {
    let limits = &state.limits;
    let left = deadline.saturating_sub(start.elapsed());
    let permit =
        match tokio::time::timeout(left, state.scrapes.enter(limits.max_probe_runs, limits.max_probe_queue)).await {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => {
                let mut r = error(StatusCode::TOO_MANY_REQUESTS, e.to_string());
                r.headers_mut()
                    .insert(http::header::RETRY_AFTER, http::HeaderValue::from_static("1"));
                return Err(r);
            }
            Err(_) => {
                return Err(error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "no /probe run slot came free within the deadline of {} (api: max_probe_runs)",
                        humantime::format_duration(deadline)
                    ),
                ));
            }
        };
    let mut limits = module.limits;
    limits.timeout = deadline.saturating_sub(start.elapsed()).max(Duration::from_millis(1));
    let call = Call {
        probe: &module.name,
        target,
        config: &module.config,
        limits,
        grants: &module.grants,
        attempt: 1,
        observe: true,
    };
    let result = state
        .metrics
        .executor
        .run_here(state.control.engine(), module, &call)
        .await;
    drop(permit);
    if let Some(t) = &state.tracing {
        t.probe_run(module, target, &result);
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deadline_is_the_scrape_timeout_less_a_margin_capped_by_the_module() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        assert_eq!(deadline(None, s(5)), s(5));
        assert_eq!(deadline(Some(s(10)), s(5)), s(5));
        assert_eq!(deadline(Some(s(3)), s(5)), ms(2500));
        assert_eq!(deadline(Some(ms(600)), s(5)), ms(300));
    }

    #[test]
    fn a_scrape_timeout_is_a_positive_number_of_seconds() {
        let mut h = HeaderMap::new();
        assert_eq!(scrape_timeout(&h), Ok(None));
        h.insert(SCRAPE_TIMEOUT_HEADER, "9.5".parse().unwrap());
        assert_eq!(scrape_timeout(&h), Ok(Some(Duration::from_millis(9500))));
        for bad in ["0", "-1", "NaN", "inf", "ten"] {
            h.insert(SCRAPE_TIMEOUT_HEADER, bad.parse().unwrap());
            let e = scrape_timeout(&h).unwrap_err().to_string();
            assert!(e.contains(bad), "{e}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_gate_queues_up_to_its_bound_then_refuses() {
        let gate = ScrapeGate::default();
        let first = gate.enter(1, 1).await.unwrap();
        let g = gate.clone();
        let waiting = tokio::spawn(async move { g.enter(1, 1).await.map(|_| ()) });
        while gate.counts().1 == 0 {
            tokio::task::yield_now().await;
        }
        assert!(matches!(
            gate.enter(1, 1).await,
            Err(GateError::Full { runs: 1, queue: 1 })
        ));
        drop(first);
        waiting.await.unwrap().unwrap();
        assert_eq!(gate.counts(), (0, 0));
    }
}
