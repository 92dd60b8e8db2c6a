//! The scrubber's property, on the pure parts: every view finds a
//! reflection; a stream's output does not depend on a secret it does not
//! hold (whatever the plugin sent, however the peer split it); every split
//! of a stream gives the same output.
//!
//! The generated cases follow the project's fuzzing convention:
//! `SONDE_FUZZ_SEED` replays one, `SONDE_FUZZ_ITERS` runs more.

use super::*;
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};

const SECRET: &[u8] = b"s3cr3t/pa$$word";

fn scrubber(secret: &[u8]) -> Scrubber {
    Scrubber::new([secret])
}

/// The encodings servers reflect a request in.
#[derive(Clone, Copy, Debug)]
enum Encoding {
    Raw,
    Json,
    GoJson,
    PercentUpper,
    PercentLower,
    PercentPartly,
    Form,
    HtmlNamed,
    HtmlDecimal,
    HtmlHex,
    Upper,
    Lower,
    Base64,
    Base64Url,
    HexLower,
    HexUpper,
    RustDebug,
    JsonOfPercent,
}

const ENCODINGS: [Encoding; 18] = [
    Encoding::Raw,
    Encoding::Json,
    Encoding::GoJson,
    Encoding::PercentUpper,
    Encoding::PercentLower,
    Encoding::PercentPartly,
    Encoding::Form,
    Encoding::HtmlNamed,
    Encoding::HtmlDecimal,
    Encoding::HtmlHex,
    Encoding::Upper,
    Encoding::Lower,
    Encoding::Base64,
    Encoding::Base64Url,
    Encoding::HexLower,
    Encoding::HexUpper,
    Encoding::RustDebug,
    Encoding::JsonOfPercent,
];

fn encode(e: Encoding, s: &[u8]) -> Vec<u8> {
    let each = |f: &dyn Fn(u8) -> String| s.iter().map(|&b| f(b)).collect::<String>().into_bytes();
    match e {
        Encoding::Raw => s.to_vec(),
        Encoding::Json => each(&|b| match b {
            b'"' => "\\\"".into(),
            b'\\' => "\\\\".into(),
            b'/' => "\\/".into(),
            0x20..=0x7e => char::from(b).to_string(),
            _ => format!("\\u{b:04x}"),
        }),
        Encoding::GoJson => each(&|b| match b {
            b'<' | b'>' | b'&' | b'$' | b'/' => format!("\\u{b:04x}"),
            b'"' => "\\\"".into(),
            b'\\' => "\\\\".into(),
            0x20..=0x7e => char::from(b).to_string(),
            _ => format!("\\u{b:04x}"),
        }),
        Encoding::PercentUpper => each(&|b| format!("%{b:02X}")),
        Encoding::PercentLower => each(&|b| format!("%{b:02x}")).to_ascii_lowercase(),
        Encoding::PercentPartly => each(&|b| {
            if b.is_ascii_alphanumeric() {
                char::from(b).to_string()
            } else {
                format!("%{b:02x}")
            }
        }),
        Encoding::Form => each(&|b| match b {
            b' ' => "+".into(),
            b if b.is_ascii_alphanumeric() => char::from(b).to_string(),
            _ => format!("%{b:02X}"),
        }),
        Encoding::HtmlNamed => each(&|b| match b {
            b'&' => "&amp;".into(),
            b'<' => "&lt;".into(),
            b'"' => "&quot;".into(),
            b'$' => "&#36;".into(),
            0x20..=0x7e => char::from(b).to_string(),
            _ => format!("&#{b};"),
        }),
        Encoding::HtmlDecimal => each(&|b| format!("&#{b};")),
        Encoding::HtmlHex => each(&|b| format!("&#x{b:X};")),
        Encoding::Upper => s.to_ascii_uppercase(),
        Encoding::Lower => s.to_ascii_lowercase(),
        Encoding::Base64 => STANDARD.encode(s).into_bytes(),
        Encoding::Base64Url => URL_SAFE_NO_PAD.encode(s).into_bytes(),
        Encoding::HexLower => each(&|b| format!("{b:02x}")),
        Encoding::HexUpper => each(&|b| format!("{b:02X}")),
        Encoding::RustDebug => each(&|b| match b {
            b'\\' | b'\'' => format!("\\{}", char::from(b)),
            0x20..=0x7e => char::from(b).to_string(),
            _ => format!("\\x{b:02x}"),
        }),
        Encoding::JsonOfPercent => encode(Encoding::Json, &encode(Encoding::PercentUpper, s)),
    }
}

#[test]
fn a_reflection_in_every_encoding_is_found_and_the_field_withheld() {
    let s = scrubber(SECRET);
    for e in ENCODINGS {
        let field = [b"{\"x-steal\": \"".as_slice(), &encode(e, SECRET), b"\"}"].concat();
        assert!(s.reflects(&field), "{e:?}: {}", String::from_utf8_lossy(&field));
        let mut withheld = field.clone();
        s.vec(&mut withheld);
        assert_eq!(withheld, WITHHELD.as_bytes());
    }
    // Inside a base64 `user:password` the host built, at each offset.
    for e in [Encoding::Raw, Encoding::Upper] {
        for user in ["", "a", "ab", "abc"] {
            let inner = [user.as_bytes(), b":", &encode(e, SECRET)].concat();
            let basic = [b"Basic ".as_slice(), STANDARD.encode(&inner).as_bytes()].concat();
            assert!(s.reflects(&basic), "{e:?} {user:?}");
        }
    }
    // A run of RUN bytes is a reflection; one byte fewer is not.
    assert!(s.reflects(&SECRET[2..2 + RUN]));
    assert!(!s.reflects(&SECRET[2..1 + RUN]));
    assert!(!s.reflects(b"nothing to see"));
    assert_eq!(s.text("nothing to see"), "nothing to see");
    assert!(Scrubber::new(std::iter::empty::<&[u8]>()).is_empty());
}

#[test]
fn a_reflection_that_begins_inside_an_escape_of_the_plugins_is_found() {
    // The plugin's own bytes, kept as they came, right before a secret the
    // peer encodes: the first escape begins in the plugin's bytes.
    for (secret, before, e) in [
        (b"2fab-tok3n-x".as_slice(), "%", Encoding::PercentPartly),
        (b"8e.tok3n-x+yz", "%", Encoding::PercentLower),
        (b"41;tok3n-xyz", "&#x", Encoding::HtmlNamed),
        (b"\\jr_j<bP", "\\", Encoding::GoJson),
        (b"\\thg~&9\\1fM", "\\", Encoding::RustDebug),
        (b"$-krzjmej q", "\\", Encoding::GoJson),
        (b"u0041tok3n-x", "\\", Encoding::Raw),
    ] {
        let s = scrubber(secret);
        for padding in ["", "\\\\", "%%", "&&#"] {
            let field = [
                b"x: ".as_slice(),
                padding.as_bytes(),
                before.as_bytes(),
                &encode(e, secret),
                b" y",
            ]
            .concat();
            assert!(s.reflects(&field), "{e:?}: {}", String::from_utf8_lossy(&field));
        }
    }
}

#[test]
fn a_secret_with_a_byte_that_is_not_utf8_is_found_before_any_conversion() {
    // (A peer that replaces such a byte with U+FFFD writes other bytes:
    // docs/security.md lists that in the residual.)
    let secret = b"ab\xffcdefgh-ijkl";
    let s = scrubber(secret);
    assert!(s.reflects(&[b"got ".as_slice(), secret].concat()));
    let field = |value: &[u8]| s.field(b"x-echo", value);
    assert_eq!(
        field(&[b"got ".as_slice(), secret].concat()),
        (WITHHELD_HEADER.to_owned(), WITHHELD.to_owned())
    );
    assert_eq!(field(b"got \xff"), ("x-echo".to_owned(), "got \u{fffd}".to_owned()));
    // Written as a code point by a server that read it as Latin-1.
    let s = scrubber(b"ab\xe9cdefgh-ijkl");
    for text in [
        r"ab\u00e9cdefgh-ijkl",
        "ab&#233;cdefgh-ijkl",
        "ab&#xE9;cdefgh-ijkl",
        r"ab\u{e9}cdefgh-ijkl",
        r"ab\xe9cdefgh-ijkl",
    ] {
        assert!(s.reflects(text.as_bytes()), "{text}");
    }
    // And a UTF-8 secret written as code points is still found.
    let s = scrubber("abécdefgh-ijkl".as_bytes());
    assert!(s.reflects(br"ab\u00e9cdefgh-ijkl"));
}

#[test]
fn a_short_secret_is_found_whole_only() {
    let s = scrubber(b"8bytes!!");
    assert!(s.reflects(b"x 8BYTES!! y"));
    assert!(!s.reflects(b"x 8bytes! y"));
}

/// The seed of a generated case, and the generator.
fn cases(target: &str, default: u64) -> impl Iterator<Item = (u64, fastrand::Rng)> {
    let base = std::env::var("SONDE_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    let n = std::env::var("SONDE_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    eprintln!("scrub::{target}: base seed {base} (SONDE_FUZZ_SEED={base} SONDE_FUZZ_ITERS=1 replays it)");
    (0..n).map(move |i| (base.wrapping_add(i), fastrand::Rng::with_seed(base.wrapping_add(i))))
}

/// Bytes no encoding here escapes, in two classes whose decimal
/// references (`&#NN;`, `&#NNN;`) are as long: every encoding of two
/// secrets that differ only within these classes has the same length.
const PLAIN: [&[u8]; 2] = [b"ABCDEFGHIJKLMNOPQRSTUVWXYZabc0123456789", b"defghijklmnopqrstuvwxyz"];

/// Bytes some encoding escapes.
const SYMBOLS: &[u8] = b"/+$&%=<>\"\\ -_.~";

fn plain(b: u8) -> Option<&'static [u8]> {
    PLAIN.into_iter().find(|class| class.contains(&b))
}

/// A secret of `len` bytes: letters, digits and symbols.
fn secret(rng: &mut fastrand::Rng, len: usize) -> Vec<u8> {
    (0..len)
        .map(|_| match rng.u8(..4) {
            0 => SYMBOLS[rng.usize(..SYMBOLS.len())],
            n => {
                let class = PLAIN[usize::from(n) % 2];
                class[rng.usize(..class.len())]
            }
        })
        .collect()
}

/// Another secret whose every encoding is as long as `a`'s: each plain
/// byte replaced by another of its class (a peer's encoding shows how many
/// bytes it escaped: docs/security.md counts that in the residual).
fn twin(rng: &mut fastrand::Rng, a: &[u8]) -> Vec<u8> {
    a.iter()
        .map(|&b| match plain(b) {
            Some(class) => class[rng.usize(..class.len())],
            None => b,
        })
        .collect()
}

/// What a peer program sends: text of its own, the plugin's guesses
/// (which may share parts with a secret), and perhaps a reflection of the
/// secret in some encoding.
struct Program {
    pieces: Vec<Piece>,
    splits: Vec<usize>,
}

#[derive(Debug)]
enum Piece {
    Text(Vec<u8>),
    Reflection(Encoding),
}

impl Program {
    /// A program against secrets of `len` bytes, with guesses made from
    /// `known` (a secret an attacker partly knows).
    fn new(rng: &mut fastrand::Rng, known: &[u8]) -> Self {
        let mut pieces = Vec::new();
        for _ in 0..rng.usize(1..6) {
            let piece = match rng.u8(..4) {
                0 => Piece::Reflection(ENCODINGS[rng.usize(..ENCODINGS.len())]),
                1 => {
                    // A guess: a part of the secret shorter than a run, or
                    // the secret with a byte changed in every run.
                    let mut g = if rng.bool() {
                        known[..rng.usize(1..RUN.min(known.len()))].to_vec()
                    } else {
                        let mut g = known.to_vec();
                        for i in (0..g.len()).step_by(RUN - 1) {
                            g[i] ^= 0x20 | 1;
                        }
                        g
                    };
                    if rng.bool() {
                        g = encode(ENCODINGS[rng.usize(..ENCODINGS.len())], &g);
                    }
                    Piece::Text(g)
                }
                _ => Piece::Text((0..rng.usize(0..300)).map(|_| rng.u8(b' '..=b'~')).collect()),
            };
            pieces.push(piece);
        }
        let total: usize = 1200;
        let mut splits: Vec<usize> = (0..rng.usize(0..12)).map(|_| rng.usize(..total)).collect();
        splits.sort_unstable();
        Self { pieces, splits }
    }

    fn render(&self, secret: &[u8]) -> Vec<u8> {
        self.pieces
            .iter()
            .flat_map(|p| match p {
                Piece::Text(t) => t.clone(),
                Piece::Reflection(e) => encode(*e, secret),
            })
            .collect()
    }

    fn reflects(&self) -> bool {
        self.pieces.iter().any(|p| matches!(p, Piece::Reflection(_)))
    }
}

/// What the plugin reads of `input` split at `splits`: each push's data,
/// and the marker, in order.
fn read(scrubber: &Scrubber, input: &[u8], splits: &[usize]) -> Vec<Vec<u8>> {
    let mut stream = Stream::default();
    let mut out = Vec::new();
    let mut at = 0;
    for &end in splits.iter().chain([input.len()].iter()) {
        let end = end.clamp(at, input.len());
        passed(stream.push(scrubber, &input[at..end]), &mut out);
        at = end;
    }
    passed(stream.release(scrubber), &mut out);
    out
}

/// Whether the marker in `reads` came after a pause that spilled part of
/// a reflection (never, without a pause).
fn spilled(scrubber: &Scrubber, input: &[u8], splits: &[usize]) -> bool {
    let mut stream = Stream::default();
    let mut at = 0;
    let mut spilled = false;
    for &end in splits.iter().chain([input.len()].iter()) {
        let end = end.clamp(at, input.len());
        spilled |= stream.push(scrubber, &input[at..end]).spilled;
        at = end;
    }
    spilled | stream.release(scrubber).spilled
}

fn passed(p: Passed, out: &mut Vec<Vec<u8>>) {
    out.push(p.data);
    if p.withheld {
        out.push(WITHHELD.as_bytes().to_vec());
    }
}

/// The property: with the same program, two secrets of equal length give
/// the plugin the same reads, whatever the guesses share with one of them.
#[test]
fn what_a_stream_hands_on_is_the_same_for_two_secrets_of_equal_length() {
    let (mut cases_run, mut guessed, mut spelled) = (0, 0, 0);
    for (seed, mut rng) in cases("stream_differential", 2000) {
        let len = [8, 11, 12, 13, 24, 64][rng.usize(..6)];
        let a = secret(&mut rng, len);
        let b = twin(&mut rng, &a);
        let program = Program::new(&mut rng, &a);
        let (input_a, input_b) = (program.render(&a), program.render(&b));
        let (scrub_a, scrub_b) = (scrubber(&a), scrubber(&b));
        cases_run += 1;
        let (end_a, end_b) = (
            scrub_a.reflection_end(&input_a, true),
            scrub_b.reflection_end(&input_b, true),
        );
        if end_a != end_b {
            // The guesses (made from `a`), side by side, hold a run of `a`
            // (in some view) before any reflection: a guess that hit, the
            // residual.
            let hit = match (end_a, end_b) {
                (Some(x), Some(y)) => x < y,
                (Some(_), None) => !program.reflects(),
                _ => false,
            };
            if !hit {
                assert!(
                    spells_its_encoding(&a, end_a, end_b),
                    "seed {seed}: a reflection was missed ({end_a:?}, {end_b:?}) a={:?} b={:?} pieces={:?} ia={:?} ib={:?}",
                    String::from_utf8_lossy(&a),
                    String::from_utf8_lossy(&b),
                    program.pieces,
                    String::from_utf8_lossy(&input_a),
                    String::from_utf8_lossy(&input_b)
                );
                spelled += 1;
            }
            guessed += usize::from(hit);
            continue;
        }
        let seen_a = read(&scrub_a, &input_a, &program.splits);
        let seen_b = read(&scrub_b, &input_b, &program.splits);
        if let Some(i) = (0..seen_a.len().max(seen_b.len())).find(|&i| seen_a.get(i) != seen_b.get(i)) {
            let show = |r: Option<&Vec<u8>>| r.map(|r| String::from_utf8_lossy(r).into_owned());
            let pieces: Vec<String> = program
                .pieces
                .iter()
                .map(|p| match p {
                    Piece::Text(t) => format!("Text({:?})", String::from_utf8_lossy(t)),
                    Piece::Reflection(e) => format!("{e:?}"),
                })
                .collect();
            panic!(
                "seed {seed}: read {i} differs between two secrets {:?} and {:?}:\n  {:?}\n  {:?}\nprogram {pieces:?} split at {:?}",
                String::from_utf8_lossy(&a),
                String::from_utf8_lossy(&b),
                show(seen_a.get(i)),
                show(seen_b.get(i)),
                program.splits
            );
        }
        let withheld = seen_a.iter().any(|r| r == WITHHELD.as_bytes());
        assert_eq!(
            withheld,
            scrub_a.reflects(&input_a),
            "seed {seed}: withheld exactly when reflected"
        );
        assert!(withheld || !program.reflects(), "seed {seed}: a reflection was missed");
        assert!(!spilled(&scrub_a, &input_a, &program.splits), "seed {seed}");
    }
    assert!(
        guessed * 20 < cases_run,
        "{guessed} of {cases_run} cases hit by a guess"
    );
    assert!(
        spelled * 100 <= cases_run.max(100),
        "{spelled} of {cases_run} secrets spelled their encoding"
    );
}

/// Whether two reflections found apart are the residual a secret's own
/// bytes make when they spell the start of their encoding (`…&a` found
/// inside `…&amp;`, `…%2` inside `…%25%32`): both found, less than two
/// escapes apart, the secrets (alike in their symbols) holding an escape's
/// first byte where the first run ends (the last three bytes of a short
/// one, the 10th to the 14th of a longer one).
fn spells_its_encoding(secret: &[u8], end_a: Option<usize>, end_b: Option<usize>) -> bool {
    let (Some(x), Some(y)) = (end_a, end_b) else {
        return false;
    };
    x.abs_diff(y) < 2 * views::WIDEST_BYTE
        && secret[secret.len().min(RUN) - 3..secret.len().min(RUN + 2)]
            .iter()
            .any(|b| b"%&\\".contains(b))
}

/// Every split of the same input gives the same bytes (and, for a
/// reflection, a released part that holds no byte of it).
#[test]
fn every_split_of_a_stream_gives_the_same_output() {
    let s = scrubber(SECRET);
    for (seed, mut rng) in cases("stream_splits", 60) {
        let text: Vec<u8> = (0..rng.usize(0..700)).map(|_| rng.u8(b' '..=b'~')).collect();
        let all = read(&s, &text, &[]).concat();
        for split in 0..=text.len() {
            assert_eq!(read(&s, &text, &[split]).concat(), all, "seed {seed} split {split}");
        }
        assert!(
            s.reflects(SECRET) && !s.reflects(&text),
            "seed {seed}: the text is clean"
        );
        assert_eq!(all, text, "seed {seed}: a clean stream arrives whole");
        // A reflection anywhere, cut anywhere: nothing of it is released.
        let e = ENCODINGS[rng.usize(..ENCODINGS.len())];
        let at = rng.usize(..=text.len());
        let input = [&text[..at], &encode(e, SECRET), &text[at..]].concat();
        for split in 0..=input.len() {
            for (i, splits) in [vec![split], vec![split, split + 3, split + 40]].iter().enumerate() {
                let reads = read(&s, &input, splits);
                let marker = reads.iter().position(|r| r == WITHHELD.as_bytes());
                let marker = marker.unwrap_or_else(|| panic!("seed {seed} {e:?} split {split}/{i}: not withheld"));
                let released = reads[..marker].concat();
                assert!(
                    released.len() <= at,
                    "seed {seed} {e:?} split {split}: {} > {at}",
                    released.len()
                );
                assert_eq!(released, input[..released.len()], "seed {seed}: a prefix, as sent");
                assert!(
                    reads[marker + 1..].iter().all(Vec::is_empty),
                    "nothing after the marker"
                );
            }
        }
    }
}

#[test]
fn a_stream_is_handed_on_lag_bytes_behind_then_whole_at_the_end() {
    let s = scrubber(SECRET);
    let mut stream = Stream::default();
    let data = |d: &[u8]| Passed {
        data: d.to_vec(),
        ..Passed::default()
    };
    assert_eq!(stream.push(&s, b"+PONG\r\n"), data(b""));
    assert!(stream.holds());
    assert_eq!(stream.release(&s), data(b"+PONG\r\n"));
    let long = vec![b'x'; LAG + 10];
    assert_eq!(stream.push(&s, &long), data(&[b'x'; 10]));
    // A reflection: the marker as soon as its first run is complete, in
    // place of everything from LAG bytes before that point.
    assert_eq!(
        stream.push(&s, SECRET),
        Passed {
            data: vec![b'x'; RUN],
            withheld: true,
            spilled: false
        }
    );
    assert!(stream.is_withheld() && !stream.holds());
    assert_eq!(stream.push(&s, b"more"), data(b""));
    assert_eq!(stream.release(&s), data(b""));
    assert_eq!(s.reflection_end(b"0123456789s3cr3t/pa$$word", true), Some(10 + RUN));
    assert_eq!(s.reflection_end(b"nothing", true), None);
    // A pause in the middle of a reflection: its first part was handed on
    // (the plugin's wait ended), and the stream says so when the rest comes.
    let mut stream = Stream::default();
    assert_eq!(stream.push(&s, &SECRET[..7]), data(b""));
    assert_eq!(stream.release(&s), data(&SECRET[..7]));
    let rest = stream.push(&s, &SECRET[7..]);
    assert!(rest.withheld && rest.spilled, "{rest:?}");
}

#[test]
fn an_escape_cut_short_by_a_read_is_not_read_until_it_ends() {
    // A secret whose last bytes spell the start of its own encoding: `%2`
    // is how `%25` (its `%`) begins. Cut there, the bytes so far read
    // `…%2` — but the escape may go on, so nothing is found yet; and the
    // secret's twin (`…%D`, whose encoding is as long) reads the same.
    for secret in [b"tok3n-4f9%2".as_slice(), b"tok3n-4f9%D"] {
        let s = scrubber(secret);
        let encoded = encode(Encoding::PercentPartly, secret);
        let cut = encoded.len() - encode(Encoding::PercentPartly, b"%2").len() + 2;
        let mut stream = Stream::default();
        let first = stream.push(&s, &encoded[..cut]);
        assert!(!first.withheld, "{:?}", String::from_utf8_lossy(&encoded[..cut]));
        assert!(stream.push(&s, &encoded[cut..]).withheld);
        // At the end of the stream, what it holds is final.
        let mut stream = Stream::default();
        assert!(!stream.push(&s, &encoded[..cut]).withheld);
        assert_eq!(stream.release(&s).withheld, s.reflects(&encoded[..cut]));
    }
}

/// How long the views of a 64 KiB field take (`--ignored`, release):
/// BENCHMARKS.md's per-byte figure.
#[test]
#[ignore = "a measurement, not a check"]
fn views_of_64_kib_per_byte() {
    let s = scrubber(b"tok-5f1e9a7c3b2d8e4f6a0c");
    let mut rng = fastrand::Rng::with_seed(1);
    for (name, field) in [
        ("base64 lines", {
            let raw: Vec<u8> = (0..49152).map(|_| rng.u8(..)).collect();
            STANDARD
                .encode(&raw)
                .into_bytes()
                .chunks(76)
                .flat_map(|l| l.iter().copied().chain([b'\n']))
                .collect::<Vec<u8>>()
        }),
        (
            "JSON",
            br#"{"name": "db", "ok": true, "latency_ms": 1.5, "note": "a \"quoted\" word & more"}, "#.repeat(800),
        ),
        ("text", b"The quick brown fox jumps over the lazy dog. ".repeat(1450)),
        // Every byte an escape: the most a peer can make the views take.
        ("percent-encoded", {
            let raw: Vec<u8> = (0..21845).map(|_| rng.u8(..)).collect();
            raw.iter().flat_map(|b| format!("%{b:02X}").into_bytes()).collect()
        }),
        ("HTML references", b"&#x41;&amp;&#66;".repeat(4096)),
        ("JSON escapes", br"\u0041\n\\x".repeat(6554)),
    ] {
        let start = std::time::Instant::now();
        let n = 50;
        for _ in 0..n {
            assert!(!s.reflects(&field));
        }
        let per = start.elapsed() / n;
        eprintln!(
            "{name}: {} bytes, {per:?} per field, {:.2} ns/byte",
            field.len(),
            per.as_nanos() as f64 / field.len() as f64
        );
    }
}
