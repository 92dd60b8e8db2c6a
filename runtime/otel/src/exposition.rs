//! The OpenMetrics text `/metrics` serves, read back into families: the
//! export sends what a scrape reads, so the two cannot disagree on a
//! series. Only what sonde's exposition holds is read: `HELP` and `TYPE`
//! lines, and samples of counters (`_total`), gauges and histograms
//! (`_bucket`, `_sum`, `_count`); anything else is an error that names the
//! line.

/// What a family measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A monotonic total (`_total`).
    Counter,
    /// A value that goes up and down.
    Gauge,
    /// Buckets, sum and count.
    Histogram,
}

/// One family: its name as `/metrics` declares it, its help, its points.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Family {
    pub name: String,
    pub kind: Kind,
    pub help: String,
    pub points: Vec<Point>,
}

/// One series of a family: its labels (in the order written) and value.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Point {
    pub labels: Vec<(String, String)>,
    pub value: Value,
}

/// A point's value.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Value {
    /// A counter's or gauge's.
    Number(f64),
    /// A histogram's: each bucket's upper bound with the cumulative count
    /// at or below it (the last is `+Inf`), the sum and the count.
    Histogram {
        buckets: Vec<(f64, u64)>,
        sum: f64,
        count: u64,
    },
}

/// A line that is not the exposition sonde writes.
#[derive(Debug, thiserror::Error)]
#[error("line {line}: {why}")]
pub(crate) struct ExpositionError {
    /// 1-based.
    pub line: usize,
    /// What is wrong with it.
    pub why: &'static str,
}

/// Reads `text` into its families, in order.
pub(crate) fn parse(text: &str) -> Result<Vec<Family>, ExpositionError> {
    let mut families: Vec<Family> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let fail = |why| ExpositionError { line: i + 1, why };
        if line.is_empty() || line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            family(&mut families, name).help = unescape(help);
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').ok_or_else(|| fail("a TYPE line without a type"))?;
            family(&mut families, name).kind = match kind {
                "counter" => Kind::Counter,
                "gauge" | "unknown" => Kind::Gauge,
                "histogram" => Kind::Histogram,
                _ => return Err(fail("a type other than counter, gauge and histogram")),
            };
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let (series, labels, value) = sample(line).ok_or_else(|| fail("not a sample"))?;
        let f = families.last_mut().ok_or_else(|| fail("a sample before any TYPE"))?;
        add(f, series, labels, value).map_err(fail)?;
    }
    Ok(families)
}

/// The family `name`, the last one (made when it is new).
fn family<'a>(families: &'a mut Vec<Family>, name: &str) -> &'a mut Family {
    if families.last().is_none_or(|f| f.name != name) {
        families.push(Family {
            name: name.to_string(),
            kind: Kind::Gauge,
            help: String::new(),
            points: Vec::new(),
        });
    }
    families.last_mut().expect("just pushed")
}

/// Puts one sample into `f`.
fn add(f: &mut Family, series: &str, mut labels: Vec<(String, String)>, value: f64) -> Result<(), &'static str> {
    let suffix = series
        .strip_prefix(f.name.as_str())
        .ok_or("a sample of another family")?;
    match (f.kind, suffix) {
        (Kind::Counter, "_total") | (Kind::Gauge, "") => {
            f.points.push(Point {
                labels,
                value: Value::Number(value),
            });
        }
        (Kind::Counter, "_created") => {}
        (Kind::Histogram, "_bucket" | "_sum" | "_count") => {
            let le = match suffix {
                "_bucket" => {
                    let at = labels
                        .iter()
                        .position(|(k, _)| k == "le")
                        .ok_or("a bucket without le")?;
                    let (_, le) = labels.remove(at);
                    Some(parse_value(&le).ok_or("a bucket whose le is not a number")?)
                }
                _ => None,
            };
            let point = match f.points.iter_mut().position(|p| p.labels == labels) {
                Some(at) => &mut f.points[at],
                None => {
                    f.points.push(Point {
                        labels,
                        value: Value::Histogram {
                            buckets: Vec::new(),
                            sum: 0.0,
                            count: 0,
                        },
                    });
                    f.points.last_mut().expect("just pushed")
                }
            };
            let Value::Histogram { buckets, sum, count } = &mut point.value else {
                return Err("a histogram sample of a number");
            };
            match (suffix, le) {
                ("_bucket", Some(le)) => buckets.push((le, value as u64)),
                ("_sum", _) => *sum = value,
                _ => *count = value as u64,
            }
        }
        _ => return Err("a sample its family's type does not have"),
    }
    Ok(())
}

/// A series' labels, in the order written.
type Labels = Vec<(String, String)>;

/// A sample line: its series name, labels and value (a timestamp after it
/// is left out).
fn sample(line: &str) -> Option<(&str, Labels, f64)> {
    let (series, rest) = match line.find(['{', ' ']) {
        Some(at) => line.split_at(at),
        None => return None,
    };
    let (labels, rest) = match rest.strip_prefix('{') {
        Some(inside) => labels(inside)?,
        None => (Vec::new(), rest),
    };
    let value = rest.split_whitespace().next()?;
    Some((series, labels, parse_value(value)?))
}

/// `a="x",b="y\"z"}` and what follows the `}`.
fn labels(mut text: &str) -> Option<(Labels, &str)> {
    let mut out = Vec::new();
    loop {
        if let Some(rest) = text.strip_prefix('}') {
            return Some((out, rest));
        }
        let (name, rest) = text.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        out.push((name.trim_start_matches(',').to_string(), value));
        text = rest[end + 1..].trim_start_matches(',');
    }
}

fn parse_value(text: &str) -> Option<f64> {
    match text {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        t => t.parse().ok(),
    }
}

/// A HELP text with its escapes (`\\`, `\n`) undone.
fn unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match (c, c == '\\') {
            (_, true) => match chars.next() {
                Some('n') => out.push('\n'),
                Some(other) => out.push(other),
                None => out.push('\\'),
            },
            (c, false) => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP sonde_build_info The build.\n\
# TYPE sonde_build_info gauge\n\
sonde_build_info{version=\"0.1.0\",commit=\"abc\"} 1\n\
# HELP sonde_probe_runs Runs, by status.\n\
# TYPE sonde_probe_runs counter\n\
sonde_probe_runs_total{probe=\"a \\\"quoted\\\" name\",status=\"success\"} 3\n\
sonde_probe_runs_created{probe=\"x\"} 1.7e9\n\
# HELP sonde_run_duration_seconds Durations.\n\
# TYPE sonde_run_duration_seconds histogram\n\
sonde_run_duration_seconds_sum{plugin=\"http\"} 0.5\n\
sonde_run_duration_seconds_count{plugin=\"http\"} 4\n\
sonde_run_duration_seconds_bucket{le=\"0.1\",plugin=\"http\"} 3\n\
sonde_run_duration_seconds_bucket{le=\"+Inf\",plugin=\"http\"} 4\n\
# EOF\n";

    #[test]
    fn the_three_kinds_are_read_with_their_labels() {
        let f = parse(TEXT).unwrap();
        assert_eq!(f.len(), 3);
        assert_eq!((f[0].name.as_str(), f[0].kind), ("sonde_build_info", Kind::Gauge));
        assert_eq!(f[0].points[0].labels[1], ("commit".into(), "abc".into()));
        assert_eq!(f[1].kind, Kind::Counter);
        assert_eq!(f[1].points.len(), 1, "_created is no point");
        assert_eq!(f[1].points[0].labels[0].1, "a \"quoted\" name");
        assert_eq!(f[1].points[0].value, Value::Number(3.0));
        assert_eq!(
            f[2].points,
            [Point {
                labels: vec![("plugin".into(), "http".into())],
                value: Value::Histogram {
                    buckets: vec![(0.1, 3), (f64::INFINITY, 4)],
                    sum: 0.5,
                    count: 4
                }
            }]
        );
    }

    #[test]
    fn lines_sonde_does_not_write_are_refused_by_number() {
        let e = parse("# TYPE x summary\n").unwrap_err();
        assert_eq!(e.line, 1);
        let e = parse("# TYPE x gauge\nx{a=\"unterminated} 1\n").unwrap_err();
        assert_eq!(e.line, 2);
        let e = parse("# TYPE x gauge\ny 1\n").unwrap_err();
        assert_eq!(e.why, "a sample of another family");
    }
}
