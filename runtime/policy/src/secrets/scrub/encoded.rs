//! The base64 and hex runs of a view, decoded: a peer that reflects a
//! secret in base64 or hex writes it inside a longer run of the same
//! alphabet, at any alignment.

use super::runs::Target;

/// The base64 and hex decodings of the runs of `text`.
pub(super) fn decoded_runs(text: &[u8], target: &impl Target) -> bool {
    let shortest = target.shortest();
    let mut buf = Vec::new();
    // Base64: 4 characters carry 3 bytes.
    let b64_min = (shortest * 4).div_ceil(3);
    for run in runs(text, is_base64) {
        for offset in 0..4 {
            if run.len() < offset + b64_min {
                break;
            }
            decode_base64(&run[offset..], &mut buf);
            if target.found_in(&buf) {
                return true;
            }
        }
    }
    for run in runs(text, is_hex) {
        for offset in 0..2 {
            if run.len() < offset + 2 * shortest {
                break;
            }
            buf.clear();
            buf.extend(run[offset..].chunks_exact(2).map(|p| (hex(p[0]) << 4) | hex(p[1])));
            if target.found_in(&buf) {
                return true;
            }
        }
    }
    false
}

/// Whether `b` is in either base64 alphabet.
pub(super) fn is_base64(b: u8) -> bool {
    B64[usize::from(b)] != NONE
}

/// Whether `b` is a hex digit.
pub(super) fn is_hex(b: u8) -> bool {
    b.is_ascii_hexdigit()
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

/// The value of a hex digit (0 for any other byte).
pub(super) fn hex(b: u8) -> u8 {
    match b {
        b'0'..=b'9' => b - b'0',
        b'a'..=b'f' => b - b'a' + 10,
        b'A'..=b'F' => b - b'A' + 10,
        _ => 0,
    }
}
