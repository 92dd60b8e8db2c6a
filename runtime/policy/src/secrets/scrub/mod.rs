//! What a plugin may read of what a peer answers a call that holds
//! secrets.
//!
//! The plugin is hostile; a granted peer is honest but may reflect what it
//! received, in the encodings servers write. The property
//! (docs/security.md): for two secrets of equal length, everything the
//! plugin observes is the same, unless a peer's answer holds a
//! *reflection* of a secret; then the plugin learns that one happened, and
//! nothing else. So:
//!
//! - A reflection is a run of [`RUN`] consecutive bytes of a secret (the
//!   whole of a shorter one), found in any *view* of a field: raw, its
//!   string escapes, HTML references and percent or form encoding decoded,
//!   its base64 and hex runs decoded, in any letter case ([`views`]).
//! - A field that holds one is [withheld](WITHHELD) whole: a header (name
//!   and value), a body, a message, a datagram. Nothing is patched in
//!   place, so no output depends on which bytes matched.
//! - A stream ([`Stream`]) is handed on [`LAG`] bytes behind what arrived,
//!   a fixed window that holds the widest run in any view: what is held,
//!   released and cut never depends on a partial match, and every run is
//!   seen whole before any of its bytes are released.
//!
//! Everything works on the peer's raw bytes, before any conversion to text.

mod encoded;
mod runs;
mod splices;
mod views;

use runs::Runs;
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;
use zeroize::Zeroizing;

/// How many consecutive bytes of a secret make a reflection (all of a
/// secret shorter than this). A plugin that sends its own guesses to an
/// echoing peer learns, per echoed field, whether it held such a run
/// (docs/security.md states what that costs an attacker).
pub const RUN: usize = 12;

/// How far behind the peer a stream is handed on: the widest span of a
/// run in any view ([`RUN`] bytes, each taking at most 16 in an encoding),
/// and one escape more that the end of a read may have cut short (not
/// read until it ends).
pub const LAG: usize = (RUN + 1) * views::WIDEST_BYTE;

/// How long a session's peer is quiet before the bytes held back are
/// handed on (also when it closes, or when the plugin's wait ends).
pub const QUIET: Duration = Duration::from_millis(20);

/// What a withheld field, body, message or datagram becomes.
pub const WITHHELD: &str = "[withheld: the peer reflected a secret]";

/// The name a withheld header field gets (its value is [`WITHHELD`]).
pub const WITHHELD_HEADER: &str = "sonde-withheld";

/// The reflections of some secrets a field is checked for.
pub struct Scrubber {
    runs: Runs,
}

impl std::fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Scrubber(<secret>)")
    }
}

impl Scrubber {
    /// The scrubber of `secrets`.
    pub fn new<'a>(secrets: impl IntoIterator<Item = &'a [u8]>) -> Self {
        Self {
            runs: Runs::new(secrets),
        }
    }

    /// Whether nothing is checked.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Whether `field`, in some view, holds a reflection.
    pub fn reflects(&self, field: &[u8]) -> bool {
        !self.runs.is_empty() && views::any(field, false, &self.runs)
    }

    /// Whether `bytes`, which may go on, already hold a reflection that
    /// more bytes cannot undo: an escape cut short at the end is not read
    /// as the bytes it has so far.
    pub fn reflects_so_far(&self, bytes: &[u8]) -> bool {
        !self.runs.is_empty() && views::any(bytes, true, &self.runs)
    }

    /// Whether a header field (or gRPC metadata entry) reflects, in its
    /// name or its value.
    pub fn reflects_field(&self, name: &[u8], value: &[u8]) -> bool {
        self.reflects(name) || self.reflects(value)
    }

    /// Where the first reflection in `bytes` ends, if they hold one: the
    /// shortest prefix that reflects so far (found by bisection, only when
    /// there is one; a prefix reflects so far whenever a shorter one does).
    /// `ended` when nothing follows `bytes`. For two secrets whose
    /// encodings are as long, it is the same, but for the residual a
    /// secret's own last bytes make when they spell the start of their
    /// encoding (docs/security.md).
    pub fn reflection_end(&self, bytes: &[u8], ended: bool) -> Option<usize> {
        let found = if ended {
            self.reflects(bytes)
        } else {
            self.reflects_so_far(bytes)
        };
        if !found {
            return None;
        }
        let (mut lo, mut hi) = (0, bytes.len());
        while lo + 1 < hi {
            let mid = lo + (hi - lo) / 2;
            if self.reflects_so_far(&bytes[..mid]) {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        Some(hi)
    }

    /// Whether the run of the reflection ending at `end` already began
    /// before `from`: the latest start that still reflects up to `end`.
    fn began_before(&self, field: &[u8], from: usize, end: usize) -> bool {
        from > 0 && !self.reflects_so_far(&field[from.min(end)..end])
    }

    /// A header field (or gRPC metadata entry) as a plugin reads it: its
    /// name and value as text, or ([`WITHHELD_HEADER`], [`WITHHELD`]) when
    /// either reflects (checked on the raw bytes, before the conversion).
    pub fn field(&self, name: &[u8], value: &[u8]) -> (String, String) {
        if self.reflects_field(name, value) {
            (WITHHELD_HEADER.to_owned(), WITHHELD.to_owned())
        } else {
            (
                String::from_utf8_lossy(name).into_owned(),
                String::from_utf8_lossy(value).into_owned(),
            )
        }
    }

    /// `text`, or [`WITHHELD`] when it reflects.
    pub fn text<'a>(&self, text: &'a str) -> Cow<'a, str> {
        if self.reflects(text.as_bytes()) {
            Cow::Borrowed(WITHHELD)
        } else {
            Cow::Borrowed(text)
        }
    }

    /// Withholds `bytes` in place when they reflect.
    pub fn vec(&self, bytes: &mut Vec<u8>) {
        if self.reflects(bytes) {
            *bytes = WITHHELD.as_bytes().to_vec();
        }
    }

    /// Withholds `text` in place when it reflects.
    pub fn string(&self, text: &mut String) {
        if self.reflects(text.as_bytes()) {
            *text = WITHHELD.to_owned();
        }
    }
}

/// What a [`Stream`] hands on: `data`, then, when `withheld`, the
/// [`WITHHELD`] marker, after which the stream ends.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Passed {
    /// Bytes checked and clean.
    pub data: Vec<u8>,
    /// A reflection starts right after `data`: hand on [`WITHHELD`] and end
    /// the stream.
    pub withheld: bool,
    /// The reflection began in bytes already handed on: the peer paused in
    /// the middle of it for longer than [`QUIET`] (or the plugin's own
    /// wait), so fewer than [`RUN`] of the secret's bytes reached the plugin. The caller
    /// burns the probe's secrets ([`crate::secrets::SecretGrants::burn`]).
    pub spilled: bool,
}

/// A stream from a peer (session data, a streamed body) as the plugin may
/// read it: [`LAG`] bytes behind, every run checked whole before any of
/// its bytes are released, and nothing from shortly before a reflection on.
///
/// Where the marker comes does not depend on the secret: it is handed on
/// when the first run is complete, in place of everything from `LAG` bytes
/// before that point (which holds the whole run, however wide its
/// encoding): the same bytes and the same read for any secret whose
/// encoding is as long.
#[derive(Default)]
pub struct Stream {
    /// The last released bytes: context for decoding what follows.
    context: Zeroizing<Vec<u8>>,
    /// Checked, not yet released.
    held: Zeroizing<Vec<u8>>,
    withheld: bool,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stream({} held, withheld: {})", self.held.len(), self.withheld)
    }
}

impl Stream {
    /// Takes `data` from the peer: what may be handed on now.
    pub fn push(&mut self, scrubber: &Scrubber, data: &[u8]) -> Passed {
        if self.withheld {
            return Passed::default();
        }
        self.held.extend_from_slice(data);
        if let Some(passed) = self.withhold(scrubber, false) {
            return passed;
        }
        let lagged = self.held.len().saturating_sub(LAG);
        self.take(lagged)
    }

    /// Everything held: at the end of the stream, or when the peer has
    /// been quiet for [`QUIET`] (then an escape cut short at the end is
    /// read as the bytes it has: what is handed on is final).
    pub fn release(&mut self, scrubber: &Scrubber) -> Passed {
        if self.withheld {
            return Passed::default();
        }
        if let Some(passed) = self.withhold(scrubber, true) {
            return passed;
        }
        self.take(self.held.len())
    }

    /// What is handed on when what was seen holds a reflection: the held
    /// bytes up to [`LAG`] before where it ends, then the marker.
    fn withhold(&mut self, scrubber: &Scrubber, ended: bool) -> Option<Passed> {
        let mut seen = Zeroizing::new(Vec::with_capacity(self.context.len() + self.held.len()));
        seen.extend_from_slice(&self.context);
        seen.extend_from_slice(&self.held);
        let end = scrubber.reflection_end(&seen, ended)?;
        let spilled = scrubber.began_before(&seen, self.context.len(), end);
        let cut = end.saturating_sub(LAG).saturating_sub(self.context.len());
        let mut passed = self.finish(cut);
        passed.spilled = spilled;
        Some(passed)
    }

    /// Whether bytes are held back.
    pub fn holds(&self) -> bool {
        !self.withheld && !self.held.is_empty()
    }

    /// Whether the marker was handed on: the stream hands on nothing more.
    pub fn is_withheld(&self) -> bool {
        self.withheld
    }

    fn take(&mut self, n: usize) -> Passed {
        let rest = Zeroizing::new(self.held.split_off(n));
        let out = std::mem::replace(&mut self.held, rest);
        self.context.extend_from_slice(&out);
        let over = self.context.len().saturating_sub(LAG);
        self.context.drain(..over);
        Passed {
            data: out.to_vec(),
            ..Passed::default()
        }
    }

    fn finish(&mut self, cut: usize) -> Passed {
        let data = self.held[..cut].to_vec();
        self.held.clear();
        self.context.clear();
        self.withheld = true;
        Passed {
            data,
            withheld: true,
            spilled: false,
        }
    }
}

/// What a call checks besides its probe's current secrets: any value it
/// used that is no longer current (rotated during the call).
#[derive(Default)]
pub(crate) struct ScrubState {
    pub(crate) extra: Vec<Zeroizing<Vec<u8>>>,
    pub(crate) built: Option<Arc<Scrubber>>,
    pub(crate) expansions: usize,
}

impl std::fmt::Debug for ScrubState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ScrubState({} values built)", self.expansions)
    }
}

#[cfg(test)]
mod tests;
