//! The OTLP exports' three steps in the agent's start: the scheduler's
//! observer (the runs' tracing when an export traces), the counters
//! `/metrics` reads, and the exports themselves once the metrics exist.
//!
//! There is one export per `otlp:` block: the operator's (top level),
//! which sends every series of the operator's `/metrics` and every
//! tenant's spans; and one per tenant whose `tenants:` entry has one,
//! which sends what that tenant's own scrape of `/metrics` shows and its
//! own runs' spans, each export from its own queue and counters.

use super::AgentError;
use sonde_core::auth::Principal;
use sonde_core::catalog::otlp::{Exports, OtlpSettings};
use sonde_core::metrics::{Metrics, OtlpExports, RunMetrics};
use sonde_core::scheduler::Observer;
use sonde_otel::{Exporter, RunTracer, Source, Stats, Tracing};
use sonde_policy::reach::OwnListeners;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

/// One `otlp:` block and its counters, which hold its runs' tracer when it
/// traces.
struct Export {
    settings: OtlpSettings,
    stats: Arc<Stats>,
}

impl Export {
    fn new(settings: OtlpSettings) -> Self {
        let tracer = settings.traces.map(|t| Arc::new(RunTracer::new(t.success_ratio)));
        Self {
            settings,
            stats: Arc::new(Stats::new(tracer)),
        }
    }

    fn tenant(&self) -> Option<Arc<str>> {
        self.settings.tenant.as_ref().map(|t| t.id.clone())
    }
}

/// What the OTLP exports need from the start on.
pub(super) struct Otlp {
    exports: Vec<Export>,
}

impl Otlp {
    /// For the file's `otlp:` blocks (none: nothing is exported).
    pub(super) fn new(exports: Exports) -> Self {
        Self {
            exports: exports
                .operator
                .into_iter()
                .chain(exports.tenants)
                .map(Export::new)
                .collect(),
        }
    }

    /// The scheduler's observer: the runs' tracing (which feeds
    /// `histograms` too) when an export traces, else `histograms` alone;
    /// and the tracing, for `/probe`'s runs.
    pub(super) fn observer(&self, histograms: &Arc<RunMetrics>) -> (Arc<dyn Observer>, Option<Arc<Tracing>>) {
        let mut operator = None;
        let mut tenants = HashMap::new();
        for e in &self.exports {
            let Some(tracer) = e.stats.tracer() else {
                continue;
            };
            match e.tenant() {
                None => operator = Some(tracer.clone()),
                Some(id) => {
                    tenants.insert(id.to_string(), tracer.clone());
                }
            }
        }
        if operator.is_none() && tenants.is_empty() {
            return (histograms.clone(), None);
        }
        let tracing = Arc::new(Tracing::new(histograms.clone(), operator, tenants));
        (tracing.clone(), Some(tracing))
    }

    /// What `/metrics` reads of the exports.
    pub(super) fn counters(&self) -> Arc<dyn Fn() -> Vec<OtlpExports> + Send + Sync> {
        let stats: Vec<(Option<Arc<str>>, Arc<Stats>)> =
            self.exports.iter().map(|e| (e.tenant(), e.stats.clone())).collect();
        Arc::new(move || {
            stats
                .iter()
                .map(|(tenant, s)| OtlpExports {
                    tenant: tenant.clone(),
                    ..s.snapshot()
                })
                .collect()
        })
    }

    /// Starts each export of `metrics`; a tenant's never connects to
    /// `listeners`, the agent's own.
    pub(super) fn start(self, metrics: &Metrics, listeners: &Arc<OwnListeners>) -> Result<Vec<Exporter>, AgentError> {
        let started = SystemTime::now();
        let mut running = Vec::with_capacity(self.exports.len());
        for e in self.exports {
            let m = metrics.clone();
            let who = e.tenant().map_or(Principal::Operator, Principal::Tenant);
            let source: Source = Arc::new(move || m.encode(&who));
            let exporter = Exporter::spawn(&e.settings, source, started, e.stats, listeners)
                .map_err(|source| AgentError::Otlp { source })?;
            running.push(exporter);
        }
        Ok(running)
    }
}
