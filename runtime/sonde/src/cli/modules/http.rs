//! blackbox_exporter's `http` prober, into the config of sonde's `http`
//! plugin (its schema: `plugins/http/src/schema.json`).

use super::blackbox::{Out, ip_protocol, tls_config};
use super::tree::Node;
use super::walk::Ctx;
use base64::Engine as _;
use serde_json::{Map, Value as Json};

/// At most this many `header_regex` entries (the host keeps 64 response
/// headers for a plugin, `Location` among them).
const MAX_HEADER_REGEX: usize = 63;

/// An `Authorization` header made from a credential key, and where.
struct Credential {
    value: String,
    path: String,
    at: serde_saphyr::Location,
}

pub(crate) fn http(ctx: &mut Ctx, node: &Node, path: &str, out: &mut Out) {
    let mut codes: Vec<Json> = Vec::new();
    let mut headers = Map::new();
    let mut credential: Option<Credential> = None;
    let mut header_regex = Map::new();
    for e in ctx.entries(node, path) {
        let (n, p) = (e.node, e.path.as_str());
        match e.key {
            "valid_status_codes" => {
                for (ip, item) in ctx.items(n, p) {
                    match ctx.integer(item, &ip).map(u16::try_from) {
                        Some(Ok(code)) => codes.push(code.into()),
                        Some(Err(_)) => ctx.invalid(item.referenced, &ip, "not an HTTP status code"),
                        None => {}
                    }
                }
            }
            "method" => {
                if let Some(m) = ctx.string(n, p).filter(|m| !m.is_empty()) {
                    out.config.insert("method".into(), m.into());
                }
            }
            "headers" => {
                for h in ctx.entries(n, p) {
                    if let Some(v) = ctx.string(h.node, &h.path) {
                        headers.insert(h.key.to_string(), v.into());
                    }
                }
            }
            "body" => {
                if let Some(b) = ctx.string(n, p).filter(|b| !b.is_empty()) {
                    out.config.insert("body".into(), b.into());
                }
            }
            "fail_if_body_matches_regexp" => body_matches(ctx, n, p, out),
            "fail_if_body_not_matches_regexp" => body_not_matches(ctx, n, p, out),
            "fail_if_header_matches" => header_matches(ctx, n, p),
            "fail_if_header_not_matches" => header_not_matches(ctx, n, p, &mut header_regex),
            "tls_config" => tls_config(ctx, n, p, out),
            "basic_auth" => {
                if let Some(value) = basic_auth(ctx, n, p) {
                    set_credential(ctx, &mut credential, value, e.at, p);
                }
            }
            "bearer_token" => {
                if let Some(token) = ctx.string(n, p).filter(|t| !t.is_empty()) {
                    set_credential(ctx, &mut credential, format!("Bearer {token}"), e.at, p);
                }
            }
            "authorization" => {
                if let Some(value) = authorization(ctx, n, p) {
                    set_credential(ctx, &mut credential, value, e.at, p);
                }
            }
            "preferred_ip_protocol" | "ip_protocol_fallback" => ip_protocol(ctx, e.key, n, p),
            "follow_redirects" => default_only(ctx, n, p, true, "sonde follows redirects to the same host"),
            "no_follow_redirects" => default_only(ctx, n, p, false, "sonde follows redirects to the same host"),
            "fail_if_ssl" | "fail_if_not_ssl" => {
                default_only(ctx, n, p, false, "sonde's http plugin has no such check")
            }
            "skip_resolve_phase_with_proxy" | "proxy_from_environment" => {
                default_only(ctx, n, p, false, "sonde connects to targets directly, through no proxy");
            }
            // On by default in both; only its absence is written.
            "enable_http2" => {
                if ctx.boolean(n, p) == Some(false) {
                    out.config.insert("enable_http2".into(), false.into());
                }
            }
            key if unsupported(ctx, key, n, p) => {}
            _ => ctx.invalid(e.at, p, "unknown key of the http prober"),
        }
    }
    finish(
        ctx,
        out,
        Found {
            codes,
            headers,
            credential,
            header_regex,
        },
    );
}

/// What `http:` gave that becomes one config key after the whole block.
struct Found {
    codes: Vec<Json>,
    headers: Map<String, Json>,
    credential: Option<Credential>,
    header_regex: Map<String, Json>,
}

/// The keys gathered over the block, into `out`: the credential as an
/// `Authorization` header, the headers, the status codes, the header regexes.
fn finish(ctx: &mut Ctx, out: &mut Out, found: Found) {
    let Found {
        codes,
        mut headers,
        credential,
        header_regex,
    } = found;
    if let Some(c) = credential {
        if headers.keys().any(|k| k.eq_ignore_ascii_case("authorization")) {
            ctx.unsupported(
                c.at,
                &c.path,
                "not supported together with an Authorization header in headers",
            );
        } else {
            ctx.note(
                &c.path,
                "written as an Authorization header in the module's config: the credential is in the output, as it was in the file",
            );
            headers.insert("Authorization".into(), c.value.into());
        }
    }
    if !headers.is_empty() {
        out.config.insert("headers".into(), Json::Object(headers));
    }
    // Without codes, the module adds blackbox_exporter's default (2xx).
    if !codes.is_empty() {
        out.config.insert("expected_status".into(), Json::Array(codes));
    }
    if !header_regex.is_empty() {
        out.config.insert("header_regex".into(), Json::Object(header_regex));
    }
}

/// `fail_if_body_matches_regexp`: any of them matching fails the probe, so
/// one alternation (`body_not_regex`).
fn body_matches(ctx: &mut Ctx, n: &Node, p: &str, out: &mut Out) {
    let patterns: Vec<String> = ctx
        .strings(n, p)
        .into_iter()
        .filter_map(|(ip, s, item)| ctx.regex(item, &ip, &s))
        .collect();
    // Any of them matching fails the probe: one alternation.
    let joined = match patterns.as_slice() {
        [] => None,
        [one] => Some(one.clone()),
        many => Some(many.iter().map(|p| format!("(?:{p})")).collect::<Vec<_>>().join("|")),
    };
    if let Some(re) = joined {
        out.config.insert("body_not_regex".into(), re.into());
    }
}

/// `fail_if_body_not_matches_regexp`: the first (`body_regex` takes one).
fn body_not_matches(ctx: &mut Ctx, n: &Node, p: &str, out: &mut Out) {
    for (i, (ip, s, item)) in ctx.strings(n, p).into_iter().enumerate() {
        if i > 0 {
            ctx.unsupported(
                item.referenced,
                &ip,
                "not supported: sonde's body_regex takes one regex (the first is kept)",
            );
        } else if let Some(re) = ctx.regex(item, &ip, &s) {
            out.config.insert("body_regex".into(), re.into());
        }
    }
}

/// `fail_if_header_matches`: not supported.
fn header_matches(ctx: &mut Ctx, n: &Node, p: &str) {
    for (ip, item) in ctx.items(n, p) {
        if header_spec(ctx, item, &ip).is_some() {
            ctx.unsupported(
                item.referenced,
                &ip,
                "not supported: sonde's header_regex says what a header must match, not what it must not",
            );
        }
    }
}

/// `fail_if_header_not_matches`: one regex per header (`header_regex`).
fn header_not_matches(ctx: &mut Ctx, n: &Node, p: &str, header_regex: &mut Map<String, Json>) {
    for (ip, item) in ctx.items(n, p) {
        let Some((header, re, allow_missing)) = header_spec(ctx, item, &ip) else {
            continue;
        };
        if allow_missing {
            ctx.unsupported(
                item.referenced,
                &format!("{ip}.allow_missing"),
                "true is not supported: sonde's header_regex fails a response without the header",
            );
        } else if header_regex.keys().any(|k| k.eq_ignore_ascii_case(&header)) {
            ctx.unsupported(
                item.referenced,
                &ip,
                format!("not supported: a second regex for {header} (sonde's header_regex takes one per header)"),
            );
        } else if header_regex.len() == MAX_HEADER_REGEX {
            ctx.unsupported(
                item.referenced,
                &ip,
                format!("not supported: sonde checks at most {MAX_HEADER_REGEX} headers"),
            );
        } else if let Some(re) = ctx.regex(item, &ip, &re) {
            header_regex.insert(header, re.into());
        }
    }
}

/// The options the http plugin has nothing for, named when set: whether
/// `key` is one of them.
fn unsupported(ctx: &mut Ctx, key: &str, n: &Node, p: &str) -> bool {
    match key {
        "compression" => {
            if ctx.string(n, p).is_some_and(|c| !c.is_empty()) {
                ctx.unsupported(
                    n.referenced,
                    p,
                    "not supported: sonde's http plugin does not decompress a body",
                );
            }
        }
        "valid_http_versions" => {
            if !ctx.items(n, p).is_empty() {
                ctx.unsupported(
                    n.referenced,
                    p,
                    "not supported: sonde's http plugin does not check the HTTP version",
                );
            }
        }
        "body_size_limit" => {
            if !matches!(n.value, super::tree::Value::Int(0) | super::tree::Value::Null) {
                ctx.unsupported(
                    n.referenced,
                    p,
                    "not supported: sonde reads at most max_body bytes (10 KiB) and ignores the rest, where blackbox_exporter fails past the limit",
                );
            }
        }
        "body_file"
        | "bearer_token_file"
        | "oauth2"
        | "proxy_url"
        | "no_proxy"
        | "proxy_connect_header"
        | "http_headers"
        | "fail_if_body_json_matches_cel"
        | "fail_if_body_json_not_matches_cel" => {
            if !matches!(n.value, super::tree::Value::Null) {
                ctx.unsupported(n.referenced, p, "not supported");
            }
        }
        _ => return false,
    }
    true
}

/// A boolean sonde honours only at blackbox_exporter's default.
fn default_only(ctx: &mut Ctx, node: &Node, path: &str, default: bool, why: &str) {
    if let Some(v) = ctx.boolean(node, path)
        && v != default
    {
        ctx.unsupported(node.referenced, path, format!("{v} is not supported: {why}"));
    }
}

/// One credential per module, as blackbox_exporter demands.
fn set_credential(
    ctx: &mut Ctx,
    credential: &mut Option<Credential>,
    value: String,
    at: serde_saphyr::Location,
    path: &str,
) {
    if let Some(first) = credential {
        ctx.invalid(
            at,
            path,
            format!(
                "at most one of basic_auth, bearer_token and authorization (also {})",
                first.path
            ),
        );
        return;
    }
    *credential = Some(Credential {
        value,
        path: path.to_string(),
        at,
    });
}

/// `http_header_match_spec`: the header, the regex and `allow_missing`.
fn header_spec(ctx: &mut Ctx, node: &Node, path: &str) -> Option<(String, String, bool)> {
    let (mut header, mut regexp, mut allow_missing) = (None, None, false);
    for e in ctx.entries(node, path) {
        match e.key {
            "header" => header = ctx.string(e.node, &e.path),
            "regexp" => regexp = ctx.string(e.node, &e.path),
            "allow_missing" => allow_missing = ctx.boolean(e.node, &e.path).unwrap_or(false),
            _ => ctx.invalid(e.at, &e.path, "unknown key (header, regexp, allow_missing)"),
        }
    }
    match (header.filter(|h| !h.is_empty()), regexp) {
        (Some(h), Some(r)) => Some((h, r, allow_missing)),
        _ => {
            ctx.invalid(node.referenced, path, "needs both header and regexp");
            None
        }
    }
}

/// `basic_auth` as an `Authorization: Basic` value.
fn basic_auth(ctx: &mut Ctx, node: &Node, path: &str) -> Option<String> {
    let (mut user, mut password) = (String::new(), String::new());
    let mut whole = true;
    for e in ctx.entries(node, path) {
        match e.key {
            "username" => user = ctx.string(e.node, &e.path).unwrap_or_default(),
            "password" => password = ctx.string(e.node, &e.path).unwrap_or_default(),
            "password_file" | "username_file" | "password_ref" | "username_ref" => {
                whole = false;
                ctx.unsupported(
                    e.node.referenced,
                    &e.path,
                    "not supported: sonde has no credential files; give the value (it is written into the header)",
                );
            }
            _ => ctx.invalid(e.at, &e.path, "unknown key of basic_auth"),
        }
    }
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    whole.then(|| format!("Basic {encoded}"))
}

/// `authorization: {type, credentials}` as an `Authorization` value.
fn authorization(ctx: &mut Ctx, node: &Node, path: &str) -> Option<String> {
    let (mut kind, mut credentials) = ("Bearer".to_string(), None);
    for e in ctx.entries(node, path) {
        match e.key {
            "type" => {
                if let Some(t) = ctx.string(e.node, &e.path).filter(|t| !t.is_empty()) {
                    kind = t;
                }
            }
            "credentials" => credentials = ctx.string(e.node, &e.path),
            "credentials_file" | "credentials_ref" => ctx.unsupported(
                e.node.referenced,
                &e.path,
                "not supported: sonde has no credential files; give credentials (they are written into the header)",
            ),
            _ => ctx.invalid(e.at, &e.path, "unknown key of authorization"),
        }
    }
    credentials.map(|c| format!("{kind} {c}"))
}
