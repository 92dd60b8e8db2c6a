//! The icmp and dns probers beside each release of blackbox_exporter: the
//! same targets (loopback for icmp, a dnsmasq for dns), the same modules,
//! and the answers compared as `blackbox/` compares http, tcp and grpc.

use crate::blackbox::{Blackbox, Case, OP, compare};
use crate::support::{secret, start_agent};
use sonde_tests::dns::{RECORDS, RESPONSE, Responder, ZONE, dnsmasq_with, reply};
use sonde_tests::tools::ping_sockets;

#[tokio::test]
async fn icmp_and_dns_answer_the_series_blackbox_exporter_answers() {
    if !ping_sockets() {
        return;
    }
    let Some(dns) = dnsmasq_with(RECORDS) else {
        return;
    };
    let Some(zone) = dnsmasq_with(ZONE) else {
        return;
    };
    // A server that answers every query SERVFAIL.
    let servfail = Responder::answering(|q| reply(q, RESPONSE | 2, [0, 0, 0], &[])).await;
    let dir = tempfile::tempdir().unwrap();
    let bb_config = r#"modules:
  icmp: { prober: icmp, timeout: 2s }
  icmp4: { prober: icmp, timeout: 2s, icmp: { preferred_ip_protocol: ip4 } }
  icmp_short: { prober: icmp, timeout: 1s, icmp: { preferred_ip_protocol: ip4 } }
  dns_a: { prober: dns, timeout: 2s, dns: { query_name: a.example.test, query_type: A } }
  dns_nx: { prober: dns, timeout: 2s, dns: { query_name: nothing.example.test, query_type: A } }
  dns_nx_ok: { prober: dns, timeout: 2s, dns: { query_name: nothing.example.test, query_type: A, valid_rcodes: [NXDOMAIN] } }
  dns_refused: { prober: dns, timeout: 2s, dns: { query_name: elsewhere.invalid, query_type: A } }
  dns_mx: { prober: dns, timeout: 2s, dns: { query_name: example.test, query_type: MX } }
  dns_match: { prober: dns, timeout: 2s, dns: { query_name: a.example.test, query_type: A, validate_answer_rrs: { fail_if_not_matches_regexp: ["192\\.0\\.2\\.1$"] } } }
  dns_nomatch: { prober: dns, timeout: 2s, dns: { query_name: a.example.test, query_type: A, validate_answer_rrs: { fail_if_matches_regexp: ["192\\.0\\.2\\.1$"] } } }
  dns_all: { prober: dns, timeout: 2s, dns: { query_name: a.example.test, query_type: A, validate_answer_rrs: { fail_if_all_match_regexp: ["^nothing"] } } }
  dns_soa: { prober: dns, timeout: 2s, dns: { query_name: zone.test, query_type: SOA } }
  dns_tcp: { prober: dns, timeout: 2s, dns: { query_name: a.example.test, query_type: A, transport_protocol: tcp } }
  dns_txt: { prober: dns, timeout: 2s, dns: { query_name: spf.example.test, query_type: TXT, validate_answer_rrs: { fail_if_not_matches_regexp: ['^spf\.example\.test\.\t[0-9]+\tIN\tTXT\t"v=spf1 -all" "second string"$'] } } }
  dns_txt_unquoted: { prober: dns, timeout: 2s, dns: { query_name: spf.example.test, query_type: TXT, validate_answer_rrs: { fail_if_not_matches_regexp: ['TXT\tv=spf1'] } } }
"#;
    let exporters = Blackbox::start_each(dir.path(), bb_config).await;
    if exporters.is_empty() {
        return;
    }
    secret(dir.path(), "op.token", OP);
    // 198.51.100.7 (TEST-NET-2) answers no echo here.
    let grants = r#"grants: { net: ["127.0.0.1:*", "[::1]:*", "198.51.100.7:*"] }"#;
    let sonde_config = dir.path().join("sonde.yaml");
    std::fs::write(
        &sonde_config,
        format!(
            r#"operator_token_file: op.token
modules:
  icmp: {{ plugin: icmp, timeout: 2s, {grants} }}
  icmp4: {{ plugin: icmp, timeout: 2s, config: {{ preferred_ip_protocol: ip4 }}, {grants} }}
  icmp_short: {{ plugin: icmp, timeout: 1s, config: {{ preferred_ip_protocol: ip4 }}, {grants} }}
  dns_a: {{ plugin: dns, timeout: 2s, config: {{ query_name: a.example.test, query_type: A }}, {grants} }}
  dns_nx: {{ plugin: dns, timeout: 2s, config: {{ query_name: nothing.example.test, query_type: A }}, {grants} }}
  dns_nx_ok: {{ plugin: dns, timeout: 2s, config: {{ query_name: nothing.example.test, query_type: A, valid_rcodes: [NXDOMAIN] }}, {grants} }}
  dns_refused: {{ plugin: dns, timeout: 2s, config: {{ query_name: elsewhere.invalid, query_type: A }}, {grants} }}
  dns_mx: {{ plugin: dns, timeout: 2s, config: {{ query_name: example.test, query_type: MX }}, {grants} }}
  dns_match: {{ plugin: dns, timeout: 2s, config: {{ query_name: a.example.test, query_type: A, validate_answer_rrs: {{ fail_if_not_matches_regexp: ["192\\.0\\.2\\.1$"] }} }}, {grants} }}
  dns_nomatch: {{ plugin: dns, timeout: 2s, config: {{ query_name: a.example.test, query_type: A, validate_answer_rrs: {{ fail_if_matches_regexp: ["192\\.0\\.2\\.1$"] }} }}, {grants} }}
  dns_all: {{ plugin: dns, timeout: 2s, config: {{ query_name: a.example.test, query_type: A, validate_answer_rrs: {{ fail_if_all_match_regexp: ["^nothing"] }} }}, {grants} }}
  dns_soa: {{ plugin: dns, timeout: 2s, config: {{ query_name: zone.test, query_type: SOA }}, {grants} }}
  dns_tcp: {{ plugin: dns, timeout: 2s, config: {{ query_name: a.example.test, query_type: A, transport_protocol: tcp }}, {grants} }}
  dns_txt: {{ plugin: dns, timeout: 2s, config: {{ query_name: spf.example.test, query_type: TXT, validate_answer_rrs: {{ fail_if_not_matches_regexp: ['^spf\.example\.test\.\t[0-9]+\tIN\tTXT\t"v=spf1 -all" "second string"$'] }} }}, {grants} }}
  dns_txt_unquoted: {{ plugin: dns, timeout: 2s, config: {{ query_name: spf.example.test, query_type: TXT, validate_answer_rrs: {{ fail_if_not_matches_regexp: ['TXT\tv=spf1'] }} }}, {grants} }}
"#
        ),
    )
    .unwrap();
    let (_agent, api) = start_agent(&sonde_config).await;

    let (server, soa) = (dns.addr.to_string(), zone.addr.to_string());
    let closed = sonde_tests::closed_port();
    let cases: Vec<(&str, &str, String)> = vec![
        ("icmp 127.0.0.1", "icmp", "127.0.0.1".into()),
        ("icmp ::1", "icmp", "::1".into()),
        ("icmp ip4 preferred", "icmp4", "127.0.0.1".into()),
        ("icmp no reply", "icmp_short", "198.51.100.7".into()),
        ("dns NOERROR", "dns_a", server.clone()),
        ("dns NXDOMAIN", "dns_nx", server.clone()),
        ("dns NXDOMAIN valid", "dns_nx_ok", server.clone()),
        ("dns REFUSED", "dns_refused", server.clone()),
        ("dns SERVFAIL", "dns_a", servfail.addr.to_string()),
        ("dns MX", "dns_mx", server.clone()),
        ("dns validation passes", "dns_match", server.clone()),
        ("dns validation fails", "dns_nomatch", server.clone()),
        ("dns fail_if_all_match", "dns_all", server.clone()),
        ("dns SOA serial", "dns_soa", soa),
        ("dns over TCP", "dns_tcp", server.clone()),
        ("dns TXT, quoted as blackbox quotes it", "dns_txt", server.clone()),
        (
            "dns TXT, a regex without the quotes",
            "dns_txt_unquoted",
            server.clone(),
        ),
        ("dns no server", "dns_a", format!("127.0.0.1:{}", closed.port())),
    ];
    let cases: Vec<Case> = cases
        .into_iter()
        .map(|(case, module, target)| (case, module, module, target))
        .collect();
    compare(&exporters, api, &cases).await;
}
