//! The runs of a secret a field must not hold: every `min(RUN, len)`
//! consecutive bytes of each secret, case-folded, in a set that a field is
//! checked against in one pass.
//!
//! Every run has at least 8 bytes ([`crate::secrets::MIN_SECRET_BYTES`]),
//! so the pass keys a filter on the last 8 bytes seen (one `u64` shift per
//! byte), and looks a whole run up only behind the filter: about 1 ns per
//! byte of a view (BENCHMARKS.md, "What holding a secret costs").

use super::RUN;
use zeroize::Zeroize;

/// What the views are searched for: the runs of some secrets.
pub(super) trait Target {
    /// Whether `view` holds a run anywhere.
    fn found_in(&self, view: &[u8]) -> bool;
    /// The lengths runs have (each at most [`super::RUN`]).
    fn lengths(&self) -> impl Iterator<Item = usize> + '_;
    /// The shortest of them.
    fn shortest(&self) -> usize;
}

/// Bits of the filter on 8-byte prefixes: 2^16 bits (8 KiB, in a core's
/// first-level cache), so a field's bytes rarely reach the exact lookup.
const FILTER_BITS: u32 = 16;

/// The bytes of a run the filter is keyed on.
const PREFIX: usize = 8;

/// The case-folded runs of some secrets: a filter on their first 8 bytes
/// and, per length (a secret shorter than [`RUN`] is one run, the whole of
/// it), the sorted runs themselves.
pub(super) struct Runs {
    filter: Box<[u64]>,
    lengths: Vec<Length>,
}

/// The runs of one length, packed big-endian into a `u128`, sorted.
struct Length {
    len: usize,
    sorted: Vec<u128>,
}

impl Drop for Runs {
    fn drop(&mut self) {
        self.filter.zeroize();
        for l in &mut self.lengths {
            l.sorted.zeroize();
        }
    }
}

/// What every view is compared in: ASCII letters in one case, and a
/// space as `+` (form encoding writes one for the other).
static FOLD: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = (i as u8).to_ascii_lowercase();
        i += 1;
    }
    t[b' ' as usize] = b'+';
    t
};

fn slot(prefix: u64) -> usize {
    (prefix.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - FILTER_BITS)) as usize
}

/// `bytes` case-folded, packed big-endian.
fn pack(bytes: &[u8]) -> u128 {
    bytes
        .iter()
        .fold(0u128, |acc, &b| (acc << 8) | u128::from(FOLD[usize::from(b)]))
}

impl Runs {
    /// The runs of `secrets` (each at least [`PREFIX`] bytes; a shorter one
    /// is ignored, as the config refuses it).
    pub(super) fn new<'a>(secrets: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let mut runs = Self {
            filter: vec![0u64; 1 << (FILTER_BITS - 6)].into_boxed_slice(),
            lengths: Vec::new(),
        };
        for secret in secrets {
            runs.add(secret);
        }
        for l in &mut runs.lengths {
            l.sorted.sort_unstable();
            l.sorted.dedup();
        }
        runs
    }

    fn add(&mut self, s: &[u8]) {
        if s.len() < PREFIX {
            return;
        }
        let len = s.len().min(RUN);
        let at = match self.lengths.iter().position(|l| l.len == len) {
            Some(i) => i,
            None => {
                self.lengths.push(Length {
                    len,
                    sorted: Vec::new(),
                });
                self.lengths.len() - 1
            }
        };
        for window in s.windows(len) {
            let run = pack(window);
            self.lengths[at].sorted.push(run);
            let bit = slot((run >> (8 * (len - PREFIX))) as u64);
            self.filter[bit >> 6] |= 1 << (bit & 63);
        }
    }

    /// Whether no run is held.
    pub(super) fn is_empty(&self) -> bool {
        self.lengths.is_empty()
    }
}

impl Target for Runs {
    /// The shortest run: a view shorter than it holds none.
    fn shortest(&self) -> usize {
        self.lengths.iter().map(|l| l.len).min().unwrap_or(RUN)
    }

    fn lengths(&self) -> impl Iterator<Item = usize> + '_ {
        self.lengths.iter().map(|l| l.len)
    }

    /// Whether `view`, case-folded, holds a run.
    fn found_in(&self, view: &[u8]) -> bool {
        if view.len() < self.shortest() {
            return false;
        }
        let mut prefix = 0u64;
        let mut found = false;
        for (i, &b) in view.iter().enumerate() {
            prefix = (prefix << 8) | u64::from(FOLD[usize::from(b)]);
            if i + 1 < PREFIX {
                continue;
            }
            let bit = slot(prefix);
            // The exact lookup only behind the filter; the scan goes on to
            // the end either way, so its time depends on the field's
            // length, not on where a run is.
            if self.filter[bit >> 6] & (1 << (bit & 63)) == 0 {
                continue;
            }
            let start = i + 1 - PREFIX;
            for l in &self.lengths {
                if let Some(window) = view.get(start..start + l.len)
                    && l.sorted.binary_search(&pack(window)).is_ok()
                {
                    found = true;
                }
            }
        }
        prefix.zeroize();
        found
    }
}

/// What every view is compared in (for the views' own tests).
#[cfg(test)]
pub(super) fn fold(b: u8) -> u8 {
    FOLD[usize::from(b)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_found_in_any_case_and_a_shorter_one_is_not() {
        let runs = Runs::new([b"Tok-7F3A9C21E8B54D06".as_slice()]);
        assert!(runs.found_in(b"xx tok-7f3a9c21 yy"));
        assert!(runs.found_in(b"7F3A9C21E8B5"));
        assert!(!runs.found_in(b"7F3A9C21E8B"), "11 bytes are not a run");
        assert!(!runs.found_in(b""));
        let short = Runs::new([b"8bytes!!".as_slice()]);
        assert_eq!(fold(b'A'), b'a');
        assert!(short.found_in(b"..8BYTES!!.."));
        assert!(!short.found_in(b"8bytes!"));
        assert_eq!(short.shortest(), 8);
        assert!(Runs::new(std::iter::empty::<&[u8]>()).is_empty());
    }

    #[test]
    fn runs_of_every_length_up_to_run_are_kept_exactly() {
        for len in PREFIX..=RUN {
            let secret: Vec<u8> = (0..len as u8).map(|i| 0x80 | i.wrapping_mul(37)).collect();
            let runs = Runs::new([secret.as_slice()]);
            let mut text = b"abc".to_vec();
            text.extend_from_slice(&secret);
            assert!(runs.found_in(&text), "{len}");
            let mut other = secret.clone();
            *other.last_mut().unwrap() ^= 1;
            assert!(!runs.found_in(&other), "{len}");
        }
    }
}
