//! The alert rules users run on blackbox_exporter's series, evaluated by a
//! real Prometheus that scrapes each release of blackbox_exporter (Debian's
//! 0.23, and 0.28) and sonde on the same targets with the same modules:
//! each rule must fire for the same targets on sonde as on each release. The rules are the shipped `deploy/prometheus/rules.yaml`
//! (read as shipped) and the usual blackbox_exporter rules (probe failed,
//! slow probe, HTTP status of 400 and over, certificate expiring and
//! expired), with thresholds scaled to the test's targets.

use crate::blackbox::Blackbox;
use crate::support::{repo, secret, start_agent, tool};
use sonde_tests::{HttpServer, TestCert, closed_port};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};

const OP: &str = "operator-secret";

/// The usual blackbox_exporter alerts, as their users write them; the slow
/// probe's threshold is 0.15 s (the target's slow answer takes 0.2 s) where
/// users write 1 s, and the slow ping's 1 µs (a loopback echo takes more,
/// an echo never answered counts 0) where users write 1 s.
const COMMON_RULES: &str = r#"groups:
  - name: blackbox-common
    rules:
      - alert: ProbeFailed
        expr: probe_success == 0
      - alert: SlowProbe
        expr: avg_over_time(probe_duration_seconds[1m]) > 0.15
      - alert: HttpStatusCode
        expr: probe_http_status_code <= 199 OR probe_http_status_code >= 400
      - alert: SlowHttp
        expr: avg_over_time(probe_http_duration_seconds[1m]) > 0.15
      - alert: SslCertificateWillExpireSoon
        expr: 0 <= probe_ssl_earliest_cert_expiry - time() < 86400 * 20
      - alert: SslCertificateExpired
        expr: probe_ssl_earliest_cert_expiry - time() < 0
      - alert: SlowPing
        expr: avg_over_time(probe_icmp_duration_seconds{phase="rtt"}[1m]) > 0.000001
      - alert: HttpNotSsl
        expr: probe_http_ssl == 0 and on (instance, exporter) probe_http_status_code > 0
"#;

/// The civil date (UTC) `days` from now.
fn date_in(days: u64) -> (i32, u8, u8) {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // Days since 1970-01-01 to a Gregorian date (H. Hinnant's algorithm).
    let z = (now / 86_400 + days) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u8;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u8;
    let year = (yoe + era * 400 + i64::from(month <= 2)) as i32;
    (year, month, day)
}

/// One scrape job per exporter and module, blackbox_exporter's relabelling.
fn job(exporter: &str, address: SocketAddr, module: &str, targets: &[String], token: Option<&str>) -> String {
    let auth = token.map_or(String::new(), |t| {
        format!("    authorization:\n      credentials_file: {t}\n")
    });
    let list = targets.iter().map(|t| format!("          - {t}\n")).collect::<String>();
    format!(
        r#"  - job_name: {exporter}-{module}
    metrics_path: /probe
    params:
      module: [{module}]
{auth}    static_configs:
      - targets:
{list}        labels:
          exporter: {exporter}
    relabel_configs:
      - source_labels: [__address__]
        target_label: __param_target
      - source_labels: [__param_target]
        target_label: instance
      - target_label: __address__
        replacement: {address}
"#
    )
}

/// The series a PromQL query returns, each as its labels.
async fn series(prometheus: SocketAddr, q: &str) -> Vec<serde_json::Map<String, serde_json::Value>> {
    let query: String = form_urlencoded::byte_serialize(q.as_bytes()).collect();
    let Some(body) = crate::prometheus::get10(prometheus, &format!("/api/v1/query?query={query}")).await else {
        return Vec::new();
    };
    let json: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    json["data"]["result"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["metric"].as_object().cloned())
        .collect()
}

fn label(m: &serde_json::Map<String, serde_json::Value>, key: &str) -> String {
    m.get(key).and_then(|v| v.as_str()).unwrap_or_default().to_string()
}

#[tokio::test]
async fn alert_rules_fire_for_the_same_targets_on_blackbox_exporter_and_sonde() {
    let Some(prometheus) = tool("prometheus", "prometheus") else {
        return;
    };
    if !sonde_tests::tools::ping_sockets() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let web = HttpServer::start().await;
    let (y, m, d) = date_in(10);
    let valid = HttpServer::start_tls(&TestCert::new(2030, 1, 1)).await;
    let soon = HttpServer::start_tls(&TestCert::new(y, m, d)).await;
    let expired = HttpServer::start_tls(&TestCert::new(2021, 1, 1)).await;
    let closed = closed_port();

    let bb_config = r#"modules:
  http_2xx: { prober: http, timeout: 5s }
  https_any: { prober: http, timeout: 5s, http: { tls_config: { insecure_skip_verify: true } } }
  tcp_connect: { prober: tcp, timeout: 5s }
  icmp: { prober: icmp, timeout: 5s, icmp: { preferred_ip_protocol: ip4 } }
"#;
    let exporters = Blackbox::start_each(dir.path(), bb_config).await;
    if exporters.is_empty() {
        return;
    }
    secret(dir.path(), "op.token", OP);
    let grants = r#"grants: { net: ["127.0.0.1:*"] }"#;
    let sonde_config = dir.path().join("sonde.yaml");
    std::fs::write(
        &sonde_config,
        format!(
            r#"operator_token_file: op.token
modules:
  http_2xx: {{ plugin: http, timeout: 5s, config: {{ expected_status: ["200-299"] }}, {grants} }}
  https_any: {{ plugin: http, timeout: 5s, config: {{ expected_status: ["200-299"], insecure_skip_verify: true }}, {grants} }}
  tcp_connect: {{ plugin: tcp, timeout: 5s, {grants} }}
  icmp: {{ plugin: icmp, timeout: 5s, config: {{ preferred_ip_protocol: ip4 }}, grants: {{ net: ["127.0.0.1:*", "198.51.100.7:*"] }} }}
"#
        ),
    )
    .unwrap();
    let (_agent, api) = start_agent(&sonde_config).await;

    let http_targets: Vec<String> = ["ok", "nothing", "fail", "slow"]
        .iter()
        .map(|p| format!("http://{}/{p}", web.addr))
        .collect();
    let https_targets: Vec<String> = [&valid, &soon, &expired]
        .iter()
        .map(|s| format!("https://{}/ok", s.addr))
        .collect();
    let tcp_targets = vec![web.addr.to_string(), closed.to_string()];
    // 198.51.100.7 (TEST-NET-2) answers no echo here.
    let icmp_targets = vec!["127.0.0.1".to_string(), "198.51.100.7".to_string()];
    let token = dir.path().join("op.token").display().to_string();
    let mut scrape = String::from("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n");
    scrape += &format!(
        "rule_files:\n  - {}\n  - {}\nscrape_configs:\n",
        repo().join("deploy/prometheus/rules.yaml").display(),
        dir.path().join("common.yaml").display()
    );
    std::fs::write(dir.path().join("common.yaml"), COMMON_RULES).unwrap();
    let mut scraped_by: Vec<(String, SocketAddr, Option<&str>)> = exporters
        .iter()
        .map(|bb| (format!("blackbox-{}", bb.release.version()), bb.addr, None))
        .collect();
    scraped_by.push(("sonde".to_string(), api, Some(token.as_str())));
    for (exporter, address, token) in &scraped_by {
        let (exporter, address, token) = (exporter.as_str(), *address, *token);
        scrape += &job(exporter, address, "http_2xx", &http_targets, token);
        scrape += &job(exporter, address, "https_any", &https_targets, token);
        scrape += &job(exporter, address, "tcp_connect", &tcp_targets, token);
        scrape += &job(exporter, address, "icmp", &icmp_targets, token);
    }
    let (addr, _prometheus) = crate::prometheus::start_prometheus(&prometheus, dir.path(), &scrape);

    // Until every target has been scraped five times through each exporter
    // (and the rules evaluated since).
    let targets = http_targets.len() + https_targets.len() + tcp_targets.len() + icmp_targets.len();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let scraped = series(addr, "count_over_time(probe_success[1m]) >= 5").await;
        if scraped.len() == scraped_by.len() * targets {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus never scraped every target five times: {} of {}\n{scrape}",
            scraped.len(),
            scraped_by.len() * targets
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;

    let alerts = series(addr, "ALERTS").await;
    let slow = &http_targets[3];
    // A slow-probe alert depends on how long each exporter's run took: it
    // is compared on the slow target only, where both must fire, since a
    // loaded machine may slow any other run past the threshold on one side.
    let timed = |alert: &str, target: &str| matches!(alert, "SlowProbe" | "SlowHttp") && target != slow;
    let fired = |exporter: &str| -> BTreeSet<(String, String)> {
        alerts
            .iter()
            .filter(|a| label(a, "exporter") == exporter)
            .map(|a| (label(a, "alertname"), label(a, "instance")))
            .filter(|(alert, target)| !timed(alert, target))
            .collect()
    };
    let sonde = fired("sonde");
    for bb in &exporters {
        let release = bb.release.version();
        let bb = fired(&format!("blackbox-{release}"));
        assert_eq!(
            bb,
            sonde,
            "the alerts differ:\nonly blackbox_exporter {release}: {:?}\nonly sonde: {:?}",
            bb.difference(&sonde).collect::<Vec<_>>(),
            sonde.difference(&bb).collect::<Vec<_>>()
        );
    }
    // Each rule fired for what it is about, so the equality says something.
    let fired_for = |alert: &str, target: &str| sonde.contains(&(alert.to_string(), target.to_string()));
    let (ok, nothing, fail) = (&http_targets[0], &http_targets[1], &http_targets[2]);
    let (valid, soon, expired) = (&https_targets[0], &https_targets[1], &https_targets[2]);
    for (alert, target) in [
        ("ProbeFailed", nothing),
        ("ProbeFailed", fail),
        ("ProbeFailed", &tcp_targets[1]),
        ("SondeProbeEndpointFailing", nothing),
        ("HttpStatusCode", nothing),
        ("HttpStatusCode", fail),
        ("SlowProbe", slow),
        ("SlowHttp", slow),
        ("SslCertificateWillExpireSoon", soon),
        ("SslCertificateExpired", expired),
        ("HttpNotSsl", ok),
        ("SlowPing", &icmp_targets[0]),
        ("ProbeFailed", &icmp_targets[1]),
    ] {
        assert!(fired_for(alert, target), "{alert} did not fire for {target}: {sonde:?}");
    }
    for (alert, target) in [
        ("ProbeFailed", ok),
        ("ProbeFailed", valid),
        ("SslCertificateWillExpireSoon", valid),
        ("SslCertificateExpired", soon),
        ("HttpNotSsl", valid),
        ("SlowPing", &icmp_targets[1]),
        ("ProbeFailed", &icmp_targets[0]),
    ] {
        assert!(!fired_for(alert, target), "{alert} fired for {target}: {sonde:?}");
    }
}
