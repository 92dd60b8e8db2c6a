//! The histograms the scheduler's runs feed: run duration and fuel by
//! plugin and kind, and the scheduler's start lateness.

use super::*;

const LATENESS_BUCKETS: [f64; 12] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];
const DURATION_BUCKETS: [f64; 12] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];
const FUEL_BUCKETS: [f64; 8] = [1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10];

/// What the scheduler's runs feed: the histograms. Give it to the
/// scheduler as its [`Observer`].
#[derive(Debug)]
pub struct RunMetrics {
    pub(super) lateness: Histogram,
    /// By plugin, then kind (startup, readiness, liveness): looked up by
    /// `&str` on every run, with no allocation.
    pub(super) by_plugin: RwLock<HashMap<Arc<str>, [PluginSeries; 3]>>,
}

/// Which histogram of a plugin's series a descriptor exposes.
pub(super) type Pick = fn(&PluginSeries) -> &Histogram;

#[derive(Debug)]
pub(super) struct PluginSeries {
    /// Observed at least once (unused kinds are not exposed).
    pub(super) used: std::sync::atomic::AtomicBool,
    pub(super) duration: Histogram,
    pub(super) fuel: Histogram,
}

impl Default for RunMetrics {
    fn default() -> Self {
        Self {
            lateness: Histogram::new(LATENESS_BUCKETS),
            by_plugin: RwLock::default(),
        }
    }
}

pub(super) const KINDS: [Kind; 3] = [Kind::Startup, Kind::Readiness, Kind::Liveness];

fn kind_index(kind: Kind) -> usize {
    KINDS.iter().position(|k| *k == kind).unwrap_or(0)
}

impl Observer for RunMetrics {
    fn run_started(&self, _spec: &ProbeSpec, late: Duration) {
        self.lateness.observe(late.as_secs_f64());
    }

    fn run_finished(&self, spec: &ProbeSpec, result: &RunResult) {
        let observe = |s: &PluginSeries| {
            s.used.store(true, std::sync::atomic::Ordering::Relaxed);
            s.duration.observe(result.duration.as_secs_f64());
            s.fuel.observe(result.fuel_consumed as f64);
        };
        let kind = kind_index(spec.kind);
        if let Some(s) = self
            .by_plugin
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(spec.plugin_ref.as_str())
        {
            return observe(&s[kind]);
        }
        let mut map = self.by_plugin.write().unwrap_or_else(|e| e.into_inner());
        let series = map.entry(Arc::from(spec.plugin_ref.as_str())).or_insert_with(|| {
            std::array::from_fn(|_| PluginSeries {
                used: Default::default(),
                duration: Histogram::new(DURATION_BUCKETS),
                fuel: Histogram::new(FUEL_BUCKETS),
            })
        });
        observe(&series[kind]);
    }
}
