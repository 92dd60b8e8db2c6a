//! `/metrics`' families as one OTLP export request: counters as
//! cumulative monotonic sums, gauges as gauges, histograms as cumulative
//! explicit-bucket histograms with the same bounds, every label an
//! attribute, under the names of [`crate::names`].

pub(crate) use crate::attributes::attribute;
use crate::exposition::{Family, Kind, Value};
use crate::names::{Named, named_all};
use crate::traces::Exemplar;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint, ResourceMetrics,
    ScopeMetrics, Sum, exemplar, metric::Data, number_data_point,
};

/// When the cumulative series began (the agent's start) and when they
/// were read, in nanoseconds since the Unix epoch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Times {
    pub start: u64,
    pub now: u64,
}

/// A family's and a series' labels: the run that is its exemplar, if any.
pub(crate) type Exemplars<'a> = &'a dyn Fn(&str, &[(String, String)]) -> Option<Exemplar>;

/// The request that sends `families` from the agent described by
/// `resource`, each histogram point with the exemplar `exemplars` gives.
pub(crate) fn request(
    families: &[Family],
    resource: &[KeyValue],
    times: Times,
    exemplars: Exemplars<'_>,
) -> ExportMetricsServiceRequest {
    let names = named_all(families.iter().map(|f| (f.name.as_str(), f.kind)));
    let metrics = families
        .iter()
        .zip(names)
        .filter_map(|(f, named)| metric(f, named, times, exemplars))
        .collect();
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: crate::attributes::resource(resource),
            scope_metrics: vec![ScopeMetrics {
                scope: crate::attributes::scope(),
                metrics,
                ..ScopeMetrics::default()
            }],
            ..ResourceMetrics::default()
        }],
    }
}

/// One family as a metric named `named`; `None` when it has no point to
/// send.
fn metric(f: &Family, named: Named, times: Times, exemplars: Exemplars<'_>) -> Option<Metric> {
    if f.points.is_empty() {
        return None;
    }
    let attributes = |labels: &[(String, String)]| labels.iter().map(|(k, v)| attribute(k, v)).collect::<Vec<_>>();
    let numbers = || {
        f.points
            .iter()
            .filter_map(|p| match p.value {
                Value::Number(v) => Some(NumberDataPoint {
                    attributes: attributes(&p.labels),
                    start_time_unix_nano: times.start,
                    time_unix_nano: times.now,
                    value: Some(number_data_point::Value::AsDouble(v)),
                    ..NumberDataPoint::default()
                }),
                Value::Histogram { .. } => None,
            })
            .collect()
    };
    let data = match f.kind {
        Kind::Counter => Data::Sum(Sum {
            data_points: numbers(),
            aggregation_temporality: AggregationTemporality::Cumulative as i32,
            is_monotonic: true,
        }),
        Kind::Gauge => Data::Gauge(Gauge { data_points: numbers() }),
        Kind::Histogram => Data::Histogram(Histogram {
            data_points: f
                .points
                .iter()
                .filter_map(|p| {
                    let mut point = histogram_point(attributes(&p.labels), &p.value, times)?;
                    point
                        .exemplars
                        .extend(exemplars(&f.name, &p.labels).map(|e| exemplar_of(&e)));
                    Some(point)
                })
                .collect(),
            aggregation_temporality: AggregationTemporality::Cumulative as i32,
        }),
    };
    Some(Metric {
        name: named.name,
        description: f.help.clone(),
        unit: named.unit,
        data: Some(data),
        ..Metric::default()
    })
}

/// A traced run as an OTLP exemplar.
fn exemplar_of(e: &Exemplar) -> opentelemetry_proto::tonic::metrics::v1::Exemplar {
    opentelemetry_proto::tonic::metrics::v1::Exemplar {
        time_unix_nano: e.at,
        span_id: e.span_id.to_vec(),
        trace_id: e.trace_id.to_vec(),
        value: Some(exemplar::Value::AsDouble(e.seconds)),
        ..Default::default()
    }
}

/// Prometheus's cumulative buckets as OTLP's: a count per bucket, the
/// bounds without `+Inf`.
fn histogram_point(attributes: Vec<KeyValue>, value: &Value, times: Times) -> Option<HistogramDataPoint> {
    let Value::Histogram { buckets, sum, count } = value else {
        return None;
    };
    let mut explicit_bounds = Vec::with_capacity(buckets.len());
    let mut bucket_counts = Vec::with_capacity(buckets.len() + 1);
    let mut below = 0;
    for &(le, cumulative) in buckets {
        bucket_counts.push(cumulative.saturating_sub(below));
        below = cumulative;
        if le.is_finite() {
            explicit_bounds.push(le);
        }
    }
    if buckets.last().is_none_or(|(le, _)| le.is_finite()) {
        // No +Inf bucket written: what the count holds past the last bound.
        bucket_counts.push(count.saturating_sub(below));
    }
    Some(HistogramDataPoint {
        attributes,
        start_time_unix_nano: times.start,
        time_unix_nano: times.now,
        count: *count,
        sum: Some(*sum),
        bucket_counts,
        explicit_bounds,
        ..HistogramDataPoint::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exposition::parse;

    #[test]
    fn each_kind_becomes_its_otlp_data() {
        let text = "# HELP sonde_probe_runs Runs.\n# TYPE sonde_probe_runs counter\n\
                    sonde_probe_runs_total{probe=\"web\"} 7\n\
                    # TYPE sonde_probe_state gauge\nsonde_probe_state{state=\"success\"} 1\n\
                    # TYPE sonde_run_duration_seconds histogram\n\
                    sonde_run_duration_seconds_bucket{le=\"0.1\"} 2\n\
                    sonde_run_duration_seconds_bucket{le=\"1.0\"} 5\n\
                    sonde_run_duration_seconds_bucket{le=\"+Inf\"} 6\n\
                    sonde_run_duration_seconds_sum 3.5\nsonde_run_duration_seconds_count 6\n\
                    # TYPE sonde_empty gauge\n";
        let times = Times { start: 1, now: 2 };
        let run = Exemplar {
            trace_id: [7; 16],
            span_id: [9; 8],
            seconds: 0.004,
            at: 3,
        };
        let exemplars =
            |family: &str, _: &[(String, String)]| (family == "sonde_run_duration_seconds").then(|| run.clone());
        let r = request(
            &parse(text).unwrap(),
            &[attribute("service.name", "sonde")],
            times,
            &exemplars,
        );
        let metrics = &r.resource_metrics[0].scope_metrics[0].metrics;
        assert_eq!(metrics.len(), 3, "a family without points is left out");
        assert_eq!(
            (metrics[0].name.as_str(), metrics[0].unit.as_str()),
            ("sonde.probe.runs", "{runs}")
        );
        let Some(Data::Sum(sum)) = &metrics[0].data else {
            panic!("{:?}", metrics[0])
        };
        assert!(sum.is_monotonic);
        assert_eq!(sum.data_points[0].value, Some(number_data_point::Value::AsDouble(7.0)));
        assert_eq!(sum.data_points[0].attributes, [attribute("probe", "web")]);
        assert!(matches!(&metrics[1].data, Some(Data::Gauge(_))));
        let Some(Data::Histogram(h)) = &metrics[2].data else {
            panic!("{:?}", metrics[2])
        };
        let p = &h.data_points[0];
        assert_eq!(p.explicit_bounds, [0.1, 1.0]);
        assert_eq!(p.bucket_counts, [2, 3, 1]);
        assert_eq!((p.count, p.sum), (6, Some(3.5)));
        assert_eq!((p.start_time_unix_nano, p.time_unix_nano), (1, 2));
        assert_eq!(p.exemplars.len(), 1);
        assert_eq!(p.exemplars[0].trace_id, [7; 16]);
    }
}
