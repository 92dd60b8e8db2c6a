//! `dns:` of a blackbox_exporter module: the dns plugin takes its options
//! under the same names, with the same defaults and meanings.

use super::options::{Out, ip_protocol};
use super::tree::Node;
use super::walk::Ctx;
use serde_json::{Map, Value as Json};

/// The regex lists of a `validate_*_rrs` block.
const VALIDATORS: [&str; 4] = [
    "fail_if_matches_regexp",
    "fail_if_not_matches_regexp",
    "fail_if_all_match_regexp",
    "fail_if_none_matches_regexp",
];

/// `dns:` into `out`.
pub(super) fn dns(ctx: &mut Ctx, node: &Node, path: &str, out: &mut Out) {
    for e in ctx.entries(node, path) {
        match e.key {
            "query_name" | "query_type" | "query_class" => {
                if let Some(s) = ctx.string(e.node, &e.path) {
                    out.config.insert(e.key.into(), s.into());
                }
            }
            "transport_protocol" => match ctx.string(e.node, &e.path).as_deref() {
                Some(s @ ("udp" | "tcp")) => {
                    out.config.insert(e.key.into(), s.into());
                }
                Some(other) => ctx.invalid(e.node.referenced, &e.path, format!("{other:?}: give udp or tcp")),
                None => {}
            },
            "recursion_desired" => {
                if let Some(b) = ctx.boolean(e.node, &e.path) {
                    out.config.insert(e.key.into(), b.into());
                }
            }
            "valid_rcodes" => {
                let codes: Vec<Json> = ctx
                    .strings(e.node, &e.path)
                    .into_iter()
                    .map(|(_, s, _)| s.into())
                    .collect();
                out.config.insert(e.key.into(), codes.into());
            }
            "validate_answer_rrs" | "validate_authority_rrs" | "validate_additional_rrs" => {
                let block = validators(ctx, e.node, &e.path);
                if !block.is_empty() {
                    out.config.insert(e.key.into(), block.into());
                }
            }
            "preferred_ip_protocol" | "ip_protocol_fallback" => ip_protocol(ctx, e.key, e.node, &e.path, out),
            "dns_over_tls" => {
                if ctx.boolean(e.node, &e.path) == Some(true) {
                    ctx.unsupported(
                        e.node.referenced,
                        &e.path,
                        "true is not supported: the dns plugin asks over UDP or TCP, not TLS",
                    );
                }
            }
            "tls_config" => ctx.note(&e.path, "left out: it applies to dns_over_tls only"),
            "source_ip_address" => {
                ctx.unsupported_if_set(
                    e.node,
                    &e.path,
                    "not supported: sonde does not choose the source address",
                );
            }
            _ => ctx.invalid(e.at, &e.path, "unknown key of the dns prober"),
        }
    }
}

/// A `validate_*_rrs` block: its regex lists, each regex checked as the
/// plugin compiles it.
fn validators(ctx: &mut Ctx, node: &Node, path: &str) -> Map<String, Json> {
    let mut block = Map::new();
    for e in ctx.entries(node, path) {
        if !VALIDATORS.contains(&e.key) {
            ctx.invalid(e.at, &e.path, "unknown key of a validate_*_rrs block");
            continue;
        }
        let list: Vec<Json> = ctx
            .strings(e.node, &e.path)
            .into_iter()
            .filter_map(|(p, s, n)| ctx.regex(n, &p, &s))
            .map(Json::from)
            .collect();
        block.insert(e.key.into(), list.into());
    }
    block
}
