//! The comparison of one case's answers: sonde's against one release of
//! blackbox_exporter's, series by series.

use super::exporter::Release;
use std::collections::{BTreeMap, BTreeSet};

/// Labels whose values come from a fixed vocabulary: part of a series'
/// identity. The others (a certificate's subject…) are compared as values.
const VOCABULARY: [&str; 3] = ["phase", "serving_status", "version"];

/// Series whose values alert rules read: they must be equal.
const EQUAL: [&str; 24] = [
    "probe_success",
    "probe_icmp_reply_hop_limit",
    "probe_dns_query_succeeded",
    "probe_dns_answer_rrs",
    "probe_dns_authority_rrs",
    "probe_dns_additional_rrs",
    "probe_dns_serial",
    "probe_http_status_code",
    "probe_http_ssl",
    "probe_http_version",
    "probe_http_redirects",
    "probe_http_content_length",
    "probe_http_uncompressed_body_length",
    "probe_failed_due_to_regex",
    "probe_ssl_earliest_cert_expiry",
    "probe_ssl_last_chain_expiry_timestamp_seconds",
    "probe_ssl_last_chain_info",
    "probe_tls_version_info",
    "probe_tls_cipher_info",
    "probe_grpc_status_code",
    "probe_grpc_healthcheck_response",
    "probe_grpc_ssl",
    "probe_ip_protocol",
    "probe_ip_addr_hash",
];

/// Series that are times: sonde's is above 0 where blackbox's is, and
/// only there (a phase not reached is 0).
const TIMES: [&str; 5] = [
    "probe_http_duration_seconds",
    "probe_icmp_duration_seconds",
    "probe_dns_duration_seconds",
    "probe_grpc_duration_seconds",
    "probe_dns_lookup_time_seconds",
];

/// One sample: its name, labels and value.
type Sample = (String, BTreeMap<String, String>, f64);

/// Parses an answer in the text format (the subset both answer with).
fn samples(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let (series, value) = line.rsplit_once(' ').expect("a sample line");
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("value of {line:?}"));
        let (name, labels) = match series.split_once('{') {
            None => (series.to_string(), BTreeMap::new()),
            Some((name, rest)) => (name.to_string(), labels(rest.strip_suffix('}').expect("}"))),
        };
        out.push((name, labels, value));
    }
    out
}

/// `k="v",k2="v2"` with the text format's escapes.
fn labels(mut text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    while let Some((key, rest)) = text.split_once("=\"") {
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let mut end = rest.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => {}
                },
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        out.insert(key.trim_start_matches(',').to_string(), value);
        text = &rest[end..];
    }
    out
}

/// A series' identity: its name, label names and vocabulary values.
fn identity((name, labels, _): &Sample) -> String {
    let labels: Vec<String> = labels
        .iter()
        .map(|(k, v)| {
            if VOCABULARY.contains(&k.as_str()) {
                format!("{k}={v:?}")
            } else {
                k.clone()
            }
        })
        .collect();
    format!("{name}{{{}}}", labels.join(","))
}

/// A series with every label: the key its values are compared under.
fn full((name, labels, _): &Sample) -> String {
    format!("{name}{labels:?}")
}

/// What sonde answers that an older release does not, and the release
/// that first answers it: a series (no label), or a label of a series.
/// Left out of sonde's answer when it is compared with an older release.
const SINCE: [(&str, Option<&str>, Release); 3] = [
    ("probe_tls_cipher_info", None, Release::V028),
    ("probe_ssl_last_chain_info", Some("serialnumber"), Release::V028),
    ("probe_failed_due_to_bytes", None, Release::V028),
];

/// sonde's answer as `release` would give it: without sonde's own series
/// and what only later releases answer.
fn as_of(release: Release, sonde: &str) -> Vec<Sample> {
    let mut ours: Vec<Sample> = samples(sonde)
        .into_iter()
        .filter(|(n, _, _)| !n.starts_with("sonde_"))
        .collect();
    for (series, label, since) in SINCE {
        if release >= since {
            continue;
        }
        match label {
            None => ours.retain(|(n, _, _)| n != series),
            Some(label) => ours
                .iter_mut()
                .filter(|(n, _, _)| n == series)
                .for_each(|(_, labels, _)| drop(labels.remove(label))),
        }
    }
    ours
}

/// 0.23's answer `bb` without what later releases (and sonde, whose
/// answer is `ours`) stopped answering: a `probe_ssl_earliest_cert_expiry
/// 0` of a gRPC check without TLS (an expiry of 1970 fires every expiry
/// alert; gone in 0.26), and a `probe_failed_due_to_regex 0` of a tcp
/// check that could not connect (0.28 answers it once connected).
fn without_023_quirks(bb: &mut Vec<Sample>, ours: &[Sample]) {
    let has = |s: &[Sample], name: &str| s.iter().any(|(n, _, _)| n == name);
    if !has(ours, "probe_tls_version_info") && has(ours, "probe_grpc_ssl") {
        bb.retain(|(n, _, v)| !(n == "probe_ssl_earliest_cert_expiry" && *v == 0.0));
    }
    let failed = bb.iter().any(|(n, _, v)| n == "probe_success" && *v == 0.0);
    if failed && !has(bb, "probe_http_status_code") && !has(ours, "probe_failed_due_to_regex") {
        bb.retain(|(n, _, v)| !(n == "probe_failed_due_to_regex" && *v == 0.0));
    }
}

/// How sonde's answer differs from `release`'s for one case.
pub fn differences(release: Release, case: &str, blackbox: &str, sonde: &str) -> Vec<String> {
    let case = format!("{case} (blackbox_exporter {})", release.version());
    let mut bb = samples(blackbox);
    let ours = as_of(release, sonde);
    if release == Release::V023 {
        without_023_quirks(&mut bb, &ours);
    }
    let mut out = Vec::new();
    let ids = |s: &[Sample]| s.iter().map(identity).collect::<BTreeSet<_>>();
    let (theirs_ids, ours_ids) = (ids(&bb), ids(&ours));
    for missing in theirs_ids.difference(&ours_ids) {
        out.push(format!("{case}: sonde lacks {missing}"));
    }
    for extra in ours_ids.difference(&theirs_ids) {
        out.push(format!("{case}: sonde adds {extra}"));
    }
    out.extend(values_differ(&case, &bb, &ours));
    out
}

/// Where the values of series both answer differ: a series of [`EQUAL`]
/// of another value (or, for the leaf's facts, other labels), a time of
/// [`TIMES`] that one side timed and the other did not.
fn values_differ(case: &str, bb: &[Sample], ours: &[Sample]) -> Vec<String> {
    let ours_values: BTreeMap<String, f64> = ours.iter().map(|x| (full(x), x.2)).collect();
    let mut out = Vec::new();
    for sample in bb {
        let (name, _, value) = sample;
        if EQUAL.contains(&name.as_str()) {
            match ours_values.get(&full(sample)) {
                Some(v) if v == value => {}
                Some(v) => out.push(format!("{case}: {} is {v}, blackbox says {value}", full(sample))),
                None if name == "probe_ssl_last_chain_info" || name == "probe_tls_cipher_info" => {
                    let ours: Vec<String> = ours.iter().filter(|s| &s.0 == name).map(full).collect();
                    out.push(format!("{case}: blackbox's {} is not sonde's {ours:?}", full(sample)));
                }
                None => {}
            }
        }
        if TIMES.contains(&name.as_str())
            && let Some(v) = ours_values.get(&full(sample))
            && (*value > 0.0) != (*v > 0.0)
        {
            out.push(format!("{case}: {} is {v}, blackbox says {value}", full(sample)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_format_parses_with_escapes() {
        let s = samples("# HELP x y\nx{a=\"1\",b=\"q\\\"r\"} 2\ny 3.5e+09\n");
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].1.get("b").map(String::as_str), Some("q\"r"));
        assert_eq!(s[1].2, 3.5e9);
        assert_eq!(identity(&s[0]), "x{a,b}");
    }

    #[test]
    fn what_a_release_does_not_answer_is_left_out() {
        let sonde = "probe_tls_cipher_info{cipher=\"TLS_AES_128_GCM_SHA256\"} 1\n\
                     probe_ssl_last_chain_info{serialnumber=\"01\",subject=\"x\"} 1\nsonde_x 1\n";
        let old = as_of(Release::V023, sonde);
        assert_eq!(
            old.iter().map(identity).collect::<Vec<_>>(),
            ["probe_ssl_last_chain_info{subject}"]
        );
        let new = as_of(Release::V028, sonde);
        assert_eq!(
            new.iter().map(identity).collect::<Vec<_>>(),
            [
                "probe_tls_cipher_info{cipher}",
                "probe_ssl_last_chain_info{serialnumber,subject}"
            ]
        );
    }
}
