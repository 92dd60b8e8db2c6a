//! The runs of a secret a field must not hold: every `min(RUN, len)`
//! consecutive bytes of each secret, case-folded, in a set that a field is
//! checked against in one pass.

use super::RUN;
use zeroize::Zeroize;

/// Bits of the filter in front of the exact set: 2^16 bits (8 KiB), so a
/// field's bytes rarely reach the exact lookup.
const FILTER_BITS: u32 = 16;

/// The case-folded runs of some secrets, grouped by length (a secret
/// shorter than [`RUN`] is one run, the whole of it).
pub(super) struct Runs {
    lengths: Vec<Length>,
}

/// The runs of one length.
struct Length {
    len: usize,
    mask: u128,
    filter: Box<[u64]>,
    sorted: Vec<u128>,
}

impl Drop for Length {
    fn drop(&mut self) {
        self.sorted.zeroize();
        self.filter.zeroize();
    }
}

/// What every view is compared in: ASCII letters in one case, and a
/// space as `+` (form encoding writes one for the other).
pub(super) fn fold(b: u8) -> u8 {
    match b {
        b' ' => b'+',
        b => b.to_ascii_lowercase(),
    }
}

fn slot(run: u128) -> usize {
    let mixed = (run as u64) ^ ((run >> 64) as u64).rotate_left(29);
    (mixed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - FILTER_BITS)) as usize
}

impl Runs {
    /// The runs of `secrets` (each at least one byte).
    pub(super) fn new<'a>(secrets: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let mut lengths: Vec<Length> = Vec::new();
        for secret in secrets {
            add(&mut lengths, secret);
        }
        for l in &mut lengths {
            l.sorted.sort_unstable();
            l.sorted.dedup();
        }
        Self { lengths }
    }

    /// Whether no run is held.
    pub(super) fn is_empty(&self) -> bool {
        self.lengths.is_empty()
    }

    /// The shortest run: a view shorter than it holds none.
    pub(super) fn shortest(&self) -> usize {
        self.lengths.iter().map(|l| l.len).min().unwrap_or(RUN)
    }

    /// Whether `view`, case-folded, holds a run.
    pub(super) fn found_in(&self, view: &[u8]) -> bool {
        if view.len() < self.shortest() {
            return false;
        }
        let mut acc = 0u128;
        let mut found = false;
        for (i, &b) in view.iter().enumerate() {
            acc = (acc << 8) | u128::from(fold(b));
            for l in &self.lengths {
                if i + 1 >= l.len {
                    let run = acc & l.mask;
                    let bit = slot(run);
                    // The exact lookup only behind the filter; the scan
                    // goes on to the end either way, so its time depends
                    // on the field's length, not on where a run is.
                    if l.filter[bit >> 6] & (1 << (bit & 63)) != 0 && l.sorted.binary_search(&run).is_ok() {
                        found = true;
                    }
                }
            }
        }
        acc.zeroize();
        found
    }
}

/// Adds the runs of `s` (the whole of it when shorter than [`RUN`]).
fn add(lengths: &mut Vec<Length>, s: &[u8]) {
    if s.is_empty() {
        return;
    }
    let len = s.len().min(RUN);
    let at = match lengths.iter().position(|l| l.len == len) {
        Some(i) => i,
        None => {
            lengths.push(Length {
                len,
                mask: if len == 16 { !0 } else { (1u128 << (8 * len)) - 1 },
                filter: vec![0u64; 1 << (FILTER_BITS - 6)].into_boxed_slice(),
                sorted: Vec::new(),
            });
            lengths.len() - 1
        }
    };
    let l = &mut lengths[at];
    let mut acc = 0u128;
    for (i, &b) in s.iter().enumerate() {
        acc = (acc << 8) | u128::from(fold(b));
        if i + 1 >= len {
            let run = acc & l.mask;
            l.sorted.push(run);
            let bit = slot(run);
            l.filter[bit >> 6] |= 1 << (bit & 63);
        }
    }
    acc.zeroize();
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
        assert!(short.found_in(b"..8BYTES!!.."));
        assert!(!short.found_in(b"8bytes!"));
        assert_eq!(short.shortest(), 8);
        assert!(Runs::new(std::iter::empty::<&[u8]>()).is_empty());
    }

    #[test]
    fn runs_of_every_length_up_to_run_are_kept_exactly() {
        for len in 1..=RUN {
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
