//! The effective config: what a loaded [`Catalog`] puts in force, every
//! key with its value after defaults and normalisation, as `sonde validate
//! -o json` prints it.
//!
//! It is built from what the registry holds, not from the file: a key the
//! file sets but the registry drops shows its default here, so the golden
//! cases of `tests/cases/config/valid/` (which hold this output) catch it.
//! Durations are written as `humantime` does (`1m 30s`), sizes in bytes.
//! Tokens are never printed: `token` (a tenant's) and `operator_token` say
//! whether one is set.

use serde_json::{Value, json};
use sonde_core::catalog::Catalog;
use sonde_core::config::NpdRuleKind;
use std::time::Duration;

fn dur(d: Duration) -> Value {
    Value::String(humantime::format_duration(d).to_string())
}

/// Pairs as a JSON object, in their order.
fn strings(pairs: &[(String, String)]) -> Value {
    Value::Object(
        pairs
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect(),
    )
}

/// The effective config of `catalog`.
pub fn effective(catalog: &Catalog) -> Value {
    let a = &catalog.agent.api_limits;
    let sandbox: serde_json::Map<String, Value> = catalog
        .agent
        .host_limits
        .entries()
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let tenants: Vec<Value> = catalog
        .tenants
        .iter()
        .map(|t| {
            let mut entry = tenant(t);
            if let Some(o) = catalog.agent.otlp.of_tenant(&t.id) {
                entry["otlp"] = otlp(o);
            }
            entry
        })
        .collect();
    let targets: Vec<Value> = catalog.targets().map(|t| target(catalog, t)).collect();
    json!({
        "api": {
            "listen": catalog.agent.api.map(|a| a.to_string()),
            "header_read_timeout": dur(a.header_read_timeout),
            "body_read_timeout": dur(a.body_read_timeout),
            "max_connections": a.max_connections,
            "max_header_bytes": a.max_header_bytes,
            "max_watch_streams": a.max_watch_streams,
            "max_probe_runs": a.max_probe_runs,
            "max_probe_queue": a.max_probe_queue,
            "auth": catalog.agent.api_auth.unwrap_or_default(),
        },
        "state_dir": catalog.agent.state_dir,
        "health_timeout": dur(catalog.agent.health_timeout.unwrap_or(crate::api::DEFAULT_HEALTH_TIMEOUT)),
        "trust": catalog.trusted_keys(),
        "require_signed": catalog.agent.require_signed,
        "oci": catalog.oci_settings().map(oci),
        "operator_token": catalog
            .tenants
            .credentials()
            .any(|(_, who)| who == sonde_core::auth::Principal::Operator),
        "sandbox": sandbox,
        "tenants": tenants,
        "targets": targets,
        "kubernetes": catalog.agent.kubernetes.as_ref().map(|k| kubernetes(k, &catalog.namespace_templates)),
        "modules": catalog.modules.names().map(|name| {
            let m = catalog.modules.get(name).expect("a listed module");
            (name.to_string(), json!({
                "plugin": m.plugin_ref,
                "tenant": &*m.tenant,
                "config": serde_json::from_str::<Value>(&m.config).unwrap_or_default(),
                "timeout": dur(m.limits.timeout),
                "limits": {"fuel": m.limits.fuel, "memory": m.limits.memory},
                "grants": {"net": m.grants.net.iter().map(|n| n.to_string()).collect::<Vec<_>>()},
            }))
        }).collect::<serde_json::Map<_, _>>(),
        "node_problem_detector": catalog
            .npd
            .iter()
            .map(|m| npd(m))
            .chain(catalog.npd_logs.iter().map(|m| npd_log(m)))
            .collect::<Vec<_>>(),
        "otlp": catalog.agent.otlp.operator.as_ref().map(otlp),
    })
}

/// `otlp:` as in force; headers by name only (a value may hold a secret).
fn otlp(o: &sonde_core::catalog::otlp::OtlpSettings) -> Value {
    json!({
        "endpoint": o.endpoint,
        "protocol": o.protocol.as_str(),
        "headers": o.headers.iter().map(|h| h.name.clone()).collect::<Vec<_>>(),
        "ca_file": o.ca.is_some(),
        "client_certificate": o.identity.is_some(),
        "interval": dur(o.interval),
        "timeout": dur(o.timeout),
        "resource": o.resource,
        "traces": o.traces.map(|t| json!({"success_ratio": t.success_ratio})),
    })
}

/// A `node_problem_detector:` entry: where it runs from, and its monitor
/// file as read, NPD's defaults filled in.
fn npd(m: &sonde_core::catalog::npd::Monitor) -> Value {
    let n = &m.monitor;
    let first = m.rules.first();
    json!({
        "config": m.file,
        "workdir": m.workdir,
        "exec": m.exec,
        "env": first.map(|p| strings(&p.grants.env)),
        "tenant": first.map(|p| &*p.tenant),
        "source": n.source,
        "invoke_interval": dur(n.invoke_interval),
        "timeout": dur(n.timeout),
        "max_output_length": n.max_output_length,
        "concurrency": n.concurrency,
        "enable_message_change_based_condition_update": n.message_change_updates,
        "skip_initial_status": n.skip_initial_status,
        "conditions": npd_conditions(&n.conditions),
        "rules": n.rules.iter().map(|r| json!({
            "type": rule_type(&r.kind),
            "condition": rule_condition(&r.kind),
            "reason": r.reason,
            "path": r.path,
            "args": r.args,
            "timeout": dur(r.timeout),
            "invoke_interval": dur(r.invoke_interval),
        })).collect::<Vec<_>>(),
    })
}

/// A `node_problem_detector:` entry whose file is a system-log monitor:
/// its bounds, and its file as read, NPD's defaults filled in.
fn npd_log(m: &sonde_core::catalog::npd::LogMonitor) -> Value {
    use sonde_core::config::LogSource;
    let n = &m.monitor;
    let (plugin, plugin_config, log_path) = match &n.log {
        LogSource::Kmsg => ("kmsg", json!({}), Some(sonde_core::npd::syslog::kmsg::KMSG.into())),
        LogSource::File {
            path,
            timestamp,
            message,
            format,
        } => (
            "filelog",
            json!({"timestamp": timestamp.text, "message": message.text, "timestampFormat": format.as_str()}),
            Some(path.clone()),
        ),
        LogSource::Journal { dir, identifier } => ("journald", json!({"source": identifier}), dir.clone()),
    };
    json!({
        "config": m.file,
        "max_line_bytes": m.bounds.max_line_bytes,
        "max_lines_per_second": m.bounds.max_lines_per_second,
        "plugin": plugin,
        "pluginConfig": plugin_config,
        "logPath": log_path,
        "lookback": dur(n.lookback),
        "delay": dur(n.delay),
        "bufferSize": n.buffer_lines,
        "skipList": n.skip_list,
        "source": n.source,
        "conditions": npd_conditions(&n.conditions),
        "rules": n.rules.iter().map(|r| json!({
            "type": rule_type(&r.kind),
            "condition": rule_condition(&r.kind),
            "reason": r.reason,
            "pattern": r.pattern.text,
            "patternGeneratedMessageSuffix": r.message_suffix,
        })).collect::<Vec<_>>(),
    })
}

/// A tenant's entry.
fn tenant(t: &sonde_core::tenants::Tenant) -> Value {
    let q = &t.quotas;
    json!({
        "id": &*t.id,
        "token": t.token.is_some(),
        "quotas": {
            "max_probes": q.max_probes,
            "max_concurrent_runs": q.max_concurrent_runs,
            "timeout": dur(q.timeout),
            "fuel": q.fuel,
            "memory": q.memory,
        },
        "ceiling": t.ceiling.as_ref().map(|c| json!({
            "net": c.net.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "exec": c.exec,
            "files": c.files,
            "registries": c.registries.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "signers": c.signers,
            "names_may_reach": names_may_reach(c),
        })),
        // Where each secret comes from; never a value.
        "secrets": t.secrets.iter().map(|c| (c.name().to_string(), Value::String(c.source()))).collect::<serde_json::Map<_, _>>(),
    })
}

/// A target's entry, with its probes.
fn target(catalog: &Catalog, t: &sonde_core::catalog::TargetSpec) -> Value {
    let probes: Vec<Value> = catalog.probes_of(&t.name).map(probe).collect();
    json!({
        "name": &*t.name,
        "tenant": &*t.tenant,
        "address": t.address,
        "on_failure": t.on_failure.as_ref().map(|f| json!({
            "command": f.argv,
            "timeout": dur(f.timeout),
            "env": strings(&f.env),
        })),
        "probes": probes,
    })
}

/// A probe's entry.
fn probe(p: &std::sync::Arc<sonde_core::catalog::ProbeSpec>) -> Value {
    let mut entry = json!({
        "name": &*p.name,
        "kind": p.kind.as_str(),
        "plugin": p.plugin_ref,
        "config": serde_json::from_str::<Value>(&p.config).unwrap_or(Value::Null),
        "target": p.address,
        "period": dur(p.period),
        "initial_delay": dur(p.initial_delay),
        "propagate": p.propagate,
        "timeout": dur(p.limits.timeout),
        "success_threshold": p.success_threshold,
        "failure_threshold": p.failure_threshold,
        "grants": {
            "net": p.grants.net.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "exec": p.grants.exec,
            "files": p.grants.files,
            "env": strings(&p.grants.env),
            "secrets": p.grants.secrets.names().collect::<Vec<_>>(),
        },
        "limits": { "fuel": p.limits.fuel, "memory": p.limits.memory },
        "groups": &*p.groups,
        "labels": strings(&p.labels),
    });
    // Only when set: most probes take the resolver's order.
    if let Some(ip) = p.grants.ip_protocol {
        entry["grants"]["ip_protocol"] = ip.prefer.to_string().into();
        entry["grants"]["ip_protocol_fallback"] = ip.fallback.into();
    }
    entry
}

/// The `kubernetes:` block, defaults filled in.
fn kubernetes(k: &sonde_core::config::KubernetesSpec, t: &sonde_core::catalog::settings::NamespaceTemplates) -> Value {
    use sonde_kubernetes::{
        DEFAULT_BURST, DEFAULT_MESSAGE_REFRESH, DEFAULT_NODE_HEARTBEAT, DEFAULT_NODE_TENANT, DEFAULT_PLUGINS,
        DEFAULT_QPS,
    };
    let templates: serde_json::Map<String, Value> = t
        .templates
        .iter()
        .map(|(name, t)| {
            let made = sonde_core::tenants::Tenant::new(name, t.quotas, t.ceiling.clone());
            let entry = tenant(&made);
            (
                name.clone(),
                json!({"quotas": entry["quotas"], "ceiling": entry["ceiling"]}),
            )
        })
        .collect();
    json!({
        "node_name": k.node_name,
        "plugins": k.plugins.clone().unwrap_or_else(|| DEFAULT_PLUGINS.iter().map(|p| p.to_string()).collect()),
        "namespaces": k.namespaces,
        "namespace_templates": templates,
        "max_templated_namespaces": t.max,
        "qps": k.qps.unwrap_or(DEFAULT_QPS),
        "burst": k.burst.unwrap_or(DEFAULT_BURST),
        "message_refresh": dur(k.message_refresh.map_or(DEFAULT_MESSAGE_REFRESH, |d| d.0)),
        "node_ip": k.node_ip,
        "node_tenant": k.node_tenant.as_deref().unwrap_or(DEFAULT_NODE_TENANT),
        "node_heartbeat": dur(k.node_heartbeat.map_or(DEFAULT_NODE_HEARTBEAT, |d| d.0)),
    })
}

/// The `oci:` block.
fn oci(o: &sonde_oci::ClientSettings) -> Value {
    let registries: serde_json::Map<String, Value> = o
        .registries
        .iter()
        .map(|(host, r)| {
            let r = json!({
                "username": r.username,
                "password_file": r.password_file,
                "ca_file": r.ca_file,
                "insecure": r.insecure,
            });
            (host.clone(), r)
        })
        .collect();
    json!({
        "registries": registries,
        "cache_dir": o.cache_dir,
        "cache_max": o.cache_max_bytes,
        "timeout": dur(o.timeout),
    })
}

/// A ceiling's `names_may_reach`, as written in a config.
fn names_may_reach(c: &sonde_core::tenants::Ceiling) -> Vec<&'static str> {
    [
        c.names_reach_public.then_some("public"),
        c.names_reach_private.then_some("private"),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// A monitor file's `conditions` as in force.
fn npd_conditions(conditions: &[sonde_core::config::NpdCondition]) -> Vec<Value> {
    conditions
        .iter()
        .map(|c| json!({"type": c.kind, "reason": c.reason, "message": c.message}))
        .collect()
}

/// A rule's `type`, as NPD spells it.
fn rule_type(kind: &NpdRuleKind) -> &'static str {
    match kind {
        NpdRuleKind::Temporary => "temporary",
        NpdRuleKind::Permanent(_) => "permanent",
    }
}

/// The condition a permanent rule sets.
fn rule_condition(kind: &NpdRuleKind) -> Option<&String> {
    match kind {
        NpdRuleKind::Permanent(c) => Some(c),
        NpdRuleKind::Temporary => None,
    }
}
