//! The Node the controllers' tests run on, and its agent's settings:
//! shared by `#[path]` with the sonde crate's Kubernetes tests.

use sonde_kubernetes::{self as kubernetes, Allowlist, GateSettings};
use std::collections::BTreeMap;
use std::time::Duration;

/// The node the agents of these tests run on.
pub(crate) const NODE: &str = "node-1";

/// The settings of an agent on Node `node` (address 127.0.0.1) that runs
/// node checks in tenant `node`, heartbeating every `heartbeat`, writing
/// at most `qps` a second, with the `http` and `tcp` plugins allowed.
pub(crate) fn node_settings(node: &str, heartbeat: Duration, qps: f64) -> GateSettings {
    GateSettings {
        node_name: node.into(),
        plugins: Allowlist::parse(&["http".to_string(), "tcp".to_string()]).unwrap(),
        namespaces: BTreeMap::new(),
        qps,
        burst: (qps * 2.0) as u32,
        message_refresh: kubernetes::DEFAULT_MESSAGE_REFRESH,
        node: kubernetes::NodeSettings {
            ip: Some("127.0.0.1".into()),
            tenant: "node".into(),
            heartbeat,
        },
    }
}
