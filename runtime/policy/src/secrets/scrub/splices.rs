//! Where a reflection meets the text around it. A decoder reads left to
//! right and takes the first escape it can; when a peer writes the
//! plugin's own bytes as they came (`…%`) right before a secret it
//! encodes (`2f%2eab…`, a normalizer that keeps escapes already valid),
//! an escape begins in the plugin's bytes and ends in the secret's
//! (`%2f`): the decoded view loses the secret's first bytes, and whether
//! it does depends on them. (A `\` of the plugin's before a secret whose
//! JSON string begins `\\f` shifts every escape after it.)
//!
//! So every escape a decoder takes is kept as a *splice*: where its
//! output is in the view and the text it was read from. A view then also
//! holds a reflection when a run begins inside an escape: the input
//! decoded again from each of its bytes after the first, up to where the
//! two decodings meet, followed by the view; or that text joining a
//! base64 or hex run. A splice is carried through the later layers'
//! decoding where they pass its output on as it is (and read there as the
//! text it came from). The work is fixed per escape, whatever the secret.
//!
//! Not followed (docs/security.md lists them in the residual): two
//! escapes of different layers that both begin in the plugin's bytes (a
//! peer that keeps the plugin's escapes valid in two layers at once); and
//! a secret's own `%`, `&` or `\` that a normalizing peer leaves as it
//! was because what follows makes it an escape (`%41` inside a secret, or
//! a secret's last `%` before the plugin's `41`).

use super::encoded::{decoded_runs, is_base64, is_hex};
use super::runs::Target;

/// The longest text one escape is read from (`&#x0010FFFF;` is 12,
/// `\ud83d\ude00` and `\u{0010FFFF}` too).
const WIDEST_ESCAPE: usize = 16;

/// An escape a decoder took.
#[derive(Clone, Copy)]
pub(super) struct Splice {
    /// Where the text it was read from begins and ends in the decoder's
    /// input.
    from: u32,
    to: u32,
    /// Where its output begins in the decoded view, and how long it is.
    at: u32,
    len: u8,
    raw: [u8; WIDEST_ESCAPE],
    raw_len: u8,
}

impl Splice {
    fn raw(&self) -> &[u8] {
        &self.raw[..usize::from(self.raw_len)]
    }

    fn at(&self) -> usize {
        self.at as usize
    }

    fn end(&self) -> usize {
        self.at as usize + usize::from(self.len)
    }
}

/// A view a decoder wrote, and the escapes it took (in order).
pub(super) struct Decoded {
    pub(super) bytes: Vec<u8>,
    pub(super) splices: Vec<Splice>,
}

impl Decoded {
    pub(super) fn with_capacity(n: usize) -> Self {
        Self {
            bytes: Vec::with_capacity(n),
            splices: Vec::new(),
        }
    }

    /// Records the escape read from `input[from..to]`, whose output is
    /// what was written since `mark`.
    pub(super) fn escaped(&mut self, input: &[u8], from: usize, to: usize, mark: usize) {
        let text = &input[from..to];
        let mut raw = [0u8; WIDEST_ESCAPE];
        let n = text.len().min(WIDEST_ESCAPE);
        raw[..n].copy_from_slice(&text[..n]);
        // Positions fit: a field is at most a few MiB.
        self.splices.push(Splice {
            from: from as u32,
            to: to as u32,
            at: mark as u32,
            len: (self.bytes.len() - mark).min(usize::from(u8::MAX)) as u8,
            raw,
            raw_len: n as u8,
        });
    }

    /// This view's splices and those of its input (`below`) that it
    /// passed on as they were, at their places in it, in order.
    pub(super) fn with_carried(&self, below: &[Splice]) -> Vec<Splice> {
        let mut all = self.splices.clone();
        all.extend(below.iter().filter_map(|s| self.carry(s)));
        all.sort_unstable_by_key(|s| s.at);
        all
    }

    fn carry(&self, s: &Splice) -> Option<Splice> {
        let (start, end) = (s.at(), s.end());
        // The last escape of this layer that begins before the splice ends.
        let k = self.splices.partition_point(|e| (e.from as usize) < end);
        if k.checked_sub(1).is_some_and(|k| self.splices[k].to as usize > start) {
            return None;
        }
        // (A decoder that stopped before an escape cut short wrote less.)
        let at = self.out_pos(start);
        (at + usize::from(s.len) <= self.bytes.len()).then_some(Splice { at: at as u32, ..*s })
    }

    /// The first input position from `p` on that is outside every escape
    /// this decoder took (or at one's edge).
    fn boundary_from(&self, p: usize) -> usize {
        let k = self.splices.partition_point(|e| (e.from as usize) < p);
        match k.checked_sub(1).map(|k| self.splices[k].to as usize) {
            Some(to) if to > p => to,
            _ => p,
        }
    }

    /// Where the input position `p` (a boundary) is in the view.
    fn out_pos(&self, p: usize) -> usize {
        let k = self.splices.partition_point(|e| (e.from as usize) < p);
        match k.checked_sub(1).map(|k| &self.splices[k]) {
            Some(e) => e.end() + (p - e.to as usize),
            None => p,
        }
    }
}

/// Whether `view` holds a run that begins inside one of its escapes
/// (`splices`): the escape's text after its first byte, followed by the
/// view. The run begins in the escape's text, so a secret's own bytes that
/// spell the end of an escape (`…m33` in `…m%33`) do not make one end
/// sooner. One check per escape, whatever the secret.
pub(super) fn any(view: &[u8], splices: &[Splice], target: &impl Target) -> bool {
    let reach = target.lengths().max().unwrap_or(super::RUN) - 1;
    let mut buf = Vec::with_capacity(reach + WIDEST_ESCAPE);
    for s in splices {
        let text = &s.raw()[1..];
        let after = &view[s.end()..(s.end() + reach).min(view.len())];
        if target.found_in(joined(&mut buf, &[text, after])) {
            return true;
        }
        // The text's last base64 or hex characters, joining a run of the
        // view's.
        for is in [is_base64 as fn(u8) -> bool, is_hex] {
            let tail = &text[text.iter().rposition(|&b| !is(b)).map_or(0, |i| i + 1)..];
            if !tail.is_empty() && encoded_run_begins(view, s.end(), tail, is, target) {
                let to = (s.end() + 2 * super::RUN + 8).min(view.len());
                if decoded_runs(joined(&mut buf, &[tail, &view[s.end()..to]]), target) {
                    return true;
                }
            }
        }
    }
    false
}

/// Whether the string-escape view `decoded` of `input` holds a run that
/// begins in a run of backslashes paired from its second: the plugin's
/// own `\` right before a secret whose string begins `\\` shifts every
/// pair after it, so each run of two or more is also read (by `decode`)
/// with its first backslash left out, up to where the two readings meet.
/// Once per run of backslashes, however long.
pub(super) fn paired_from_second(
    input: &[u8],
    decoded: &Decoded,
    decode: &dyn Fn(&[u8], &mut Decoded),
    target: &impl Target,
) -> bool {
    let view = &decoded.bytes[..];
    let mut buf = Vec::new();
    let mut again = Decoded::with_capacity(4 * WIDEST_ESCAPE);
    for s in &decoded.splices {
        let from = s.from as usize;
        if s.raw() != b"\\\\" || (from > 0 && input[from - 1] == b'\\') {
            continue;
        }
        let start = from + 1;
        let run_end = start + input[start..].iter().take_while(|&&b| b == b'\\').count();
        // The readings meet after the escape that ends the run, within
        // one escape's width of it.
        let end = (run_end + 2 * WIDEST_ESCAPE).min(input.len());
        decode(&input[start..end], &mut again);
        // Only what lies an escape before the window's end is read as in
        // the whole input.
        let settled = if end == input.len() { end } else { end - WIDEST_ESCAPE };
        // The first place both readings are between escapes.
        let mut q = run_end;
        while q <= settled {
            let next = decoded.boundary_from(q).max(start + again.boundary_from(q - start));
            if next == q {
                break;
            }
            q = next;
        }
        if q > settled {
            continue;
        }
        // (A reading that stopped before an escape cut short wrote less.)
        let resumed = decoded.out_pos(q);
        let (Some(shifted), Some(after)) = (again.bytes.get(..again.out_pos(q - start)), view.get(resumed..)) else {
            continue;
        };
        let reach = target.lengths().max().unwrap_or(super::RUN) - 1;
        if target.found_in(joined(&mut buf, &[shifted, &after[..after.len().min(reach)]])) {
            return true;
        }
        for is in [is_base64 as fn(u8) -> bool, is_hex] {
            let tail = &shifted[shifted.iter().rposition(|&b| !is(b)).map_or(0, |i| i + 1)..];
            if !tail.is_empty() && encoded_run_begins(view, resumed, tail, is, target) {
                let to = after.len().min(2 * super::RUN + 8);
                if decoded_runs(joined(&mut buf, &[tail, &after[..to]]), target) {
                    return true;
                }
            }
        }
    }
    false
}

/// Whether `tail` (of the alphabet `is`) and the view after `end` are
/// long enough to hold a run's encoding.
fn encoded_run_begins(view: &[u8], end: usize, tail: &[u8], is: fn(u8) -> bool, target: &impl Target) -> bool {
    let shortest = target.shortest();
    let need = if is(b'g') {
        (shortest * 4).div_ceil(3)
    } else {
        2 * shortest
    };
    tail.len() + view[end..].iter().take(need).take_while(|&&b| is(b)).count() >= need
}

fn joined<'a>(buf: &'a mut Vec<u8>, parts: &[&[u8]]) -> &'a [u8] {
    buf.clear();
    for p in parts {
        buf.extend_from_slice(p);
    }
    buf
}
