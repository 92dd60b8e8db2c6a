//! A YAML document as a tree whose every node keeps its line and column,
//! so the import can name each key it refuses with its place, all of them
//! at once (a typed struct with `deny_unknown_fields` stops at the first).

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;
use std::fmt;

/// One node and where it is.
pub(crate) type Node = Spanned<Value>;

/// A node's value. Scalars keep the type YAML gave them: `5s` is a
/// string, `200` an integer, `true` a boolean, a quoted `"200"` a string.
#[derive(Debug)]
pub(crate) enum Value {
    /// `~`, `null` or nothing.
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    /// A `!!binary` scalar, decoded (Go's YAML reads it into a string
    /// field as its bytes).
    Bytes(Vec<u8>),
    Seq(Vec<Node>),
    /// Entries in file order, duplicates kept (the walker refuses them).
    Map(Vec<(Spanned<String>, Node)>),
}

impl Value {
    /// What the value is, for a message.
    pub(crate) fn what(&self) -> &'static str {
        match self {
            Self::Null => "null",
            Self::Bool(_) => "a boolean",
            Self::Int(_) => "an integer",
            Self::Float(_) => "a number",
            Self::Str(_) => "a string",
            Self::Bytes(_) => "binary data",
            Self::Seq(_) => "a list",
            Self::Map(_) => "a mapping",
        }
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ValueVisitor)
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a YAML value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        Value::deserialize(d)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Int(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        i64::try_from(v).map(Value::Int).or(Ok(Value::Float(v as f64)))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(Value::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::Str(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::Str(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Node>()? {
            items.push(item);
        }
        Ok(Value::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<Spanned<KeyText>>()? {
            let value = map.next_value::<Node>()?;
            let key = Spanned::new(key.value.0, key.referenced, key.defined);
            entries.push((key, value));
        }
        Ok(Value::Map(entries))
    }
}

/// A mapping key as text: blackbox_exporter's keys are strings, and a
/// number or boolean used as a key (a header named `1`) reads as its text.
struct KeyText(String);

impl<'de> Deserialize<'de> for KeyText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::Str(s) => Ok(Self(s)),
            Value::Int(i) => Ok(Self(i.to_string())),
            Value::Float(f) => Ok(Self(f.to_string())),
            Value::Bool(b) => Ok(Self(b.to_string())),
            Value::Null => Ok(Self("null".into())),
            other => Err(de::Error::custom(format!("a key must be text, not {}", other.what()))),
        }
    }
}

/// Parses `text`: the document's root node, or the parser's message and
/// its line and column (0 when unknown).
pub(crate) fn parse(text: &str) -> Result<Node, (String, u64, u64)> {
    // A `!!binary` scalar comes as its base64 text, decoded below: the
    // parser would decode it only into text, and refuses bytes that are
    // not UTF-8 (0.28's `postgresql` module sends some).
    let options = serde_saphyr::options! { ignore_binary_tag_for_string: true };
    let mut root = serde_saphyr::from_str_with_options::<Node>(text, options).map_err(|e| {
        let (line, column) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
        let message = e.to_string();
        let first = message
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .unwrap_or("invalid YAML");
        let first = first.trim_start_matches("error: ");
        // The place is said once, before the message; the parser's hint
        // names its own options, which are not the user's.
        let first = match first.split_once(": ") {
            Some((at, rest)) if at.starts_with("line ") && at.contains(" column ") => rest,
            _ => first,
        };
        let first = first.split(", set DuplicateKeyPolicy").next().unwrap_or(first);
        (first.to_string(), line, column)
    })?;
    let tags = binary_tags(text);
    if !tags.is_empty() {
        decode_binary(&mut root, &tags)?;
    }
    Ok(root)
}

/// Where each `!!binary` tag of `text` ends: its line, the column after it
/// (1-based, as the parser counts), and whether a block scalar (`|`, `>`)
/// follows it, whose text starts on the next line.
fn binary_tags(text: &str) -> Vec<(u64, u64, bool)> {
    let mut tags = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut from = 0;
        while let Some(at) = line[from..].find("!!binary") {
            let end = from + at + "!!binary".len();
            let column = line[..end].chars().count() as u64 + 1;
            let block = line[end..].trim_start().starts_with(['|', '>']);
            tags.push((i as u64 + 1, column, block));
            from = end;
        }
    }
    tags
}

/// Turns each string scalar a `!!binary` tag stands before (on its line, or
/// the next for a block scalar) into [`Value::Bytes`].
fn decode_binary(node: &mut Node, tags: &[(u64, u64, bool)]) -> Result<(), (String, u64, u64)> {
    use base64::Engine as _;
    let (line, column) = (node.referenced.line(), node.referenced.column());
    match &mut node.value {
        Value::Str(s) => {
            let tagged = tags
                .iter()
                .any(|&(l, c, block)| (l == line && c <= column) || (block && l + 1 == line));
            if tagged {
                let text: String = s.chars().filter(|c| !c.is_ascii_whitespace()).collect();
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(text.as_bytes())
                    .map_err(|e| (format!("!!binary: not base64 ({e})"), line, column))?;
                node.value = Value::Bytes(bytes);
            }
        }
        Value::Seq(items) => {
            for item in items {
                decode_binary(item, tags)?;
            }
        }
        Value::Map(entries) => {
            for (_, value) in entries {
                decode_binary(value, tags)?;
            }
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(node: &Node) -> &[(Spanned<String>, Node)] {
        match &node.value {
            Value::Map(m) => m,
            other => panic!("not a map: {other:?}"),
        }
    }

    #[test]
    fn scalars_keep_their_yaml_type_and_every_node_its_place() {
        let root =
            parse("modules:\n  a:\n    timeout: 5s\n    codes: [200, \"300\"]\n    on: true\n    n: ~\n").unwrap();
        let (key, modules) = &map(&root)[0];
        assert_eq!((key.value.as_str(), key.referenced.line()), ("modules", 1));
        let a = map(&map(modules)[0].1);
        assert_eq!(a[0].0.value, "timeout");
        assert_eq!((a[0].0.referenced.line(), a[0].0.referenced.column()), (3, 5));
        assert!(matches!(&a[0].1.value, Value::Str(s) if s == "5s"));
        let Value::Seq(codes) = &a[1].1.value else { panic!() };
        assert!(matches!(codes[0].value, Value::Int(200)));
        assert!(matches!(&codes[1].value, Value::Str(s) if s == "300"));
        assert_eq!(codes[1].referenced.line(), 4);
        assert!(matches!(a[2].1.value, Value::Bool(true)));
        assert!(matches!(a[3].1.value, Value::Null));
    }

    #[test]
    fn binary_scalars_are_decoded_and_nothing_else_is() {
        let root = parse("a:\n  - send: !!binary AAAACATSFi8= # SSLRequest\n  - send: AAAACATSFi8=\n  - b: !!binary |\n      SGk=\n  - c: SGk=\n").unwrap();
        let (_, a) = &map(&root)[0];
        let Value::Seq(items) = &a.value else { panic!() };
        let value = |i: usize| &map(&items[i])[0].1.value;
        assert!(matches!(value(0), Value::Bytes(b) if b == &[0, 0, 0, 8, 4, 0xd2, 0x16, 0x2f]));
        assert!(matches!(value(1), Value::Str(s) if s == "AAAACATSFi8="));
        assert!(matches!(value(2), Value::Bytes(b) if b == b"Hi"));
        assert!(matches!(value(3), Value::Str(s) if s == "SGk="));
        assert!(parse("a: !!binary not*base64\n").is_err());
    }

    #[test]
    fn broken_yaml_is_placed() {
        let (message, line, _) = parse("modules:\n  a: [1, 2\n").unwrap_err();
        assert!(line >= 2, "{message} at {line}");
        let (message, line, column) = parse("a:\n  b: 1\n  b: 2\n").unwrap_err();
        assert_eq!((message.as_str(), line, column), ("duplicate mapping key: b", 3, 3));
    }
}
