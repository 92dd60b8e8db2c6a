//! A `/metrics` family's name under OpenTelemetry's conventions: a dotted
//! namespace (`sonde.<subsystem>.<what>`), the unit out of the name and in
//! the metric's `unit` (UCUM: `s`, `By`; a counter counts `{things}`), no
//! `_total`. The rule is one function, so a family added to `/metrics` is
//! exported without a table to update, and it is the inverse of how
//! Prometheus names what it receives over OTLP (dots to underscores, the
//! unit's suffix, `_total` on a monotonic sum): a series reads the same in
//! Prometheus whether it was scraped or pushed.

use crate::exposition::Kind;

/// A family's OpenTelemetry name and unit.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Named {
    pub name: String,
    pub unit: String,
}

/// Name suffixes that are units, with their UCUM code.
const UNITS: [(&str, &str); 2] = [("_seconds", "s"), ("_bytes", "By")];

/// The names of `families` (name, kind), in order: each as [`named`]
/// says, but where two would share a name (`…_pull_bytes` and
/// `…_pull_seconds` both `….pull`), those keep their unit's word in the
/// name, which Prometheus then adds no second time.
pub(crate) fn named_all<'a>(families: impl Iterator<Item = (&'a str, Kind)> + Clone) -> Vec<Named> {
    let first: Vec<Named> = families.clone().map(|(f, k)| named(f, k)).collect();
    families
        .zip(&first)
        .map(|((family, _), n)| {
            let unit_word = UNITS
                .iter()
                .find_map(|(suffix, _)| family.ends_with(suffix).then(|| &suffix[1..]))
                .filter(|_| first.iter().filter(|o| o.name == n.name).count() > 1);
            Named {
                name: unit_word.map_or_else(|| n.name.clone(), |word| format!("{}_{word}", n.name)),
                unit: n.unit.clone(),
            }
        })
        .collect()
}

/// `family`'s OpenTelemetry name and unit (see the module's documentation).
pub(crate) fn named(family: &str, kind: Kind) -> Named {
    let (stem, unit) = UNITS
        .iter()
        .find_map(|(suffix, ucum)| Some((family.strip_suffix(suffix)?, ucum.to_string())))
        .unwrap_or((family, String::new()));
    let unit = match (kind, unit.is_empty()) {
        // What a counter without a unit counts: its last word, as a UCUM
        // annotation (`{runs}`), which names no unit and so no suffix.
        (Kind::Counter, true) => format!("{{{}}}", stem.rsplit('_').next().unwrap_or(stem)),
        _ => unit,
    };
    // `sonde_probe_last_duration` -> `sonde.probe.last_duration`: the
    // first two words are the namespace.
    let mut words = stem.splitn(3, '_');
    let name = match (words.next(), words.next(), words.next()) {
        (Some(a), Some(b), Some(rest)) => format!("{a}.{b}.{rest}"),
        (Some(a), Some(b), None) => format!("{a}.{b}"),
        _ => stem.to_string(),
    };
    Named { name, unit }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(family: &str, kind: Kind) -> (String, String) {
        let Named { name, unit } = named(family, kind);
        (name, unit)
    }

    #[test]
    fn names_are_dotted_with_the_unit_apart() {
        let s = |a: &str, b: &str| (a.to_string(), b.to_string());
        assert_eq!(n("sonde_probe_runs", Kind::Counter), s("sonde.probe.runs", "{runs}"));
        assert_eq!(
            n("sonde_run_duration_seconds", Kind::Histogram),
            s("sonde.run.duration", "s")
        );
        assert_eq!(
            n("sonde_probe_last_duration_seconds", Kind::Gauge),
            s("sonde.probe.last_duration", "s")
        );
        assert_eq!(
            n("sonde_pool_idle_resident_bytes", Kind::Gauge),
            s("sonde.pool.idle_resident", "By")
        );
        assert_eq!(n("sonde_build_info", Kind::Gauge), s("sonde.build.info", ""));
        assert_eq!(
            n("sonde_tenant_sandbox_seconds", Kind::Counter),
            s("sonde.tenant.sandbox", "s")
        );
    }

    #[test]
    fn names_that_would_collide_keep_their_unit_word() {
        let all = named_all(
            [
                ("sonde_tenant_oci_pull_bytes", Kind::Counter),
                ("sonde_tenant_oci_pull_seconds", Kind::Counter),
                ("sonde_tenant_runs", Kind::Counter),
            ]
            .into_iter(),
        );
        let got: Vec<(&str, &str)> = all.iter().map(|n| (n.name.as_str(), n.unit.as_str())).collect();
        assert_eq!(
            got,
            [
                ("sonde.tenant.oci_pull_bytes", "By"),
                ("sonde.tenant.oci_pull_seconds", "s"),
                ("sonde.tenant.runs", "{runs}")
            ]
        );
    }

    /// Prometheus's own translation of an OTLP metric's name (dots to
    /// underscores; the unit's word added unless the name ends with it;
    /// `_total` on a counter) gives back the family's name as `/metrics`
    /// exposes it.
    #[test]
    fn prometheus_reads_back_the_exposed_names() {
        let prometheus = |named: &Named, kind: Kind| {
            let mut name = named.name.replace('.', "_");
            let word = match named.unit.as_str() {
                "s" => "seconds",
                "By" => "bytes",
                _ => "",
            };
            if !word.is_empty() && !name.ends_with(word) {
                name = format!("{name}_{word}");
            }
            if kind == Kind::Counter {
                name.push_str("_total");
            }
            name
        };
        for (family, kind, exposed) in [
            ("sonde_probe_runs", Kind::Counter, "sonde_probe_runs_total"),
            ("sonde_tenant_fuel", Kind::Counter, "sonde_tenant_fuel_total"),
            (
                "sonde_tenant_sandbox_seconds",
                Kind::Counter,
                "sonde_tenant_sandbox_seconds_total",
            ),
            (
                "sonde_run_duration_seconds",
                Kind::Histogram,
                "sonde_run_duration_seconds",
            ),
            ("sonde_probe_state", Kind::Gauge, "sonde_probe_state"),
            (
                "sonde_config_last_reload_success_timestamp_seconds",
                Kind::Gauge,
                "sonde_config_last_reload_success_timestamp_seconds",
            ),
        ] {
            assert_eq!(prometheus(&named(family, kind), kind), exposed, "{family}");
        }
    }
}
