//! sonde's one regex dialect.
//!
//! A pattern is written in Go's RE2 syntax, the one blackbox_exporter's
//! and node-problem-detector's users already write, and compiled by the
//! `regex` crate with every feature that syntax reaches. The built-in
//! plugins compile their patterns here, and the host checks a config's
//! patterns here (`sonde validate`, `sonde modules import`, the catalog's
//! schema check), so a pattern is refused at load exactly when a run would
//! refuse it.
//!
//! What a user meets (docs/plugins.md, "Regular expressions"):
//! - flags `(?i)`, `(?m)`, `(?s)`, `(?U)` and their groups, named groups
//!   `(?P<name>…)` and `(?<name>…)`, `\pL`, `\p{Greek}`, POSIX classes;
//! - `\d`, `\w`, `\s`, `\b` and their negations are ASCII as in Go (the
//!   regex crate's own are Unicode): `\d` is `[0-9]`, `\s` is
//!   `[\t\n\f\r ]`;
//! - `\Q…\E` quotes literal text; a `{` that does not start a repetition
//!   (`{"status":` in a JSON body) is a literal `{`, as in Go;
//! - refused, each with [`Error::Unsupported`]: `\C` (any byte; matching
//!   is on text), a repetition right after a flag group (`a(?i)*`, which
//!   Go reads as `a*`), a capture group name used twice.
//!
//! Bounds: a pattern of at most [`MAX_PATTERN`] bytes whose compiled form
//! fits [`SIZE_LIMIT`]; past either, a typed [`Error`].

#![no_std]

extern crate alloc;

use alloc::string::{String, ToString};
use core::fmt;

pub use regex::Regex;
pub use regex::bytes::Regex as BytesRegex;

/// The longest pattern accepted, in bytes.
pub const MAX_PATTERN: usize = 16 * 1024;

/// The largest compiled program, in bytes (the regex crate's own default,
/// stated here so the plugins and the host's checks agree on it).
pub const SIZE_LIMIT: usize = 10 * 1024 * 1024;

/// Why a pattern does not compile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// Longer than [`MAX_PATTERN`] bytes.
    TooLong {
        /// The pattern's length in bytes.
        len: usize,
    },
    /// Go syntax that matching on text cannot honour (`\C`).
    Unsupported {
        /// What was written.
        what: &'static str,
    },
    /// The regex crate refused it: a syntax error, or a compiled form
    /// larger than [`SIZE_LIMIT`].
    Syntax {
        /// The regex crate's description of the problem.
        why: String,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::TooLong { len } => write!(f, "{len} bytes long, over the {MAX_PATTERN}-byte limit"),
            Error::Unsupported { what } => write!(f, "{what} is not supported"),
            Error::Syntax { why } => f.write_str(why),
        }
    }
}

impl core::error::Error for Error {}

/// Compiles `pattern`, written in Go's syntax, to match text.
pub fn compile(pattern: &str) -> Result<Regex, Error> {
    build(pattern, |p| {
        regex::RegexBuilder::new(p).octal(true).size_limit(SIZE_LIMIT).build()
    })
}

/// Compiles `pattern`, written in Go's syntax, to match bytes (a TCP
/// stream's): the same dialect, on bytes that need not be UTF-8.
pub fn compile_bytes(pattern: &str) -> Result<BytesRegex, Error> {
    build(pattern, |p| {
        regex::bytes::RegexBuilder::new(p)
            .octal(true)
            .size_limit(SIZE_LIMIT)
            .build()
    })
}

fn build<R>(pattern: &str, compile: impl FnOnce(&str) -> Result<R, regex::Error>) -> Result<R, Error> {
    if pattern.len() > MAX_PATTERN {
        return Err(Error::TooLong { len: pattern.len() });
    }
    compile(&translate(pattern)?).map_err(|e| {
        // The regex crate's message quotes the translated pattern with a
        // caret; its last line is the description.
        let text = e.to_string();
        let why = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
        if why.contains("duplicate capture group name") {
            // Go takes it (the first group gets the name).
            return Error::Unsupported {
                what: "a capture group name used twice",
            };
        }
        Error::Syntax {
            why: why.strip_prefix("error: ").unwrap_or(why).to_string(),
        }
    })
}

/// `pattern` in Go's syntax rewritten in the regex crate's, meaning the
/// same (see the crate's docs for what differs and how).
pub fn translate(pattern: &str) -> Result<String, Error> {
    let mut t = Translation {
        src: pattern,
        at: 0,
        out: String::with_capacity(pattern.len() + 16),
        class: false,
        repeated: None,
        flags: false,
    };
    while let Some(c) = t.next() {
        if t.class {
            t.in_class(c);
        } else {
            t.outside_class(c)?;
        }
    }
    Ok(t.out)
}

/// The state of one [`translate`].
struct Translation<'a> {
    src: &'a str,
    /// The byte offset of the next character of `src`.
    at: usize,
    out: String,
    /// Inside a character class.
    class: bool,
    /// Just after a repetition operator: whether its lazy `?` came too.
    /// Go refuses a repetition of a repetition (`a**`, `a{2}{2}`).
    repeated: Option<bool>,
    /// Just after a flag group (`(?i)`): no item to Go, so `a(?i)*`
    /// repeats the `a`.
    flags: bool,
}

impl Translation<'_> {
    fn outside_class(&mut self, c: char) -> Result<(), Error> {
        match c {
            '*' | '+' | '?' => self.repetition(c.encode_utf8(&mut [0; 4]))?,
            '{' => match repetition(&self.src[self.at..]) {
                Some(len) => {
                    let text = &self.src[self.at - 1..self.at + len];
                    self.at += len;
                    self.repetition(text)?;
                }
                // Not a repetition: a literal `{`, as Go reads it.
                None => self.item("\\{"),
            },
            '}' => self.item("\\}"),
            '(' if flag_group(&self.src[self.at..]).is_some() => {
                let len = flag_group(&self.src[self.at..]).unwrap_or(0);
                // Go's check of nested repetitions is lexical: `a*(?i)*`
                // passes it.
                self.repeated = None;
                self.flags = true;
                // Go takes `(?)`, setting nothing; the regex crate does not.
                if len > 2 {
                    self.out.push('(');
                    self.out.push_str(&self.src[self.at..self.at + len]);
                }
                self.at += len;
            }
            '\\' => {
                self.item("");
                self.escape()?;
            }
            '[' => {
                self.item("[");
                self.open_class();
            }
            _ => self.item(c.encode_utf8(&mut [0; 4])),
        }
        Ok(())
    }

    fn in_class(&mut self, c: char) {
        match c {
            '\\' => {
                // Escapes in a class never fail.
                let _ = self.escape();
            }
            '[' if self.src[self.at..].starts_with(':') => self.posix_class(),
            ']' => {
                self.class = false;
                self.out.push(']');
            }
            // Literal in a Go class; nesting and set operations in the
            // regex crate's.
            '[' | '&' | '~' => {
                self.out.push('\\');
                self.out.push(c);
            }
            '-' if self.out.ends_with('-') && !self.out.ends_with("\\-") => self.out.push_str("\\-"),
            _ => self.out.push(c),
        }
    }

    /// Writes `text`, an item (not a repetition).
    fn item(&mut self, text: &str) {
        self.repeated = None;
        self.flags = false;
        self.out.push_str(text);
    }

    /// Writes a repetition operator, refusing what Go refuses.
    fn repetition(&mut self, op: &str) -> Result<(), Error> {
        self.repeated = match self.repeated {
            Some(false) if op == "?" => Some(true),
            Some(_) => {
                return Err(Error::Syntax {
                    why: "invalid nested repetition operator".to_string(),
                });
            }
            None => Some(false),
        };
        if self.flags {
            // Go repeats the item before the flags; the regex crate
            // would repeat nothing. No one means it: refused.
            return Err(Error::Unsupported {
                what: "a repetition right after a flag group",
            });
        }
        self.out.push_str(op);
        Ok(())
    }

    fn next(&mut self) -> Option<char> {
        let c = self.src[self.at..].chars().next()?;
        self.at += c.len_utf8();
        Some(c)
    }

    /// After a `[` outside a class: a leading `^` and `]` are Go's too.
    fn open_class(&mut self) {
        if self.src[self.at..].starts_with('^') {
            self.at += 1;
            self.out.push('^');
        }
        self.class = true;
        if self.src[self.at..].starts_with(']') {
            self.at += 1;
            self.out.push_str("\\]");
        }
    }

    /// `[:alpha:]` (and `[:^alpha:]`) inside a class, copied whole.
    fn posix_class(&mut self) {
        match self.src[self.at..].find(":]") {
            Some(end) => {
                self.out.push('[');
                self.out.push_str(&self.src[self.at..self.at + end + 2]);
                self.at += end + 2;
            }
            None => self.out.push_str("\\["),
        }
    }

    /// After a `\`.
    fn escape(&mut self) -> Result<(), Error> {
        let Some(e) = self.next() else {
            // The regex crate names a trailing backslash itself.
            self.out.push('\\');
            return Ok(());
        };
        let inside = self.class;
        match (e, inside) {
            ('Q', false) => self.quote(),
            ('C', _) => return Err(Error::Unsupported { what: "\\C (any byte)" }),
            ('b', false) => self.out.push_str("(?-u:\\b)"),
            // `\p{Greek}`, `\x{263a}`: the braces belong to the escape.
            // Go's `\p{^Greek}` is the regex crate's `\P{Greek}`.
            ('p' | 'P' | 'x', _) if self.src[self.at..].starts_with('{') => {
                let len = self.src[self.at..]
                    .find('}')
                    .map_or(self.src.len() - self.at, |end| end + 1);
                let mut braces = &self.src[self.at..self.at + len];
                let mut letter = e;
                if e != 'x' && braces.starts_with("{^") {
                    braces = &braces[2..];
                    letter = if e == 'p' { 'P' } else { 'p' };
                    self.out.push('\\');
                    self.out.push(letter);
                    self.out.push('{');
                } else {
                    self.out.push('\\');
                    self.out.push(letter);
                }
                self.out.push_str(braces);
                self.at += len;
            }
            ('B', false) => self.out.push_str("(?-u:\\B)"),
            _ => match ascii_class(e) {
                Some((set, false)) if inside => self.out.push_str(set),
                Some((set, negated)) => {
                    self.out.push_str(if negated { "[^" } else { "[" });
                    self.out.push_str(set);
                    self.out.push(']');
                }
                None => {
                    self.out.push('\\');
                    self.out.push(e);
                }
            },
        }
        Ok(())
    }

    /// `\Q…\E`: the text between, literally (to the end when no `\E`).
    fn quote(&mut self) {
        let rest = &self.src[self.at..];
        let (text, used) = match rest.find("\\E") {
            Some(end) => (&rest[..end], end + 2),
            None => (rest, rest.len()),
        };
        self.out.push_str(&regex::escape(text));
        self.at += used;
    }
}

/// Go's ASCII Perl classes: the members of `\d`, `\w`, `\s` (as they are
/// written inside a class) and whether the letter negates them.
fn ascii_class(letter: char) -> Option<(&'static str, bool)> {
    let set = match letter.to_ascii_lowercase() {
        'd' => "0-9",
        'w' => "0-9A-Za-z_",
        's' => "\\t\\n\\f\\r ",
        _ => return None,
    };
    Some((set, letter.is_ascii_uppercase()))
}

/// The length of the rest of a flag group, when `rest` (just after a
/// `(`) is one: `?i)`, `?-s)`, `?im-sU)`.
fn flag_group(rest: &str) -> Option<usize> {
    let body = rest.strip_prefix('?')?;
    let len = body.bytes().take_while(|b| b"imsU-".contains(b)).count();
    body[len..].starts_with(')').then_some(len + 2)
}

/// The length of the rest of a repetition as Go reads one, when `rest`
/// (just after a `{`) is one: `n}`, `n,}` or `n,m}`. Anything else
/// makes the `{` a literal.
fn repetition(rest: &str) -> Option<usize> {
    let digits = |s: &str| s.bytes().take_while(u8::is_ascii_digit).count();
    let mut len = digits(rest);
    if len == 0 {
        return None;
    }
    if rest[len..].starts_with(',') {
        len += 1;
        len += digits(&rest[len..]);
    }
    rest[len..].starts_with('}').then_some(len + 1)
}

#[cfg(test)]
mod tests;
