//! blackbox_exporter's `blackbox.yml`, read key by key into sonde modules:
//! the module level and the `tcp`, `grpc` and `icmp` probers here, the
//! `http` and `dns` probers in [`super::http`] and [`super::dns`], what
//! they share in [`super::options`].

use super::options::{Out, ip_protocol, tls_config};
use super::tree::{self, Node};
use super::walk::{Ctx, Severity};
use serde_json::{Map, Value as Json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

/// blackbox_exporter's deadline for a module without `timeout` when the
/// scrape sends no `X-Prometheus-Scrape-Timeout-Seconds`: written out, so
/// that the scrape's own deadline governs under sonde as it did.
pub(crate) const NO_TIMEOUT: &str = "120s";

/// One module as sonde will run it.
#[derive(Debug)]
pub(crate) struct Imported {
    pub name: String,
    /// Where the module starts in the blackbox_exporter file.
    pub line: u64,
    pub prober: String,
    pub plugin: &'static str,
    /// `None`: the module had none ([`NO_TIMEOUT`]).
    pub timeout: Option<String>,
    pub config: Map<String, Json>,
    /// Directories the plugin must read (a `ca_file`'s).
    pub files: BTreeSet<PathBuf>,
    /// The secrets the module uses: name to file (a credential file's).
    pub secrets: BTreeMap<String, PathBuf>,
    /// `grants.ip_protocol` and `grants.ip_protocol_fallback`, when the
    /// module holds to a version.
    pub ip_protocol: Option<(&'static str, bool)>,
}

/// Reads `text` (a blackbox_exporter config file): the modules sonde can
/// run, and every problem found. A module with a problem of its own that
/// is not [`Severity::Unsupported`] is not among the modules.
pub(crate) fn import(text: &str) -> Result<(Vec<Imported>, Ctx), (String, u64, u64)> {
    let root = tree::parse(text)?;
    let mut ctx = Ctx::default();
    let mut out = Vec::new();
    for top in ctx.entries(&root, "") {
        let top_path = top.key.to_string();
        if top.key != "modules" {
            ctx.invalid(
                top.at,
                &top_path,
                "unknown key: blackbox_exporter's file has only `modules`",
            );
            continue;
        }
        for m in ctx.entries(top.node, &top_path) {
            let before = ctx.problems.len();
            let imported = module(&mut ctx, m.key, m.node, &m.path);
            let dropped = ctx.problems[before..]
                .iter()
                .any(|p| p.severity != Severity::Unsupported);
            if let Some(mut imported) = imported.filter(|_| !dropped) {
                imported.line = m.at.line();
                out.push(imported);
            }
        }
    }
    Ok((out, ctx))
}

fn module(ctx: &mut Ctx, name: &str, node: &Node, path: &str) -> Option<Imported> {
    if !sonde_core::catalog::valid_name(name) {
        ctx.unsupported_module(
            node.referenced,
            path,
            "not a sonde module name (1-128 letters, digits, `-`, `_` or `.`)",
        );
    }
    let entries = ctx.entries(node, path);
    let prober = entries.iter().find(|e| e.key == "prober");
    let Some(prober_entry) = prober else {
        ctx.invalid(
            node.referenced,
            &format!("{path}.prober"),
            "missing: every module names its prober",
        );
        return None;
    };
    let prober = ctx.string(prober_entry.node, &prober_entry.path)?;
    let plugin = match prober.as_str() {
        "http" => "http",
        "tcp" => "tcp",
        "grpc" => "grpc",
        "icmp" => "icmp",
        "dns" => "dns",
        "unix" => {
            ctx.unsupported_module(
                prober_entry.node.referenced,
                &prober_entry.path,
                "not supported: a sonde plugin reaches network targets through the host, which opens no Unix sockets for it",
            );
            return None;
        }
        other => {
            ctx.invalid(
                prober_entry.node.referenced,
                &prober_entry.path,
                format!("unknown prober {other:?} (blackbox_exporter has http, tcp, grpc, dns, icmp and unix)"),
            );
            return None;
        }
    };
    let mut timeout = None;
    let mut out = Out::default();
    for e in &entries {
        match e.key {
            "prober" => {}
            "timeout" => timeout = module_timeout(ctx, e.node, &e.path),
            key @ ("http" | "tcp" | "grpc" | "dns" | "icmp") if key == prober => {
                prober_block(ctx, key, e.node, &e.path, &mut out);
            }
            key @ ("http" | "tcp" | "grpc" | "dns" | "icmp") => {
                // blackbox_exporter does not use another prober's block, but
                // refuses one with a key it does not know.
                let mut scratch = Ctx::default();
                prober_block(&mut scratch, key, e.node, &e.path, &mut Out::default());
                let invalid = scratch.problems.into_iter().filter(|p| p.severity == Severity::Invalid);
                ctx.problems.extend(invalid);
                ctx.note(
                    &e.path,
                    format_args!(
                        "left out: the module's prober is {prober}, so blackbox_exporter does not use it either"
                    ),
                );
            }
            _ => ctx.invalid(
                e.at,
                &e.path,
                "unknown key (a module has prober, timeout, http, tcp, grpc, dns and icmp)",
            ),
        }
    }
    // blackbox_exporter's default is 2xx; sonde's (the kubelet's) 200-399.
    if plugin == "http" && !out.config.contains_key("expected_status") {
        out.config
            .insert("expected_status".into(), serde_json::json!(["200-299"]));
    }
    Some(Imported {
        name: name.to_string(),
        line: 0,
        prober,
        plugin,
        timeout,
        config: out.config,
        files: out.files,
        secrets: out.secrets,
        ip_protocol: grants_ip_protocol(out.ip_protocol),
    })
}

/// The block of prober `key` (`http`, `tcp`, `grpc`, `dns` or `icmp`), into
/// `out`.
fn prober_block(ctx: &mut Ctx, key: &str, node: &Node, path: &str, out: &mut Out) {
    match key {
        "http" => super::http::http(ctx, node, path, out),
        "tcp" => tcp(ctx, node, path, out),
        "icmp" => icmp(ctx, node, path, out),
        "dns" => super::dns::dns(ctx, node, path, out),
        _ => grpc(ctx, node, path, out),
    }
}

/// A module's `timeout`, as sonde writes it; `None` for none (or zero,
/// which blackbox_exporter reads as none).
fn module_timeout(ctx: &mut Ctx, node: &Node, path: &str) -> Option<String> {
    let text = ctx.string(node, path)?;
    match humantime::parse_duration(text.trim()) {
        Ok(d) if d.is_zero() => None,
        Ok(_) => Some(text.trim().to_string()),
        Err(e) => {
            ctx.invalid(node.referenced, path, format!("{text:?} is not a duration ({e})"));
            None
        }
    }
}

/// The module's `grants.ip_protocol` from what its prober said, with
/// blackbox_exporter's defaults: `ip6` preferred, with fallback. Only a
/// version written, or a fallback turned off, is carried over: with
/// fallback, blackbox's default preference changes nothing a probe can
/// tell apart on a name of one version.
fn grants_ip_protocol((prefer, fallback): (Option<&'static str>, Option<bool>)) -> Option<(&'static str, bool)> {
    match (prefer, fallback.unwrap_or(true)) {
        (None, true) => None,
        (prefer, fallback) => Some((prefer.unwrap_or("ip6"), fallback)),
    }
}

/// `tcp:`: `query_response` into `steps`, `tls`, `tls_config`.
fn tcp(ctx: &mut Ctx, node: &Node, path: &str, out: &mut Out) {
    let mut tls = false;
    let mut tls_node = None;
    let mut steps = Vec::new();
    for e in ctx.entries(node, path) {
        match e.key {
            "query_response" => {
                for (p, item) in ctx.items(e.node, &e.path) {
                    query_response(ctx, item, &p, &mut steps);
                }
            }
            "tls" => tls = ctx.boolean(e.node, &e.path).unwrap_or(false),
            "tls_config" => tls_node = Some((e.node, e.path)),
            "preferred_ip_protocol" | "ip_protocol_fallback" => ip_protocol(ctx, e.key, e.node, &e.path, out),
            "source_ip_address" => {
                ctx.unsupported_if_set(
                    e.node,
                    &e.path,
                    "not supported: sonde does not choose the source address",
                );
            }
            _ => ctx.invalid(e.at, &e.path, "unknown key of the tcp prober"),
        }
    }
    // blackbox_exporter's starttls verifies with the module's tls_config.
    let starttls = steps.iter().any(|s| s.get("starttls").is_some());
    tls_block(ctx, tls || starttls, tls_node, out);
    if starttls && !tls {
        // The steps begin over plain TCP; the plugin refuses both.
        out.config.remove("tls");
    }
    if !steps.is_empty() {
        out.config.insert("steps".into(), Json::Array(steps));
    }
}

/// One `query_response` entry, in blackbox_exporter's order: its expect
/// (matched line by line) or expect_bytes, then its send (ended with a
/// newline; `${1}` and `$name` stand for the expect's groups), then its
/// `starttls` (the plugin's step of that name).
fn query_response(ctx: &mut Ctx, node: &Node, path: &str, steps: &mut Vec<Json>) {
    let mut starttls = false;
    let mut expect = None;
    let mut expect_bytes = None;
    let mut send = None;
    for e in ctx.entries(node, path) {
        match e.key {
            "expect" => {
                if let Some(pattern) = ctx.string(e.node, &e.path).filter(|s| !s.is_empty()) {
                    // ^ and $ at each line's ends (CRLF too), as
                    // blackbox_exporter's line-by-line match reads them.
                    expect = ctx.regex(e.node, &e.path, &pattern).map(|p| format!("(?mR){p}"));
                }
            }
            "expect_bytes" => expect_bytes = ctx.bytes(e.node, &e.path).filter(|b| !b.is_empty()),
            "send" => send = ctx.bytes(e.node, &e.path).filter(|b| !b.is_empty()),
            "labels" => {
                if !ctx.items(e.node, &e.path).is_empty() {
                    ctx.unsupported(
                        e.node.referenced,
                        &e.path,
                        "not supported: sonde has no probe_expect_info metric to carry labels from the reply (the expect itself is kept)",
                    );
                }
            }
            "starttls" => starttls = ctx.boolean(e.node, &e.path) == Some(true),
            _ => ctx.invalid(
                e.at,
                &e.path,
                "unknown key of a query_response entry (expect, expect_bytes, labels, send, starttls)",
            ),
        }
    }
    let expanded = expect.is_some();
    if let Some(pattern) = expect {
        steps.push(serde_json::json!({"expect": pattern}));
    }
    if let Some(bytes) = expect_bytes {
        steps.push(match String::from_utf8(bytes) {
            Ok(text) => serde_json::json!({"expect_bytes": text}),
            Err(e) => serde_json::json!({"expect_bytes_base64": base64(e.as_bytes())}),
        });
    }
    if let Some(mut bytes) = send {
        bytes.push(b'\n');
        steps.push(match String::from_utf8(bytes) {
            // blackbox_exporter expands a send after an expect.
            Ok(text) if expanded && text.contains('$') => serde_json::json!({"send_expand": text}),
            Ok(text) => serde_json::json!({"send": text}),
            Err(e) => serde_json::json!({"send_base64": base64(e.as_bytes())}),
        });
    }
    if starttls {
        steps.push(serde_json::json!({"starttls": true}));
    }
}

/// Standard base64.
fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A tcp or grpc module's `tls` and its `tls_config`, which
/// blackbox_exporter reads only with `tls: true` (or, for tcp, a
/// `starttls` step).
fn tls_block(ctx: &mut Ctx, tls: bool, tls_node: Option<(&Node, String)>, out: &mut Out) {
    if tls {
        out.config.insert("tls".into(), true.into());
    }
    if let Some((n, p)) = tls_node {
        if tls {
            tls_config(ctx, n, &p, out);
        } else {
            ctx.note(
                &p,
                "left out: without tls: true, blackbox_exporter does not use it either",
            );
        }
    }
}

/// `grpc:`: `service`, `tls`, `tls_config`.
fn grpc(ctx: &mut Ctx, node: &Node, path: &str, out: &mut Out) {
    let mut tls = false;
    let mut tls_node = None;
    for e in ctx.entries(node, path) {
        match e.key {
            "service" => {
                if let Some(s) = ctx.string(e.node, &e.path) {
                    out.config.insert("service".into(), s.into());
                }
            }
            "tls" => tls = ctx.boolean(e.node, &e.path).unwrap_or(false),
            "tls_config" => tls_node = Some((e.node, e.path)),
            "preferred_ip_protocol" | "ip_protocol_fallback" => ip_protocol(ctx, e.key, e.node, &e.path, out),
            _ => ctx.invalid(e.at, &e.path, "unknown key of the grpc prober"),
        }
    }
    tls_block(ctx, tls, tls_node, out);
}

/// `icmp:`: the icmp plugin has blackbox_exporter's options under the same
/// names, with the same defaults (`ip6`, with fallback).
fn icmp(ctx: &mut Ctx, node: &Node, path: &str, out: &mut Out) {
    for e in ctx.entries(node, path) {
        match e.key {
            "preferred_ip_protocol" => {
                if let Some(s) = ctx.string(e.node, &e.path) {
                    match s.as_str() {
                        "ip4" | "ip6" | "ipv4" | "ipv6" => {
                            out.config.insert(e.key.into(), s.into());
                        }
                        _ => ctx.invalid(e.node.referenced, &e.path, format!("{s:?}: give ip4 or ip6")),
                    }
                }
            }
            "ip_protocol_fallback" | "dont_fragment" => {
                if let Some(b) = ctx.boolean(e.node, &e.path) {
                    out.config.insert(e.key.into(), b.into());
                }
            }
            "payload_size" | "ttl" => {
                let (low, high) = if e.key == "ttl" { (1, 255) } else { (0, 16384) };
                match ctx.integer(e.node, &e.path) {
                    // blackbox_exporter reads 0 as its default for both.
                    Some(0) => {}
                    Some(n) if (low..=high).contains(&n) => {
                        out.config.insert(e.key.into(), n.into());
                    }
                    Some(n) => ctx.unsupported(
                        e.node.referenced,
                        &e.path,
                        format!("{n} is not supported: the icmp plugin takes {low} to {high}"),
                    ),
                    None => {}
                }
            }
            "source_ip_address" => {
                ctx.unsupported_if_set(
                    e.node,
                    &e.path,
                    "not supported: sonde does not choose the source address",
                );
            }
            _ => ctx.invalid(e.at, &e.path, "unknown key of the icmp prober"),
        }
    }
}
