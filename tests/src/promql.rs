//! What a PromQL expression reads, for the tests that check every query
//! of the shipped dashboard and alert rules against what an agent exposes.

/// The metric names a PromQL expression reads: its identifiers, less
/// functions, keywords, label matchers, grouping clauses and strings.
pub fn names(expr: &str) -> Vec<String> {
    let mut cleaned = String::new();
    let mut depth = 0;
    let mut quoted = false;
    for c in expr.chars() {
        match c {
            '"' => quoted = !quoted,
            '{' | '[' if !quoted => depth += 1,
            '}' | ']' if !quoted => depth -= 1,
            _ if quoted || depth > 0 => {}
            c => cleaned.push(c),
        }
    }
    let keywords = [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "offset",
        "and",
        "or",
        "unless",
    ];
    // Aggregations, which may have their `by (...)` before their operand.
    let aggregations = [
        "sum",
        "min",
        "max",
        "avg",
        "count",
        "group",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
    ];
    let mut names = Vec::new();
    let mut rest = cleaned.as_str();
    let mut grouping = false;
    while let Some(start) = rest.find(|c: char| c.is_ascii_alphabetic() || c == '_') {
        let before = &rest[..start];
        let tail = &rest[start..];
        let len = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(tail.len());
        let word = &tail[..len];
        rest = &tail[len..];
        // A number's exponent or a duration's unit (1e3, 5m).
        if before.ends_with(|c: char| c.is_ascii_digit() || c == '.') {
            continue;
        }
        let call = rest.trim_start().starts_with('(');
        if keywords.contains(&word) {
            // `by (le, plugin)`: label names follow.
            grouping = call && ["by", "without", "on", "ignoring", "group_left", "group_right"].contains(&word);
            continue;
        }
        if grouping {
            if before.contains(')') {
                grouping = false;
            } else {
                continue;
            }
        }
        if !call && !aggregations.contains(&word) {
            names.push(word.to_string());
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promql_names_are_the_metrics_an_expression_reads() {
        assert_eq!(
            names(
                r#"histogram_quantile(0.99, sum by (le, plugin) (rate(sonde_run_duration_seconds_bucket{instance=~"$i"}[5m])))"#
            ),
            ["sonde_run_duration_seconds_bucket"]
        );
        assert_eq!(
            names(r#"time() - max(a_seconds{x="y"}) / on (job) b_total > 1e3"#),
            ["a_seconds", "b_total"]
        );
    }
}
