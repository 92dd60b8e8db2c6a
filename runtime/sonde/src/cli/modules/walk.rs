//! Walking a blackbox_exporter file: each key with its path
//! (`modules.http_2xx.http.method`) and place, every problem collected.

use super::tree::{Node, Value};
use serde_saphyr::{Location, Spanned};

/// How bad a problem is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Severity {
    /// blackbox_exporter itself would refuse it (an unknown key, a wrong
    /// type): the import is refused, `--skip-unsupported` or not.
    Invalid,
    /// sonde cannot honour the option; `--skip-unsupported` leaves the
    /// option out.
    Unsupported,
    /// sonde cannot honour the option, and the module is no check without
    /// it; `--skip-unsupported` leaves the whole module out.
    UnsupportedModule,
}

/// One problem, named by its key path.
#[derive(Clone, Debug)]
pub(crate) struct Problem {
    pub line: u64,
    pub column: u64,
    /// `modules.http_post_2xx.http.oauth2`.
    pub path: String,
    pub message: String,
    pub severity: Severity,
}

impl Problem {
    /// `FILE:LINE:COLUMN: PATH: MESSAGE`.
    pub(crate) fn render(&self, file: &str) -> String {
        let place = if self.line == 0 {
            file.to_string()
        } else {
            format!("{file}:{}:{}", self.line, self.column)
        };
        format!("{place}: {}: {}", self.path, self.message)
    }
}

/// The problems and notes found so far.
#[derive(Debug, Default)]
pub(crate) struct Ctx {
    pub problems: Vec<Problem>,
    /// What the import did that a reader should know (a credential put
    /// inline, a setting blackbox_exporter ignores).
    pub notes: Vec<String>,
}

/// A key of a mapping, its value and its path.
pub(crate) struct Entry<'a> {
    pub key: &'a str,
    pub at: Location,
    pub node: &'a Node,
    pub path: String,
}

impl Ctx {
    fn push(&mut self, at: Location, path: &str, message: String, severity: Severity) {
        self.problems.push(Problem {
            line: at.line(),
            column: at.column(),
            path: path.to_string(),
            message,
            severity,
        });
    }

    pub(crate) fn invalid(&mut self, at: Location, path: &str, message: impl Into<String>) {
        self.push(at, path, message.into(), Severity::Invalid);
    }

    pub(crate) fn unsupported(&mut self, at: Location, path: &str, message: impl Into<String>) {
        self.push(at, path, message.into(), Severity::Unsupported);
    }

    pub(crate) fn unsupported_module(&mut self, at: Location, path: &str, message: impl Into<String>) {
        self.push(at, path, message.into(), Severity::UnsupportedModule);
    }

    pub(crate) fn note(&mut self, path: &str, message: impl std::fmt::Display) {
        self.notes.push(format!("{path}: {message}"));
    }

    /// The entries of a mapping (null reads as an empty one, as Go's YAML
    /// reads it), each key once: a repeated key is refused.
    pub(crate) fn entries<'a>(&mut self, node: &'a Node, path: &str) -> Vec<Entry<'a>> {
        let items: &[(Spanned<String>, Node)] = match &node.value {
            Value::Map(m) => m,
            Value::Null => &[],
            other => {
                self.invalid(
                    node.referenced,
                    path,
                    format!("expected a mapping, found {}", other.what()),
                );
                &[]
            }
        };
        let mut out: Vec<Entry<'a>> = Vec::new();
        for (key, value) in items {
            let entry_path = format!("{path}.{}", key.value);
            if out.iter().any(|e| e.key == key.value) {
                self.invalid(key.referenced, &entry_path, "the key is given twice");
                continue;
            }
            out.push(Entry {
                key: &key.value,
                at: key.referenced,
                node: value,
                path: entry_path,
            });
        }
        out
    }

    /// The items of a list (null reads as an empty one), each with its path.
    pub(crate) fn items<'a>(&mut self, node: &'a Node, path: &str) -> Vec<(String, &'a Node)> {
        match &node.value {
            Value::Seq(items) => items
                .iter()
                .enumerate()
                .map(|(i, n)| (format!("{path}[{i}]"), n))
                .collect(),
            Value::Null => Vec::new(),
            other => {
                self.invalid(
                    node.referenced,
                    path,
                    format!("expected a list, found {}", other.what()),
                );
                Vec::new()
            }
        }
    }

    /// A string (a number or boolean written bare reads as its text, as
    /// Go's YAML reads it into a string field).
    pub(crate) fn string(&mut self, node: &Node, path: &str) -> Option<String> {
        match &node.value {
            Value::Str(s) => Some(s.clone()),
            Value::Int(i) => Some(i.to_string()),
            Value::Float(f) => Some(f.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            Value::Null => Some(String::new()),
            Value::Bytes(b) => match std::str::from_utf8(b) {
                Ok(text) => Some(text.to_string()),
                Err(_) => {
                    self.unsupported(
                        node.referenced,
                        path,
                        "binary data that is not UTF-8 text is not supported here",
                    );
                    None
                }
            },
            other => {
                self.invalid(
                    node.referenced,
                    path,
                    format!("expected a string, found {}", other.what()),
                );
                None
            }
        }
    }

    /// Bytes: a `!!binary` scalar's, or a string's (as [`Ctx::string`]).
    pub(crate) fn bytes(&mut self, node: &Node, path: &str) -> Option<Vec<u8>> {
        match &node.value {
            Value::Bytes(b) => Some(b.clone()),
            _ => self.string(node, path).map(String::into_bytes),
        }
    }

    /// A boolean (null reads as false).
    pub(crate) fn boolean(&mut self, node: &Node, path: &str) -> Option<bool> {
        match &node.value {
            Value::Bool(b) => Some(*b),
            Value::Null => Some(false),
            other => {
                self.invalid(
                    node.referenced,
                    path,
                    format!("expected true or false, found {}", other.what()),
                );
                None
            }
        }
    }

    /// An integer.
    pub(crate) fn integer(&mut self, node: &Node, path: &str) -> Option<i64> {
        match &node.value {
            Value::Int(i) => Some(*i),
            other => {
                self.invalid(
                    node.referenced,
                    path,
                    format!("expected an integer, found {}", other.what()),
                );
                None
            }
        }
    }

    /// A string option sonde has no use for: unsupported, with `why`, when
    /// it is set to anything but the empty string (blackbox_exporter's
    /// default).
    pub(crate) fn unsupported_if_set(&mut self, node: &Node, path: &str, why: &str) {
        if self.string(node, path).is_some_and(|s| !s.is_empty()) {
            self.unsupported(node.referenced, path, why);
        }
    }

    /// A list of strings.
    pub(crate) fn strings<'a>(&mut self, node: &'a Node, path: &str) -> Vec<(String, String, &'a Node)> {
        self.items(node, path)
            .into_iter()
            .filter_map(|(p, n)| self.string(n, &p).map(|s| (p, s, n)))
            .collect()
    }

    /// A regex as sonde's plugins compile it (`sonde_regex`: Go's
    /// syntax): `None`, with the problem, when it does not compile.
    pub(crate) fn regex(&mut self, node: &Node, path: &str, pattern: &str) -> Option<String> {
        match sonde_regex::compile(pattern) {
            Ok(_) => Some(pattern.to_string()),
            Err(why) => {
                self.unsupported(
                    node.referenced,
                    path,
                    format!("{pattern:?} is not a regex sonde's plugins accept ({why})"),
                );
                None
            }
        }
    }
}
