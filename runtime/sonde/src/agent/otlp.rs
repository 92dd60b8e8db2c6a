//! The OTLP export's three steps in the agent's start: the scheduler's
//! observer (the run tracer when traces are on), the counters `/metrics`
//! reads, and the export itself once the metrics exist.

use super::AgentError;
use sonde_core::auth::Principal;
use sonde_core::catalog::otlp::OtlpSettings;
use sonde_core::metrics::{Metrics, OtlpExports, RunMetrics};
use sonde_core::scheduler::Observer;
use sonde_otel::{Exporter, RunTracer, Source, Stats};
use std::sync::Arc;
use std::time::SystemTime;

/// What the OTLP export needs from the start on: its counters, which hold
/// the run tracer when traces are on.
pub(super) struct Otlp {
    settings: Option<OtlpSettings>,
    stats: Arc<Stats>,
}

impl Otlp {
    /// For `settings` (none: nothing is exported), the runs feeding
    /// `histograms`.
    pub(super) fn new(settings: Option<OtlpSettings>, histograms: &Arc<RunMetrics>) -> Self {
        let tracer = settings
            .as_ref()
            .and_then(|o| o.traces)
            .map(|t| Arc::new(RunTracer::new(histograms.clone(), t.success_ratio)));
        Self {
            settings,
            stats: Arc::new(Stats::new(tracer)),
        }
    }

    /// The scheduler's observer: the tracer (which feeds `histograms`
    /// too), or `histograms` alone.
    pub(super) fn observer(&self, histograms: &Arc<RunMetrics>) -> Arc<dyn Observer> {
        match self.stats.tracer() {
            Some(t) => t.clone(),
            None => histograms.clone(),
        }
    }

    /// What `/metrics` reads of the export.
    pub(super) fn counters(&self) -> Arc<dyn Fn() -> OtlpExports + Send + Sync> {
        match self.settings {
            Some(_) => {
                let stats = self.stats.clone();
                Arc::new(move || stats.snapshot())
            }
            None => Arc::new(Default::default),
        }
    }

    /// Starts the export of `metrics`, when `otlp:` is set.
    pub(super) fn start(self, metrics: &Metrics) -> Result<Option<Exporter>, AgentError> {
        let Some(settings) = &self.settings else {
            return Ok(None);
        };
        let m = metrics.clone();
        let source: Source = Arc::new(move || m.encode(&Principal::Operator));
        Exporter::spawn(settings, source, SystemTime::now(), self.stats)
            .map(Some)
            .map_err(|source| AgentError::Otlp { source })
    }
}
