//! The shipped alert rules (`deploy/prometheus/`): promtool checks them and
//! runs their tests, every alert fires in one, and the PrometheusRule
//! carries the same groups.

use crate::{repo, yaml};
use sonde_tests::tools::tool;
use std::path::PathBuf;

/// A file of `deploy/prometheus/`.
fn shipped(path: &str) -> PathBuf {
    repo().join("deploy/prometheus").join(path)
}

/// The alerts of the shipped rules, by group.
fn alerts(rules: &serde_json::Value) -> Vec<String> {
    rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .filter_map(|r| r["alert"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn promtool_checks_the_shipped_rules_and_tests_every_alert() {
    let Some(promtool) = tool("promtool", "prometheus") else {
        return;
    };
    let dir = shipped("");
    for args in [["check", "rules", "rules.yaml"], ["test", "rules", "rules.test.yaml"]] {
        let out = std::process::Command::new(&promtool)
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Every alert has a test in which it fires.
    let shipped_alerts = alerts(&yaml(&shipped("rules.yaml")));
    assert!(shipped_alerts.len() >= 7, "{shipped_alerts:?}");
    let tests = yaml(&shipped("rules.test.yaml"));
    let firing: Vec<&str> = tests["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().into_iter().flatten())
        .filter(|a| a["exp_alerts"].as_array().is_some_and(|e| !e.is_empty()))
        .filter_map(|a| a["alertname"].as_str())
        .collect();
    for alert in &shipped_alerts {
        assert!(firing.contains(&alert.as_str()), "no test makes {alert} fire");
    }
}

#[test]
fn the_prometheusrule_carries_the_same_groups_as_the_rules_file() {
    let rules = yaml(&shipped("rules.yaml"));
    let cr = yaml(&shipped("prometheusrule.yaml"));
    assert_eq!(cr["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(cr["kind"], "PrometheusRule");
    assert_eq!(cr["spec"]["groups"], rules["groups"]);
}
