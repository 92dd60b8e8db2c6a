//! blackbox_exporter's `http` prober, into the config of sonde's `http`
//! plugin (its schema: `plugins/http/src/schema.json`).

use super::options::{Out, file_secret, ip_protocol, tls_config};
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
    let mut header_not_regex = Map::new();
    let mut allow_missing: Vec<(String, bool)> = Vec::new();
    let mut compression = None;
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
            "fail_if_header_matches" => header_rules(ctx, n, p, &mut header_not_regex, &mut allow_missing),
            "fail_if_header_not_matches" => header_rules(ctx, n, p, &mut header_regex, &mut allow_missing),
            "http_headers" => http_headers(ctx, n, p, &mut headers, out),
            "body_file" => body_file(ctx, n, p, out),
            "compression" => {
                compression = ctx
                    .string(n, p)
                    .filter(|c| !c.is_empty() && c != "identity")
                    .map(|c| (c, n.referenced, p.to_string()));
            }
            "tls_config" => tls_config(ctx, n, p, out),
            "basic_auth" => {
                if let Some(value) = basic_auth(ctx, n, p, out) {
                    set_credential(ctx, &mut credential, value, e.at, p);
                }
            }
            "bearer_token_file" => {
                if let Some(handle) = file_secret(ctx, n, p, out) {
                    set_credential(ctx, &mut credential, format!("Bearer {handle}"), e.at, p);
                }
            }
            "bearer_token" => {
                if let Some(token) = ctx.string(n, p).filter(|t| !t.is_empty()) {
                    set_credential(ctx, &mut credential, format!("Bearer {token}"), e.at, p);
                }
            }
            "authorization" => {
                if let Some(value) = authorization(ctx, n, p, out) {
                    set_credential(ctx, &mut credential, value, e.at, p);
                }
            }
            key if switch(ctx, key, n, p, out) => {}
            key if unsupported(ctx, key, n, p, out) => {}
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
            header_not_regex,
            allow_missing,
            compression,
        },
    );
}

/// The keys of `http:` that turn one behaviour on or off (or choose the
/// IP version); `false` when `key` is none of them.
fn switch(ctx: &mut Ctx, key: &str, n: &Node, p: &str, out: &mut Out) -> bool {
    match key {
        "preferred_ip_protocol" | "ip_protocol_fallback" => ip_protocol(ctx, key, n, p, out),
        "follow_redirects" | "no_follow_redirects" => {
            if ctx.boolean(n, p) == Some(key == "no_follow_redirects") {
                out.config.insert("follow_redirects".into(), false.into());
            }
        }
        "fail_if_ssl" | "fail_if_not_ssl" => default_only(ctx, n, p, false, "sonde's http plugin has no such check"),
        "skip_resolve_phase_with_proxy" | "proxy_from_environment" => {
            default_only(ctx, n, p, false, "sonde connects to targets directly, through no proxy");
        }
        // On by default in both; only its absence is written.
        "enable_http2" => {
            if ctx.boolean(n, p) == Some(false) {
                out.config.insert("enable_http2".into(), false.into());
            }
        }
        "enable_http3" => default_only(ctx, n, p, false, "sonde's host speaks no HTTP/3"),
        _ => return false,
    }
    true
}

/// What `http:` gave that becomes one config key after the whole block.
struct Found {
    codes: Vec<Json>,
    headers: Map<String, Json>,
    credential: Option<Credential>,
    header_regex: Map<String, Json>,
    header_not_regex: Map<String, Json>,
    /// Each header of either map, and whether its absence passes.
    allow_missing: Vec<(String, bool)>,
    /// `compression`, where it is.
    compression: Option<(String, serde_saphyr::Location, String)>,
}

/// The keys gathered over the block, into `out`: the credential as an
/// `Authorization` header, the headers, the status codes, the header regexes.
fn finish(ctx: &mut Ctx, out: &mut Out, found: Found) {
    let Found {
        codes,
        mut headers,
        credential,
        header_regex,
        header_not_regex,
        allow_missing,
        compression,
    } = found;
    if let Some((algorithm, at, path)) = compression {
        compress(ctx, out, &mut headers, &algorithm, at, &path);
    }
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
    if !header_not_regex.is_empty() {
        out.config
            .insert("header_not_regex".into(), Json::Object(header_not_regex));
    }
    let allowed: Vec<Json> = allow_missing
        .into_iter()
        .filter(|(_, allowed)| *allowed)
        .map(|(h, _)| h.into())
        .collect();
    if !allowed.is_empty() {
        out.config.insert("header_allow_missing".into(), allowed.into());
    }
}

/// `compression`: blackbox_exporter asks for it (`Accept-Encoding`) and
/// decodes the body. sonde's host hands the plugin the body as it came, so
/// only a module that reads no body imports, asking for the encoding.
fn compress(
    ctx: &mut Ctx,
    out: &mut Out,
    headers: &mut Map<String, Json>,
    algorithm: &str,
    at: serde_saphyr::Location,
    path: &str,
) {
    if ["body_regex", "body_not_regex", "body_size_limit"]
        .iter()
        .any(|k| out.config.contains_key(*k))
    {
        ctx.unsupported(
            at,
            path,
            "not supported with body checks: sonde's host does not decompress a body, so the checks would read it encoded",
        );
        return;
    }
    if !headers.keys().any(|k| k.eq_ignore_ascii_case("accept-encoding")) {
        headers.insert("Accept-Encoding".into(), algorithm.into());
    }
    ctx.note(
        path,
        "imported as an Accept-Encoding header: the body is not decompressed, and no check of the module reads it",
    );
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

/// `fail_if_header_matches` (into `header_not_regex`) or
/// `fail_if_header_not_matches` (into `header_regex`): one regex per header.
fn header_rules(
    ctx: &mut Ctx,
    n: &Node,
    p: &str,
    rules: &mut Map<String, Json>,
    allow_missing: &mut Vec<(String, bool)>,
) {
    for (ip, item) in ctx.items(n, p) {
        let Some((header, re, allowed)) = header_spec(ctx, item, &ip) else {
            continue;
        };
        let other = allow_missing.iter().find(|(h, _)| h.eq_ignore_ascii_case(&header));
        if rules.keys().any(|k| k.eq_ignore_ascii_case(&header)) {
            ctx.unsupported(
                item.referenced,
                &ip,
                format!("not supported: a second regex for {header} of the same kind (sonde takes one per header)"),
            );
        } else if other.is_some_and(|(_, a)| *a != allowed) {
            ctx.unsupported(
                item.referenced,
                &format!("{ip}.allow_missing"),
                format!("not supported: {header} with allow_missing both true and false (sonde's header_allow_missing is per header)"),
            );
        } else if allow_missing.len() >= MAX_HEADER_REGEX && other.is_none() {
            ctx.unsupported(
                item.referenced,
                &ip,
                format!("not supported: sonde checks at most {MAX_HEADER_REGEX} headers"),
            );
        } else if let Some(re) = ctx.regex(item, &ip, &re) {
            if other.is_none() {
                allow_missing.push((header.clone(), allowed));
            }
            rules.insert(header, re.into());
        }
    }
}

/// `http_headers`: each header's last value (as blackbox_exporter sends
/// it): a value or secret as written, a file as a sonde secret.
fn http_headers(ctx: &mut Ctx, n: &Node, p: &str, headers: &mut Map<String, Json>, out: &mut Out) {
    for h in ctx.entries(n, p) {
        let mut value = None;
        for kind in ctx.entries(h.node, &h.path) {
            match kind.key {
                "values" | "secrets" => {
                    if let Some((_, v, _)) = ctx.strings(kind.node, &kind.path).pop() {
                        value = Some(v);
                    }
                }
                "files" => {
                    if let Some((fp, _, item)) = ctx.strings(kind.node, &kind.path).pop() {
                        value = file_secret(ctx, item, &fp, out).or(value);
                    }
                }
                _ => ctx.invalid(kind.at, &kind.path, "unknown key (values, secrets, files)"),
            }
        }
        if let Some(v) = value {
            headers.insert(h.key.to_string(), v.into());
        }
    }
}

/// `body_file`: its text, read now (blackbox_exporter reads it as it loads
/// its config).
fn body_file(ctx: &mut Ctx, n: &Node, p: &str, out: &mut Out) {
    let Some(file) = ctx.string(n, p).filter(|f| !f.is_empty()) else {
        return;
    };
    match std::fs::read_to_string(&file) {
        Ok(body) => {
            ctx.note(p, format_args!("{file} is read now, into body"));
            out.config.insert("body".into(), body.into());
        }
        Err(e) => ctx.unsupported_module(
            n.referenced,
            p,
            format!("{file}: {e}: the importer reads the body into the module, so the file must be on this machine"),
        ),
    }
}

/// The options the http plugin has nothing for, or that map alone
/// (`valid_http_versions`, `body_size_limit`): whether `key` is one of them.
fn unsupported(ctx: &mut Ctx, key: &str, n: &Node, p: &str, out: &mut Out) -> bool {
    let set = !matches!(n.value, super::tree::Value::Null);
    match key {
        "valid_http_versions" => {
            let versions = ctx.strings(n, p);
            if versions.is_empty() {
            } else if versions.iter().any(|(_, v, _)| v == "HTTP/1.1") {
                ctx.note(p, "left out: sonde's host speaks HTTP/1.1, which the list accepts");
            } else {
                ctx.unsupported(
                    n.referenced,
                    p,
                    "not supported without HTTP/1.1: sonde's host speaks HTTP/1.1 and does not report the version",
                );
            }
        }
        "body_size_limit" => {
            if let Some(limit) = size(ctx, n, p).filter(|l| *l > 0) {
                out.config.insert("body_size_limit".into(), limit.into());
            }
        }
        "fail_if_body_json_matches_cel" | "fail_if_body_json_not_matches_cel" if set => ctx.unsupported_module(
            n.referenced,
            p,
            "not supported: sonde's http plugin runs without std in its sandbox, and has no CEL interpreter (use json: for fields that must equal a value)",
        ),
        "oauth2" if set => ctx.unsupported_module(
            n.referenced,
            p,
            "not supported: sonde's http plugin does not fetch OAuth 2.0 tokens (give a token as bearer_token, from a secret)",
        ),
        "proxy_url" | "no_proxy" | "proxy_connect_header" if set => ctx.unsupported(
            n.referenced,
            p,
            "not supported: sonde's host connects to targets directly, through no proxy",
        ),
        "fail_if_body_json_matches_cel"
        | "fail_if_body_json_not_matches_cel"
        | "oauth2"
        | "proxy_url"
        | "no_proxy"
        | "proxy_connect_header" => {}
        _ => return false,
    }
    true
}

/// A `<size>`: bytes as an integer, or with a unit (`10MB`: Go's
/// `units.Base2Bytes`, powers of 1024).
fn size(ctx: &mut Ctx, n: &Node, p: &str) -> Option<i64> {
    if let super::tree::Value::Int(i) = n.value {
        return Some(i);
    }
    let text = ctx.string(n, p)?;
    let digits = text.trim().trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &text.trim()[digits.len()..];
    let shift = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "KB" | "KIB" => 10,
        "MB" | "MIB" => 20,
        "GB" | "GIB" => 30,
        "TB" | "TIB" => 40,
        _ => 64,
    };
    match digits.trim().parse::<i64>() {
        Ok(v) if shift < 64 => v.checked_mul(1 << shift).or_else(|| {
            ctx.invalid(n.referenced, p, format!("{text:?}: too large"));
            None
        }),
        _ => {
            ctx.invalid(n.referenced, p, format!("{text:?} is not a size (10MB, 512KB, 1024)"));
            None
        }
    }
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

/// `basic_auth` as an `Authorization: Basic` value (a password file as a
/// secret's handle, which the host encodes: `$(base64:...)`).
fn basic_auth(ctx: &mut Ctx, node: &Node, path: &str, out: &mut Out) -> Option<String> {
    let (mut user, mut password) = (String::new(), String::new());
    let mut whole = true;
    for e in ctx.entries(node, path) {
        match e.key {
            "username" => user = ctx.string(e.node, &e.path).unwrap_or_default(),
            "password" => password = ctx.string(e.node, &e.path).unwrap_or_default(),
            "password_file" => match file_secret(ctx, e.node, &e.path, out) {
                Some(handle) => password = handle,
                None => whole = false,
            },
            "username_file" | "password_ref" | "username_ref" => {
                whole = false;
                ctx.unsupported(
                    e.node.referenced,
                    &e.path,
                    "not supported: give the user name itself, the password as password or password_file",
                );
            }
            _ => ctx.invalid(e.at, &e.path, "unknown key of basic_auth"),
        }
    }
    if password.starts_with("$(secret:") {
        return whole.then(|| format!("Basic $(base64:{user}:{password})"));
    }
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    whole.then(|| format!("Basic {encoded}"))
}

/// `authorization: {type, credentials}` as an `Authorization` value.
fn authorization(ctx: &mut Ctx, node: &Node, path: &str, out: &mut Out) -> Option<String> {
    let (mut kind, mut credentials) = ("Bearer".to_string(), None);
    for e in ctx.entries(node, path) {
        match e.key {
            "type" => {
                if let Some(t) = ctx.string(e.node, &e.path).filter(|t| !t.is_empty()) {
                    kind = t;
                }
            }
            "credentials" => credentials = ctx.string(e.node, &e.path),
            "credentials_file" => credentials = file_secret(ctx, e.node, &e.path, out),
            "credentials_ref" => ctx.unsupported(
                e.node.referenced,
                &e.path,
                "not supported: give credentials or credentials_file",
            ),
            _ => ctx.invalid(e.at, &e.path, "unknown key of authorization"),
        }
    }
    credentials.map(|c| format!("{kind} {c}"))
}
