//! Handles: how a plugin names a secret in text it hands the host.
//!
//! - `$(secret:NAME)` stands for the bytes of the secret `NAME`;
//! - `$(base64:...)` stands for the standard base64 of what it encloses:
//!   text (without `)`) and `$(secret:NAME)` handles, so that
//!   `Basic $(base64:alice:$(secret:pw))` is an HTTP basic-auth value.
//!
//! Any other `$(` is plain text. A malformed handle (`$(secret:` without
//! its `)`, a bad name, a nested `$(base64:`) is an error that names it,
//! so a typo is not sent as text.

use super::cell::{SecretValue, valid_name};
use base64::Engine as _;
use std::sync::Arc;
use zeroize::Zeroizing;

const SECRET: &str = "$(secret:";
const BASE64: &str = "$(base64:";

/// Part of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Secret(String),
    Base64(Vec<Piece>),
}

/// A text with handles in it, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template(Vec<Piece>);

/// A malformed handle.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TemplateError(String);

/// Whether `text` holds a handle (well-formed or not).
pub fn has_handle(text: &str) -> bool {
    text.contains(SECRET) || text.contains(BASE64)
}

impl Template {
    /// Parses `text`; `None` when it holds no handle (the common case,
    /// which costs one search).
    pub fn parse(text: &str) -> Result<Option<Self>, TemplateError> {
        if !has_handle(text) {
            return Ok(None);
        }
        let (pieces, rest) = parse_pieces(text, false)?;
        debug_assert!(rest.is_empty());
        Ok(Some(Self(pieces)))
    }

    /// The names of the secrets it uses, in order, repeated as written.
    pub fn names(&self) -> Vec<&str> {
        fn walk<'a>(pieces: &'a [Piece], out: &mut Vec<&'a str>) {
            for p in pieces {
                match p {
                    Piece::Text(_) => {}
                    Piece::Secret(n) => out.push(n),
                    Piece::Base64(inner) => walk(inner, out),
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.0, &mut out);
        out
    }

    /// The bytes it stands for, with `value` giving each secret's bytes,
    /// and what a peer could echo of them besides each secret itself: the
    /// text each `$(base64:...)` encoded (so its whole base64 is scrubbed,
    /// not only the characters that are the secret's alone). A value
    /// without one adds nothing: its every form holds the secret's.
    pub fn expand<E>(&self, mut value: impl FnMut(&str) -> Result<Arc<SecretValue>, E>) -> Result<Expanded, E> {
        let mut echoes = Vec::new();
        let bytes = expand_pieces(&self.0, &mut value, &mut echoes)?;
        Ok(Expanded { bytes, echoes })
    }
}

/// A template's bytes, and the derived bytes a peer could echo.
pub struct Expanded {
    /// What goes on the wire.
    pub bytes: Zeroizing<Vec<u8>>,
    /// What to scrub from answers besides the secrets themselves.
    pub echoes: Vec<Zeroizing<Vec<u8>>>,
}

impl std::fmt::Debug for Expanded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Expanded(<secret>)")
    }
}

fn expand_pieces<E>(
    pieces: &[Piece],
    value: &mut impl FnMut(&str) -> Result<Arc<SecretValue>, E>,
    echoes: &mut Vec<Zeroizing<Vec<u8>>>,
) -> Result<Zeroizing<Vec<u8>>, E> {
    let mut out = Zeroizing::new(Vec::new());
    for p in pieces {
        match p {
            Piece::Text(t) => out.extend_from_slice(t.as_bytes()),
            Piece::Secret(name) => out.extend_from_slice(value(name)?.expose()),
            Piece::Base64(inner) => {
                let raw = expand_pieces(inner, value, echoes)?;
                let encoded = Zeroizing::new(base64::engine::general_purpose::STANDARD.encode(&*raw).into_bytes());
                out.extend_from_slice(&encoded);
                echoes.push(raw);
            }
        }
    }
    Ok(out)
}

/// Parses pieces up to the end, or (`inside`) up to the `)` closing a
/// `$(base64:`, returning what follows it.
fn parse_pieces(mut text: &str, inside: bool) -> Result<(Vec<Piece>, &str), TemplateError> {
    let mut pieces = Vec::new();
    let mut literal = String::new();
    loop {
        let next_handle = [text.find(SECRET), text.find(BASE64)].into_iter().flatten().min();
        let close = if inside { text.find(')') } else { None };
        match (next_handle, close) {
            (_, Some(c)) if next_handle.is_none_or(|h| c < h) => {
                literal.push_str(&text[..c]);
                push_text(&mut pieces, &mut literal);
                return Ok((pieces, &text[c + 1..]));
            }
            (Some(h), _) => {
                literal.push_str(&text[..h]);
                push_text(&mut pieces, &mut literal);
                let rest = &text[h..];
                if let Some(after) = rest.strip_prefix(SECRET) {
                    let Some(end) = after.find(')') else {
                        return Err(TemplateError(format!("{:?} has no closing `)`", short(rest))));
                    };
                    let name = &after[..end];
                    if !valid_name(name) {
                        return Err(TemplateError(format!(
                            "secret handle {:?}: {name:?} is not a secret name (1 to 63 of a-z, 0-9, `-`, `_`, `.`)",
                            &rest[..SECRET.len() + end + 1]
                        )));
                    }
                    pieces.push(Piece::Secret(name.to_string()));
                    text = &after[end + 1..];
                } else {
                    let after = &rest[BASE64.len()..];
                    if inside {
                        return Err(TemplateError("`$(base64:` cannot enclose another `$(base64:`".into()));
                    }
                    let (inner, tail) = parse_pieces(after, true)?;
                    pieces.push(Piece::Base64(inner));
                    text = tail;
                }
            }
            (None, _) if inside => {
                return Err(TemplateError(format!("{:?} has no closing `)`", short(text))));
            }
            (None, _) => {
                literal.push_str(text);
                push_text(&mut pieces, &mut literal);
                return Ok((pieces, ""));
            }
        }
    }
}

fn push_text(pieces: &mut Vec<Piece>, literal: &mut String) {
    if !literal.is_empty() {
        pieces.push(Piece::Text(std::mem::take(literal)));
    }
}

/// The start of `text`, for a message.
fn short(text: &str) -> &str {
    let mut end = text.len().min(40);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(name: &str) -> Result<Arc<SecretValue>, String> {
        match name {
            "pw" => Ok(Arc::new(SecretValue::new(b"p4ssw0rd-xyz".to_vec()).unwrap())),
            "token" => Ok(Arc::new(SecretValue::new(b"tok-123456789".to_vec()).unwrap())),
            other => Err(format!("no {other}")),
        }
    }

    fn expand(text: &str) -> Result<Option<Vec<u8>>, String> {
        match Template::parse(text).map_err(|e| e.0)? {
            None => Ok(None),
            Some(t) => Ok(Some(t.expand(value)?.bytes.to_vec())),
        }
    }

    #[test]
    fn handles_stand_for_secrets_and_their_base64() {
        assert_eq!(expand("plain $(HOME) text"), Ok(None));
        assert_eq!(
            expand("Bearer $(secret:token)").unwrap().unwrap(),
            b"Bearer tok-123456789"
        );
        let basic = expand("Basic $(base64:alice:$(secret:pw))").unwrap().unwrap();
        assert_eq!(basic, b"Basic YWxpY2U6cDRzc3cwcmQteHl6");
        assert_eq!(expand("$(base64:x)").unwrap().unwrap(), b"eA==");
        assert_eq!(expand("$(secret:nope)"), Err("no nope".into()));
        let t = Template::parse("a$(secret:pw)b$(base64:$(secret:token))")
            .unwrap()
            .unwrap();
        assert_eq!(t.names(), ["pw", "token"]);
        let e = t.expand(value).unwrap();
        assert_eq!(e.echoes.len(), 1, "the base64's input");
        let plain = Template::parse("Bearer $(secret:token)").unwrap().unwrap();
        assert!(plain.expand(value).unwrap().echoes.is_empty());
    }

    #[test]
    fn malformed_handles_are_named() {
        let err = |t: &str| Template::parse(t).unwrap_err().0;
        assert_eq!(err("x $(secret:pw"), "\"$(secret:pw\" has no closing `)`");
        assert!(
            err("$(secret:PW)").contains("\"PW\" is not a secret name"),
            "{}",
            err("$(secret:PW)")
        );
        assert_eq!(err("$(base64:a"), "\"a\" has no closing `)`");
        assert!(err("$(base64:$(base64:a))").contains("cannot enclose"));
    }
}
