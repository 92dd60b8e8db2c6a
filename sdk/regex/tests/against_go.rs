//! The dialect beside Go's own `regexp`: random patterns built from what
//! blackbox_exporter users write, on random texts, must compile where Go
//! compiles them and find the same leftmost-first match.
//!
//! Needs `go` on the PATH (scripts/setup.sh installs it); without it the
//! test is skipped with a note, unless `SONDE_REQUIRE_TOOLS=1`.

use std::io::Write;
use std::process::{Command, Stdio};

/// Pieces of patterns: literals, classes, escapes, flags, repetitions,
/// and the spots where Go and the regex crate read a pattern differently.
const PIECES: &[&str] = &[
    "a",
    "b",
    "K",
    "é",
    "ſ",
    "1",
    " ",
    ".",
    "\\d",
    "\\D",
    "\\w",
    "\\W",
    "\\s",
    "\\S",
    "\\b",
    "\\B",
    "[a-c]",
    "[^\\d]",
    "[\\w.]",
    "[[:alpha:]]",
    "[[:^space:]]",
    "\\pL",
    "\\p{Greek}",
    "\\p{^Greek}",
    "\\PN",
    "(?i)",
    "(?s)",
    "(?m)",
    "(?U)",
    "(?i:",
    "(",
    "(?P<g>",
    "(?:",
    ")",
    "|",
    "*",
    "+",
    "?",
    "*?",
    "{2}",
    "{1,2}",
    "{,2}",
    "{",
    "}",
    "^",
    "$",
    "\\A",
    "\\z",
    "\\Q.*\\E",
    "\\Q[",
    "[&&]",
    "[~-]",
    "[]a]",
    "\\x{263a}",
    "\\.",
    "\\{",
    "\\n",
    "\\t",
    "\\v",
    "\\012",
];

/// Characters the texts are made of.
const TEXT: &[&str] = &[
    "a", "A", "b", "k", "K", "\u{212a}", "s", "ſ", "é", "É", "1", "٣", " ", "\t", "\n", "\u{0b}", ".", "{", "}", "[",
    "&", "~", "-", "_", "α", "Ω", "☺", "*",
];

/// A small deterministic generator (xorshift), seeded by
/// `SONDE_FUZZ_SEED` when set.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }

    fn join(&mut self, from: &[&str], most: usize) -> String {
        (0..self.below(most) + 1)
            .map(|_| from[self.below(from.len())])
            .collect()
    }
}

fn go(cases: &[(String, String)]) -> Option<Vec<(bool, i64, i64)>> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/go");
    let child = Command::new("go")
        .args(["run", "main.go"])
        .current_dir(dir)
        .env("GOFLAGS", "-mod=mod")
        .env("GO111MODULE", "off")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) if std::env::var("SONDE_REQUIRE_TOOLS").as_deref() != Ok("1") => {
            eprintln!("skipped: go is not runnable ({e}); scripts/setup.sh installs it");
            return None;
        }
        Err(e) => panic!("go is needed (SONDE_REQUIRE_TOOLS=1): {e}"),
    };
    let input = serde_json::to_vec(cases).unwrap();
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "go run failed");
    let answers: Vec<(i64, i64, i64)> = serde_json::from_slice(&out.stdout).unwrap();
    Some(answers.into_iter().map(|(ok, s, e)| (ok == 1, s, e)).collect())
}

#[test]
fn patterns_compile_and_match_as_go_s_regexp_does() {
    let seed: u64 = std::env::var("SONDE_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_0f60);
    eprintln!("seed {seed} (SONDE_FUZZ_SEED)");
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let cases: Vec<(String, String)> = (0..4000).map(|_| (rng.join(PIECES, 6), rng.join(TEXT, 12))).collect();
    let Some(answers) = go(&cases) else { return };
    let mut differ = Vec::new();
    let mut compiled = 0;
    let mut unsupported = 0;
    for ((pattern, text), (go_ok, start, end)) in cases.iter().zip(answers) {
        let ours = sonde_regex::compile(pattern);
        let found = ours
            .as_ref()
            .ok()
            .map(|re| re.find(text).map_or((-1, -1), |m| (m.start() as i64, m.end() as i64)));
        let agree = match (&ours, go_ok) {
            (Ok(_), true) => found == Some((start, end)),
            (Err(_), false) => true,
            // What the dialect refuses by design (the crate's docs).
            (Err(sonde_regex::Error::Unsupported { .. }), true) => {
                unsupported += 1;
                true
            }
            _ => false,
        };
        compiled += usize::from(go_ok);
        if !agree {
            differ.push(format!(
                "{pattern:?} on {text:?}: go {}, sonde {}",
                if go_ok {
                    format!("{start}..{end}")
                } else {
                    "refuses".into()
                },
                match (&ours, found) {
                    (Err(e), _) => format!("refuses ({e})"),
                    (_, Some((s, e))) => format!("{s}..{e}"),
                    _ => unreachable!(),
                }
            ));
        }
    }
    eprintln!(
        "{} cases, {compiled} compile in Go, {unsupported} of them refused by design, {} differ",
        cases.len(),
        differ.len()
    );
    assert!(
        differ.is_empty(),
        "{} differ:\n{}",
        differ.len(),
        differ.iter().take(40).cloned().collect::<Vec<_>>().join("\n")
    );
}
