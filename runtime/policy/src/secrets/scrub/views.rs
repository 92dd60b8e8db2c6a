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
//! long enough run of those alphabets in each of them.

use std::borrow::Cow;

/// The longest span one decoded byte takes in a field, across the views
/// (`\u0026#x0041;`, a JSON-escaped HTML reference, is 12): the stream
/// lag ([`super::LAG`]) covers a run this wide.
pub(super) const WIDEST_BYTE: usize = 16;

/// Whether `check` holds for some view of `raw` whose runs may be as
/// short as `shortest` bytes.
pub(super) fn any(raw: &[u8], shortest: usize, check: &mut dyn FnMut(&[u8]) -> bool) -> bool {
    let mut seen = |view: &[u8]| check(view) || decoded_runs(view, shortest, check);
    if seen(raw) {
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
        if layers(raw, code_points, &mut seen) {
            return true;
        }
    }
    false
}

/// How a decoded code point below 256 is written into a view.
#[derive(Clone, Copy, PartialEq, Eq)]
enum CodePoints {
    Utf8,
    Latin1,
}

/// Whether `seen` holds for a view with some layers of escapes decoded.
fn layers(raw: &[u8], code_points: CodePoints, seen: &mut dyn FnMut(&[u8]) -> bool) -> bool {
    let strings = owned(string_escapes(raw, code_points));
    let mut below: Vec<&[u8]> = vec![raw];
    if let Some(s) = &strings {
        if seen(s) {
            return true;
        }
        below.push(s);
    }
    let html: Vec<Vec<u8>> = below
        .iter()
        .filter_map(|v| owned(html_references(v, code_points)))
        .collect();
    for h in &html {
        if seen(h) {
            return true;
        }
    }
    below.extend(html.iter().map(Vec::as_slice));
    below.iter().filter_map(|v| owned(percent(v))).any(|p| seen(&p))
}

fn owned(view: Cow<'_, [u8]>) -> Option<Vec<u8>> {
    match view {
        Cow::Owned(v) => Some(v),
        Cow::Borrowed(_) => None,
    }
}

/// The base64 and hex decodings of the runs of `text`.
fn decoded_runs(text: &[u8], shortest: usize, check: &mut dyn FnMut(&[u8]) -> bool) -> bool {
    let mut buf = Vec::new();
    // Base64: 4 characters carry 3 bytes.
    let b64_min = (shortest * 4).div_ceil(3);
    for run in runs(text, |b| B64[usize::from(b)] != NONE) {
        for offset in 0..4 {
            if run.len() < offset + b64_min {
                break;
            }
            decode_base64(&run[offset..], &mut buf);
            if check(&buf) {
                return true;
            }
        }
    }
    for run in runs(text, |b| b.is_ascii_hexdigit()) {
        for offset in 0..2 {
            if run.len() < offset + 2 * shortest {
                break;
            }
            buf.clear();
            buf.extend(run[offset..].chunks_exact(2).map(|p| (hex(p[0]) << 4) | hex(p[1])));
            if check(&buf) {
                return true;
            }
        }
    }
    false
}

/// The maximal runs of bytes for which `is` holds.
fn runs(text: &[u8], is: impl Fn(u8) -> bool + Copy) -> impl Iterator<Item = &[u8]> {
    text.split(move |&b| !is(b)).filter(|r| !r.is_empty())
}

const NONE: u8 = 0xff;

/// Base64's two alphabets in one table.
static B64: [u8; 256] = {
    let mut t = [NONE; 256];
    let mut i = 0;
    while i < 26 {
        t[b'A' as usize + i] = i as u8;
        t[b'a' as usize + i] = 26 + i as u8;
        i += 1;
    }
    let mut d = 0;
    while d < 10 {
        t[b'0' as usize + d] = 52 + d as u8;
        d += 1;
    }
    t[b'+' as usize] = 62;
    t[b'-' as usize] = 62;
    t[b'/' as usize] = 63;
    t[b'_' as usize] = 63;
    t
};

fn decode_base64(chars: &[u8], out: &mut Vec<u8>) {
    out.clear();
    let mut acc = 0u32;
    let mut bits = 0;
    for &c in chars {
        acc = (acc << 6) | u32::from(B64[usize::from(c)]);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
}

fn hex(b: u8) -> u8 {
    match b {
        b'0'..=b'9' => b - b'0',
        b'a'..=b'f' => b - b'a' + 10,
        b'A'..=b'F' => b - b'A' + 10,
        _ => 0,
    }
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
    let c = string_escapes(raw, CodePoints::Utf8);
    let h = match html_references(&c, CodePoints::Utf8) {
        Cow::Owned(o) => Cow::Owned(o),
        Cow::Borrowed(_) => c,
    };
    match percent(&h) {
        Cow::Owned(o) => Cow::Owned(o),
        Cow::Borrowed(_) => h,
    }
}

/// C, JSON, Python and Rust string escapes: `\"` `\\` `\/` `\'` `\b` `\f`
/// `\n` `\r` `\t` `\0` `\xHH` `\uHHHH` (with surrogate pairs) `\UHHHHHHHH`
/// `\u{H…}`.
fn string_escapes(raw: &[u8], code_points: CodePoints) -> Cow<'_, [u8]> {
    if !raw.contains(&b'\\') {
        return Cow::Borrowed(raw);
    }
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] != b'\\' || i + 1 == raw.len() {
            out.push(raw[i]);
            i += 1;
            continue;
        }
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
                .and_then(|(v, end)| push_char(&mut out, v, code_points).then_some(end + 1)),
            b'u' => rest.get(..4).and_then(hex_value).and_then(|unit| {
                let low = rest
                    .get(4..10)
                    .filter(|l| l.starts_with(b"\\u"))
                    .and_then(|l| hex_value(&l[2..]))
                    .filter(|l| (0xDC00..0xE000).contains(l));
                match (unit, low) {
                    (0xD800..0xDC00, Some(low)) => push_char(
                        &mut out,
                        0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00),
                        code_points,
                    )
                    .then_some(10),
                    _ => push_char(&mut out, unit, code_points).then_some(4),
                }
            }),
            b'U' => rest
                .get(..8)
                .and_then(hex_value)
                .and_then(|v| push_char(&mut out, v, code_points).then_some(8)),
            _ => None,
        };
        match used {
            Some(n) => i += 2 + n,
            None => {
                out.push(b'\\');
                i += 1;
            }
        }
    }
    Cow::Owned(out)
}

/// HTML character references: the five XML names, `&#NNN;` and `&#xHHH;`.
fn html_references(text: &[u8], code_points: CodePoints) -> Cow<'_, [u8]> {
    if !text.contains(&b'&') {
        return Cow::Borrowed(text);
    }
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        let reference = (text[i] == b'&')
            .then(|| text[i + 1..].iter().take(12).position(|&b| b == b';'))
            .flatten()
            .map(|end| (&text[i + 1..i + 1 + end], end + 2));
        let decoded = reference.and_then(|(name, used)| {
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
            push_char(&mut out, code, code_points).then_some(used)
        });
        match decoded {
            Some(used) => i += used,
            None => {
                out.push(text[i]);
                i += 1;
            }
        }
    }
    Cow::Owned(out)
}

/// Percent-encoding in either case. (Form encoding's `+` for a space is
/// matched by folding a space into `+` where the runs are compared, so that a
/// `+` a peer wrote as `&#43;` stays one.)
fn percent(text: &[u8]) -> Cow<'_, [u8]> {
    if !text.contains(&b'%') {
        return Cow::Borrowed(text);
    }
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        match text[i] {
            b'%' if text.get(i + 1..i + 3).and_then(hex_value).is_some() => {
                out.push((hex(text[i + 1]) << 4) | hex(text[i + 2]));
                i += 3;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(v: Cow<'_, [u8]>) -> String {
        String::from_utf8_lossy(&v).into_owned()
    }

    #[test]
    fn escapes_are_decoded_the_way_servers_write_them() {
        assert_eq!(
            text(unescape(br#"a\"b\\c\/d\u00e9\u0026\x41\u{1F600}\ud83d\ude00"#)),
            "a\"b\\c/dé&A😀😀"
        );
        assert_eq!(
            text(unescape(b"&amp;&lt;&gt;&quot;&apos;&#39;&#x41;&#65;")),
            "&<>\"''AA"
        );
        assert_eq!(text(unescape(b"a%2fb%2Fc+d%zz")), "a/b/c+d%zz");
        // Layered: JSON of HTML of percent.
        assert_eq!(text(unescape(br"\u0026#x25;41")), "A");
        // Malformed escapes stay as they are.
        assert_eq!(text(unescape(br"\q &nope; \u12 \x4")), r"\q &nope; \u12 \x4");
        assert!(matches!(unescape(b"plain text"), Cow::Borrowed(_)));
    }

    #[test]
    fn base64_and_hex_runs_are_decoded_at_every_alignment() {
        let mut seen = Vec::new();
        // "hello world!" in base64 after a prefix that shifts it.
        any(b"xx:QaGVsbG8gd29ybGQh==", 8, &mut |v| {
            seen.push(v.to_vec());
            false
        });
        assert!(seen.iter().any(|v| v.windows(8).any(|w| w == b"hello wo")), "{seen:?}");
        seen.clear();
        any(b"x68656C6C6f20776f726c64", 8, &mut |v| {
            seen.push(v.to_vec());
            false
        });
        assert!(seen.iter().any(|v| v.starts_with(b"hello wo")), "{seen:?}");
    }
}
