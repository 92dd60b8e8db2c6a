//! What several of blackbox_exporter's probers share, read into what a
//! module maps to ([`Out`]): `preferred_ip_protocol`, `tls_config` and the
//! credential files read as sonde secrets.

use super::tree::Node;
use super::walk::Ctx;
use serde_json::{Map, Value as Json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// What a prober's block maps to: the plugin's config, the files it reads
/// and the secrets it uses.
#[derive(Debug, Default)]
pub(crate) struct Out {
    pub config: Map<String, Json>,
    pub files: BTreeSet<PathBuf>,
    pub secrets: BTreeMap<String, PathBuf>,
    /// `preferred_ip_protocol` (`ip4` or `ip6`) and `ip_protocol_fallback`,
    /// as written.
    pub ip_protocol: (Option<&'static str>, Option<bool>),
}

/// The IP-version keys of the http, tcp, grpc and dns probers, into
/// `out.ip_protocol`: `grants.ip_protocol` orders the addresses a name
/// leads to, and without fallback holds the probe to that version.
pub(crate) fn ip_protocol(ctx: &mut Ctx, key: &str, node: &Node, path: &str, out: &mut Out) {
    match key {
        "preferred_ip_protocol" => match ctx.string(node, path).as_deref() {
            Some("") | None => {}
            Some("ip4" | "ipv4" | "tcp4" | "udp4") => out.ip_protocol.0 = Some("ip4"),
            Some("ip6" | "ipv6" | "tcp6" | "udp6") => out.ip_protocol.0 = Some("ip6"),
            Some(other) => ctx.invalid(node.referenced, path, format!("{other:?}: give ip4 or ip6")),
        },
        _ => out.ip_protocol.1 = ctx.boolean(node, path),
    }
}

/// `tls_config`, into the keys sonde's plugins share (`insecure_skip_verify`,
/// `ca_file`, `ca_pem`, `server_name`).
pub(crate) fn tls_config(ctx: &mut Ctx, node: &Node, path: &str, out: &mut Out) {
    let mut insecure = false;
    let mut ca: Option<(&'static str, String, Option<PathBuf>)> = None;
    let (mut cert, mut key) = (None, None);
    for e in ctx.entries(node, path) {
        match e.key {
            "insecure_skip_verify" => insecure = ctx.boolean(e.node, &e.path).unwrap_or(false),
            "server_name" => {
                if let Some(name) = ctx.string(e.node, &e.path).filter(|s| !s.is_empty()) {
                    out.config.insert("server_name".into(), name.into());
                }
            }
            "ca_file" | "ca" => {
                let Some(value) = ctx.string(e.node, &e.path).filter(|s| !s.is_empty()) else {
                    continue;
                };
                if ca.is_some() {
                    ctx.invalid(e.at, &e.path, "ca and ca_file together: give one");
                } else if e.key == "ca" {
                    ca = Some(("ca_pem", value, None));
                } else if let Some(dir) = ca_dir(ctx, e.node, &e.path, &value) {
                    ca = Some(("ca_file", value, Some(dir)));
                }
            }
            // A client certificate: each file as a secret (the host
            // presents it; the plugin never holds the key).
            "cert_file" => cert = file_secret(ctx, e.node, &e.path, out),
            "key_file" => key = file_secret(ctx, e.node, &e.path, out),
            "cert" | "key" | "cert_ref" | "key_ref" | "ca_ref" => {
                ctx.unsupported_if_set(
                    e.node,
                    &e.path,
                    "not supported: give the client certificate as cert_file and key_file",
                );
            }
            "min_version" => match ctx.string(e.node, &e.path).as_deref() {
                // sonde's TLS client speaks TLS 1.2 and 1.3 only.
                None | Some("" | "TLS12") => {}
                Some(v) => ctx.unsupported(
                    e.node.referenced,
                    &e.path,
                    format!("{v} is not supported: sonde's TLS client speaks TLS 1.2 and 1.3, and takes no minimum"),
                ),
            },
            "max_version" => {
                ctx.unsupported_if_set(
                    e.node,
                    &e.path,
                    "not supported: sonde's TLS client takes no maximum version",
                );
            }
            _ => ctx.invalid(e.at, &e.path, "unknown key of tls_config"),
        }
    }
    if let (Some(cert), Some(key)) = (cert, key) {
        out.config
            .insert("client_cert".into(), serde_json::json!({"cert": cert, "key": key}));
    }
    if insecure {
        out.config.insert("insecure_skip_verify".into(), true.into());
        if ca.take().is_some() {
            ctx.note(
                path,
                "the CA is left out: with insecure_skip_verify, blackbox_exporter does not use it either",
            );
        }
    }
    if let Some((key, value, dir)) = ca {
        out.config.insert(key.into(), value.into());
        if let Some(dir) = dir {
            ctx.note(
                path,
                format_args!(
                    "grants.files gets {} so the plugin may read the CA (read-only)",
                    dir.display()
                ),
            );
            out.files.insert(dir);
        }
    }
}

/// The directory a `ca_file` is in, which the module's `files` grant must
/// name: it must be an absolute path in a directory that exists here.
fn ca_dir(ctx: &mut Ctx, node: &Node, path: &str, file: &str) -> Option<PathBuf> {
    let file = Path::new(file);
    let dir = file
        .parent()
        .filter(|d| file.is_absolute() && !d.as_os_str().is_empty());
    let Some(dir) = dir else {
        ctx.unsupported_module(
            node.referenced,
            path,
            format!(
                "{}: give an absolute path: sonde reads it through a files grant of its directory",
                file.display()
            ),
        );
        return None;
    };
    if !dir.is_dir() || sonde_core::catalog::mounts::pseudo_within(dir).is_some() {
        ctx.unsupported_module(
            node.referenced,
            path,
            format!(
                "{}: not a directory of ordinary files on this machine; sonde reads the CA through a files grant of it",
                dir.display()
            ),
        );
        return None;
    }
    Some(dir.to_path_buf())
}

/// A credential file as a sonde secret (`secrets.NAME.file`): the handle
/// that stands for it, `$(secret:NAME)`, and the secret in `out`. The file
/// must be an absolute path here: `sonde validate` reads it.
pub(crate) fn file_secret(ctx: &mut Ctx, n: &Node, p: &str, out: &mut Out) -> Option<String> {
    let file = ctx.string(n, p).filter(|f| !f.is_empty())?;
    let path = std::path::PathBuf::from(&file);
    if !path.is_absolute() || !path.is_file() {
        ctx.unsupported_module(
            n.referenced,
            p,
            format!("{file}: not a file on this machine: sonde reads it as a secret (secrets.NAME.file), so give its absolute path here"),
        );
        return None;
    }
    let name: String = p
        .trim_start_matches("modules.")
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-' | '_' | '.') => c,
            _ => '-',
        })
        .collect();
    let name: String = name.trim_start_matches(['-', '_', '.']).chars().take(63).collect();
    ctx.note(
        p,
        format_args!("read as the secret {name} (secrets.{name}.file: {file})"),
    );
    out.secrets.insert(name.clone(), path);
    Some(format!("$(secret:{name})"))
}
