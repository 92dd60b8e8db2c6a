//! Scrubbing what a peer answers of every form of a call's secrets, before
//! the plugin sees it.
//!
//! A peer may echo what it received: a debugging endpoint returns the
//! request's headers, a server quotes a bad password in its error. The
//! [`Scrubber`] of a call replaces, in every byte the host hands the
//! plugin from a peer, each of these forms of each secret the probe is
//! granted (and of each value the call built from them) with
//! [`REPLACEMENT`]:
//!
//! - the bytes themselves;
//! - their hex, in lower and upper case;
//! - their percent-encoding (every byte outside RFC 3986's unreserved set
//!   as `%XX`, upper and lower case);
//! - their base64, standard and URL-safe, at each of the three offsets they
//!   may start at inside a longer base64 text (without the characters the
//!   neighbouring bytes share), so a secret inside an encoded
//!   `user:password` is found too.
//!
//! A form is matched whole: the scrubber never reveals whether a part of a
//! secret matched.

use aho_corasick::{AhoCorasick, MatchKind};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
use std::borrow::Cow;
use std::sync::Arc;
use zeroize::Zeroizing;

/// What a scrubbed form becomes.
pub const REPLACEMENT: &str = "[secret]";

/// The shortest derived form scrubbed (a shorter one would hit ordinary
/// text); the bytes themselves are always scrubbed.
const MIN_FORM: usize = 6;

/// The forms of a call's secrets, compiled into one automaton.
pub struct Scrubber {
    automaton: Option<AhoCorasick>,
    forms: Vec<Zeroizing<Vec<u8>>>,
}

impl std::fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Scrubber(<secret>)")
    }
}

impl Scrubber {
    /// The scrubber of `secrets`.
    pub fn new<'a>(secrets: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let mut forms: Vec<Zeroizing<Vec<u8>>> = Vec::new();
        for s in secrets {
            if !s.is_empty() {
                add_forms(s, &mut forms);
            }
        }
        forms.sort_by(|a, b| a.as_slice().cmp(b.as_slice()));
        forms.dedup_by(|a, b| a.as_slice() == b.as_slice());
        let automaton = (!forms.is_empty()).then(|| {
            AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostLongest)
                .build(forms.iter().map(|f| f.as_slice()))
                .expect("an automaton of at most a few thousand short patterns builds")
        });
        Self { automaton, forms }
    }

    /// How many bytes at the end of `data` may be the start of a form
    /// that the bytes still to come would complete: what a stream must
    /// hold back before handing `data` on.
    pub fn partial_tail(&self, data: &[u8]) -> usize {
        let mut longest = 0;
        for form in &self.forms {
            let window = data.len().min(form.len() - 1);
            let tail = &data[data.len() - window..];
            for (i, b) in tail.iter().enumerate() {
                let len = window - i;
                if len <= longest {
                    break;
                }
                if *b == form[0] && form[..len] == tail[i..] {
                    longest = len;
                    break;
                }
            }
        }
        longest
    }

    /// Whether nothing is scrubbed.
    pub fn is_empty(&self) -> bool {
        self.automaton.is_none()
    }

    /// `bytes` with every form replaced.
    pub fn bytes<'a>(&self, bytes: &'a [u8]) -> Cow<'a, [u8]> {
        match &self.automaton {
            Some(ac) if ac.is_match(bytes) => {
                let mut out = Vec::with_capacity(bytes.len());
                ac.replace_all_with_bytes(bytes, &mut out, |_, _, out| {
                    out.extend_from_slice(REPLACEMENT.as_bytes());
                    true
                });
                Cow::Owned(out)
            }
            _ => Cow::Borrowed(bytes),
        }
    }

    /// `text` with every form replaced.
    pub fn text<'a>(&self, text: &'a str) -> Cow<'a, str> {
        match &self.automaton {
            Some(ac) if ac.is_match(text) => {
                let scrubbed = self.bytes(text.as_bytes());
                Cow::Owned(String::from_utf8_lossy(&scrubbed).into_owned())
            }
            _ => Cow::Borrowed(text),
        }
    }

    /// Scrubs `bytes` in place.
    pub fn vec(&self, bytes: &mut Vec<u8>) {
        if let Cow::Owned(o) = self.bytes(bytes) {
            *bytes = o;
        }
    }

    /// Scrubs `text` in place.
    pub fn string(&self, text: &mut String) {
        if let Cow::Owned(o) = self.text(text) {
            *text = o;
        }
    }
}

fn add_forms(s: &[u8], forms: &mut Vec<Zeroizing<Vec<u8>>>) {
    let mut push = |f: Vec<u8>| {
        if f.len() >= MIN_FORM || f == s {
            forms.push(Zeroizing::new(f));
        }
    };
    push(s.to_vec());
    let hex_lower: Vec<u8> = s.iter().flat_map(|b| format!("{b:02x}").into_bytes()).collect();
    push(hex_lower.to_ascii_uppercase());
    push(hex_lower);
    let percent = percent_encode(s);
    if percent != s {
        push(percent.to_ascii_lowercase());
        push(percent);
    }
    for offset in 0..3usize {
        let mut shifted = vec![0u8; offset];
        shifted.extend_from_slice(s);
        for engine in [&STANDARD_NO_PAD, &URL_SAFE_NO_PAD] {
            let encoded = Zeroizing::new(engine.encode(&shifted).into_bytes());
            // The characters all of whose bits are the secret's.
            let first = (8 * offset).div_ceil(6);
            let end = (8 * (offset + s.len())) / 6;
            if first < end {
                push(encoded[first..end].to_vec());
            }
        }
        shifted.iter_mut().for_each(|b| *b = 0);
    }
}

/// `s` with every byte outside RFC 3986's unreserved set as `%XX`.
fn percent_encode(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    for &b in s {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b);
        } else {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        }
    }
    out
}

/// What a call scrubs besides its secrets: the values it built from them.
#[derive(Default)]
pub(crate) struct ScrubState {
    pub(crate) echoes: Vec<Zeroizing<Vec<u8>>>,
    pub(crate) built: Option<Arc<Scrubber>>,
    pub(crate) expansions: usize,
}

impl std::fmt::Debug for ScrubState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ScrubState({} values built)", self.expansions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::STANDARD;

    const SECRET: &[u8] = b"s3cr3t/pa$$word";

    fn scrub(text: &str) -> String {
        Scrubber::new([SECRET]).text(text).into_owned()
    }

    #[test]
    fn every_form_is_scrubbed() {
        assert_eq!(scrub("got s3cr3t/pa$$word!"), "got [secret]!");
        let hex: String = SECRET.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(scrub(&hex), "[secret]");
        assert_eq!(scrub(&hex.to_uppercase()), "[secret]");
        assert_eq!(scrub("pw=s3cr3t%2Fpa%24%24word&x"), "pw=[secret]&x");
        assert_eq!(scrub("pw=s3cr3t%2fpa%24%24word"), "pw=[secret]");
        // Inside an encoded `user:password`, at each offset.
        for user in ["", "a", "ab", "abc", "alice"] {
            let mut both = format!("{user}:").into_bytes();
            both.extend_from_slice(SECRET);
            for encoded in [STANDARD.encode(&both), URL_SAFE_NO_PAD.encode(&both)] {
                let shown = scrub(&format!("Authorization: Basic {encoded}"));
                assert!(shown.contains(REPLACEMENT), "{user:?}: {shown}");
                let left = shown.split(REPLACEMENT).map(str::len).sum::<usize>();
                assert!(left < 40, "at most the user's and the edges' characters stay: {shown}");
            }
        }
        assert_eq!(scrub("nothing to see"), "nothing to see");
        assert!(Scrubber::new(std::iter::empty::<&[u8]>()).is_empty());
    }

    #[test]
    fn a_stream_holds_back_what_may_start_a_secret() {
        let s = Scrubber::new([SECRET]);
        assert_eq!(s.partial_tail(b"hello s3cr"), 4);
        assert_eq!(s.partial_tail(b"hello"), 0);
        assert_eq!(
            s.partial_tail(b"s3cr3t/pa$$word"),
            0,
            "a whole form is scrubbed, not held"
        );
        assert_eq!(s.partial_tail(b""), 0);
    }

    #[test]
    fn a_part_of_a_secret_is_left_alone() {
        assert_eq!(scrub("s3cr3t/pa$$wor"), "s3cr3t/pa$$wor");
        assert_eq!(scrub("3cr3t/pa$$word"), "3cr3t/pa$$word");
    }
}
