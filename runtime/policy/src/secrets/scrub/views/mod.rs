//! The views of a field a reflection is looked for in. A peer that
//! reflects what it received writes it the way its own output is written:
//! raw, as a JSON or C string, as HTML, percent- or form-encoded, in
//! another letter case, as base64 or hex. Rather than listing the encoded
//! forms of a secret (which misses every encoding not listed, and every
//! encoding applied only in part), the field is *decoded* into each of
//! these views and each view is searched for a run of the secret; case is
//! folded in the search itself ([`super::runs`]).
//!
//! Views: the raw bytes; the text with each layer of escapes decoded (C
//! and JSON string escapes; HTML character references; percent encoding),
//! alone and under the layers before it (HTML of a JSON string, percent of
//! HTML...): seven at most, each decoded wherever it appears and left as
//! it is where it is malformed; and the base64 (either alphabet, any
//! alignment) and hex (either case, either alignment) decodings of every
//! long enough run of those alphabets in each of them. Each escape a
//! decoder takes is also read from inside, where a reflection may begin
//! ([`super::splices`]). Bytes that may go on (a stream's so far) are
//! read `open`: an escape cut short at their end is not read yet.

use super::encoded::{decoded_runs, hex};
use super::runs::Target;
use super::splices::{self, Decoded, Splice};
use std::borrow::Cow;

/// The longest span one decoded byte takes in a field, across the views
/// (`\u0026#x0041;`, a JSON-escaped HTML reference, is 12): the stream
/// lag ([`super::LAG`]) covers a run this wide.
pub(super) const WIDEST_BYTE: usize = 16;

/// Whether some view of `raw` holds a run of `target`. When `raw` is
/// `open` (a stream's bytes so far, or a prefix of a field), an escape
/// cut short at its end may still be completed: each decoded view stops
/// before it, so that a few bytes more never make a reflection go away.
pub(super) fn any(raw: &[u8], open: bool, target: &impl Target) -> bool {
    if seen(raw, target) {
        return true;
    }
    // Each layer alone and under the others: a secret that holds text
    // that looks like one escape (`%c6`, `\n`) must survive the decoding
    // of another layer it was not written in. A code point below 256
    // (`\u00e9`, `&#233;`) is read as its UTF-8 and, when the field has
    // such escapes, as the one byte a Latin-1 reader meant.
    let latin1 = raw.windows(2).any(|w| w == b"\\u" || w == b"\\U" || w == b"&#");
    for code_points in [CodePoints::Utf8, CodePoints::Latin1] {
        if code_points == CodePoints::Latin1 && !latin1 {
            break;
        }
        if layers(raw, Reading { code_points, open }, target) {
            return true;
        }
    }
    false
}

/// How the decoders read: code points below 256, and whether the input
/// may go on.
#[derive(Clone, Copy)]
struct Reading {
    code_points: CodePoints,
    open: bool,
}

impl Reading {
    /// Whether an escape that could not be read, followed by `rest` to the
    /// end of the input, may be one still being written (`could_grow`
    /// says whether `rest` begins one): the decoder stops there.
    fn cut_short(self, rest: &[u8], could_grow: fn(&[u8]) -> bool) -> bool {
        self.open && could_grow(rest)
    }
}

/// Whether what follows a `\` to the end of the input begins a string
/// escape (or the second half of a surrogate pair).
fn string_escape_begins(rest: &[u8]) -> bool {
    let hex_to = |from: usize, max: usize| rest.len() < max && rest.iter().skip(from).all(u8::is_ascii_hexdigit);
    match rest.first() {
        None => true,
        Some(b'x') => hex_to(1, 3),
        Some(b'U') => hex_to(1, 9),
        Some(b'u') if rest.get(1) == Some(&b'{') => hex_to(2, 11),
        // A high surrogate, and the start of the low one.
        Some(b'u') if rest.len() >= 5 => {
            let low = &rest[5..];
            hex_value(&rest[1..5]).is_some_and(|unit| (0xD800..0xDC00).contains(&unit))
                && (low.is_empty()
                    || low == b"\\"
                    || (low.starts_with(b"\\u") && low.len() < 6 && low[2..].iter().all(u8::is_ascii_hexdigit)))
        }
        Some(b'u') => hex_to(1, 5),
        _ => false,
    }
}

/// Whether what follows a `&` to the end of the input begins a character
/// reference.
fn reference_begins(rest: &[u8]) -> bool {
    let all = |from: usize, is: fn(&u8) -> bool| rest.len() < 12 && rest.iter().skip(from).all(is);
    match rest {
        [b'#', b'x' | b'X', ..] => all(2, u8::is_ascii_hexdigit),
        [b'#', ..] => all(1, u8::is_ascii_digit),
        _ => ["amp", "lt", "gt", "quot", "apos"]
            .iter()
            .any(|n| n.as_bytes().starts_with(rest)),
    }
}

/// Whether what follows a `%` to the end of the input begins an escape.
fn percent_begins(rest: &[u8]) -> bool {
    rest.len() < 2 && rest.iter().all(u8::is_ascii_hexdigit)
}

/// How a decoded code point below 256 is written into a view.
#[derive(Clone, Copy, PartialEq, Eq)]
enum CodePoints {
    Utf8,
    Latin1,
}

/// Whether `view` holds a run, as it is or in its base64 and hex runs.
fn seen(view: &[u8], target: &impl Target) -> bool {
    target.found_in(view) || decoded_runs(view, target)
}

/// A view below the raw bytes: what it was decoded from, and the escapes
/// of the layers before that it passed on as they were.
type Below<'a> = (Cow<'a, [u8]>, Vec<Splice>);

/// Whether a view with some layers of escapes decoded holds a run, in it
/// or where a reflection meets one of its escapes ([`splices`]).
fn layers(raw: &[u8], reading: Reading, target: &impl Target) -> bool {
    // Decodes `input` with `decode`: whether the view holds a run, else
    // the view for the layers after.
    let layer = |carried: &[Splice], decoded: Option<Decoded>| {
        let Some(d) = decoded else { return Ok(None) };
        let splices = d.with_carried(carried);
        if seen(&d.bytes, target) || splices::any(&d.bytes, &splices, target) {
            return Err(());
        }
        Ok(Some((Cow::Owned(d.bytes), splices)))
    };
    let html = |v: &[u8]| html_references(v, reading);
    let strings = |v: &[u8]| string_escapes(v, reading);
    let found = (|| {
        let mut below: Vec<Below<'_>> = vec![(Cow::Borrowed(raw), Vec::new())];
        if let Some(s) = strings(raw) {
            let again = |v: &[u8], into: &mut Decoded| string_escapes_into(v, reading, into);
            if splices::paired_from_second(raw, &s, &again, target) {
                return Err(());
            }
            below.extend(layer(&[], Some(s))?);
        }
        let mut decoded = Vec::new();
        for (view, carried) in &below {
            decoded.extend(layer(carried, html(view))?);
        }
        below.extend(decoded);
        for (view, carried) in &below {
            layer(carried, percent(view, reading))?;
        }
        Ok::<(), ()>(())
    })();
    found.is_err()
}

fn hex_value(digits: &[u8]) -> Option<u32> {
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    Some(digits.iter().fold(0u32, |v, &d| (v << 4) | u32::from(hex(d))))
}

fn push_char(out: &mut Vec<u8>, code: u32, code_points: CodePoints) -> bool {
    if code_points == CodePoints::Latin1 && code < 0x100 {
        out.push(code as u8);
        return true;
    }
    match char::from_u32(code) {
        Some(c) => {
            out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
            true
        }
        None => false,
    }
}

/// The text `raw` stands for with all three layers of escapes decoded;
/// borrowed when it has none.
#[cfg(test)]
fn unescape(raw: &[u8]) -> Cow<'_, [u8]> {
    let mut view = Cow::Borrowed(raw);
    let reading = Reading {
        code_points: CodePoints::Utf8,
        open: false,
    };
    for decode in [string_escapes, html_references, percent] {
        if let Some(d) = decode(&view, reading) {
            view = Cow::Owned(d.bytes);
        }
    }
    view
}

/// C, JSON, Python and Rust string escapes: `\"` `\\` `\/` `\'` `\b` `\f`
/// `\n` `\r` `\t` `\0` `\xHH` `\uHHHH` (with surrogate pairs) `\UHHHHHHHH`
/// `\u{H…}`.
fn string_escapes(raw: &[u8], reading: Reading) -> Option<Decoded> {
    if !raw.contains(&b'\\') {
        return None;
    }
    let mut decoded = Decoded::with_capacity(raw.len());
    string_escapes_into(raw, reading, &mut decoded);
    Some(decoded)
}

/// [`string_escapes`] into `decoded` (cleared first).
fn string_escapes_into(raw: &[u8], reading: Reading, decoded: &mut Decoded) {
    decoded.bytes.clear();
    decoded.splices.clear();
    let code_points = reading.code_points;
    let mut i = 0;
    while i < raw.len() {
        let out = &mut decoded.bytes;
        if raw[i] == b'\\' && i + 1 == raw.len() && reading.cut_short(&[], string_escape_begins) {
            break;
        }
        if raw[i] != b'\\' || i + 1 == raw.len() {
            out.push(raw[i]);
            i += 1;
            continue;
        }
        let mark = out.len();
        let rest = &raw[i + 2..];
        let used = match raw[i + 1] {
            c @ (b'"' | b'\\' | b'/' | b'\'') => {
                out.push(c);
                Some(0)
            }
            c @ (b'b' | b'f' | b'n' | b'r' | b't' | b'0') => {
                out.push(match c {
                    b'b' => 8,
                    b'f' => 12,
                    b'n' => b'\n',
                    b'r' => b'\r',
                    b't' => b'\t',
                    _ => 0,
                });
                Some(0)
            }
            b'x' => rest.get(..2).and_then(hex_value).map(|v| {
                out.push(v as u8);
                2
            }),
            b'u' if rest.first() == Some(&b'{') => rest
                .iter()
                .position(|&b| b == b'}')
                .and_then(|end| Some((hex_value(&rest[1..end])?, end)))
                .and_then(|(v, end)| push_char(out, v, code_points).then_some(end + 1)),
            b'u' => rest.get(..4).and_then(hex_value).and_then(|unit| {
                let low = rest
                    .get(4..10)
                    .filter(|l| l.starts_with(b"\\u"))
                    .and_then(|l| hex_value(&l[2..]))
                    .filter(|l| (0xDC00..0xE000).contains(l));
                match (unit, low) {
                    (0xD800..0xDC00, Some(low)) => {
                        push_char(out, 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00), code_points).then_some(10)
                    }
                    _ => push_char(out, unit, code_points).then_some(4),
                }
            }),
            b'U' => rest
                .get(..8)
                .and_then(hex_value)
                .and_then(|v| push_char(out, v, code_points).then_some(8)),
            _ => None,
        };
        match used {
            Some(n) => {
                decoded.escaped(raw, i, i + 2 + n, mark);
                i += 2 + n;
            }
            None if reading.cut_short(&raw[i + 1..], string_escape_begins) => break,
            None => {
                out.push(b'\\');
                i += 1;
            }
        }
    }
}

/// HTML character references: the five XML names, `&#NNN;` and `&#xHHH;`.
fn html_references(text: &[u8], reading: Reading) -> Option<Decoded> {
    if !text.contains(&b'&') {
        return None;
    }
    let code_points = reading.code_points;
    let mut decoded = Decoded::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        let out = &mut decoded.bytes;
        let mark = out.len();
        let reference = (text[i] == b'&')
            .then(|| text[i + 1..].iter().take(12).position(|&b| b == b';'))
            .flatten()
            .map(|end| (&text[i + 1..i + 1 + end], end + 2));
        let reference = reference.and_then(|(name, used)| {
            let code = match name {
                b"amp" => Some(u32::from(b'&')),
                b"lt" => Some(u32::from(b'<')),
                b"gt" => Some(u32::from(b'>')),
                b"quot" => Some(u32::from(b'"')),
                b"apos" => Some(u32::from(b'\'')),
                [b'#', b'x' | b'X', digits @ ..] => hex_value(digits),
                [b'#', digits @ ..]
                    if !digits.is_empty() && digits.len() <= 8 && digits.iter().all(u8::is_ascii_digit) =>
                {
                    std::str::from_utf8(digits).ok().and_then(|d| d.parse().ok())
                }
                _ => None,
            }?;
            push_char(out, code, code_points).then_some(used)
        });
        match reference {
            Some(used) => {
                decoded.escaped(text, i, i + used, mark);
                i += used;
            }
            None if text[i] == b'&' && reading.cut_short(&text[i + 1..], reference_begins) => break,
            None => {
                out.push(text[i]);
                i += 1;
            }
        }
    }
    Some(decoded)
}

/// Percent-encoding in either case. (Form encoding's `+` for a space is
/// matched by folding a space into `+` where the runs are compared, so that a
/// `+` a peer wrote as `&#43;` stays one.)
fn percent(text: &[u8], reading: Reading) -> Option<Decoded> {
    if !text.contains(&b'%') {
        return None;
    }
    let mut decoded = Decoded::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        match text[i] {
            b'%' if text.get(i + 1..i + 3).and_then(hex_value).is_some() => {
                let mark = decoded.bytes.len();
                decoded.bytes.push((hex(text[i + 1]) << 4) | hex(text[i + 2]));
                decoded.escaped(text, i, i + 3, mark);
                i += 3;
            }
            b'%' if reading.cut_short(&text[i + 1..], percent_begins) => break,
            b => {
                decoded.bytes.push(b);
                i += 1;
            }
        }
    }
    Some(decoded)
}

#[cfg(test)]
mod tests;
