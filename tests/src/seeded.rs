//! The fuzzing convention every seeded test follows (docs/security.md):
//! each case is made from one 64-bit seed; `SONDE_FUZZ_SEED` replays one,
//! `SONDE_FUZZ_ITERS` runs more than a target's CI default, and a failing
//! case prints the command that replays it. Beside it, the generic
//! mutations the targets share and the config corpus they start from.

use std::path::PathBuf;

/// How many cases a target runs: `SONDE_FUZZ_ITERS`, else its CI default.
fn iterations(default: u64) -> u64 {
    std::env::var("SONDE_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The first case's seed: `SONDE_FUZZ_SEED`, else a new one each run (so
/// CI explores), printed.
fn base_seed(module: &str, target: &str) -> u64 {
    let seed = std::env::var("SONDE_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("{module}::{target}: base seed {seed}");
    seed
}

/// One case: names its seed if the case fails.
pub struct Case {
    module: &'static str,
    target: &'static str,
    /// The case's seed.
    pub seed: u64,
}

impl Drop for Case {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "{module}::{target}: case with seed {seed} failed; replay it with\n  \
                 SONDE_FUZZ_SEED={seed} SONDE_FUZZ_ITERS=1 cargo test --workspace --test all -- {module}::{target}",
                module = self.module,
                target = self.target,
                seed = self.seed
            );
        }
    }
}

/// The cases of `module::target`: each a [`Case`] guard and its generator.
pub fn cases(module: &'static str, target: &'static str, default: u64) -> impl Iterator<Item = (Case, fastrand::Rng)> {
    let base = base_seed(module, target);
    (0..iterations(default)).map(move |i| {
        let seed = base.wrapping_add(i);
        (Case { module, target, seed }, fastrand::Rng::with_seed(seed))
    })
}

/// Up to `max` random bytes.
pub fn bytes(rng: &mut fastrand::Rng, max: usize) -> Vec<u8> {
    let n = rng.usize(..=max);
    std::iter::repeat_with(|| rng.u8(..)).take(n).collect()
}

/// `seed` with a few random edits: flips, inserted `tokens`, deleted and
/// repeated ranges.
pub fn mutate(rng: &mut fastrand::Rng, seed: &[u8], tokens: &[&str]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..rng.usize(1..=8) {
        let at = rng.usize(..=v.len());
        match rng.u8(..6) {
            0 if !v.is_empty() => {
                let i = rng.usize(..v.len());
                v[i] ^= 1 << rng.u8(..8);
            }
            1 | 2 if !tokens.is_empty() => {
                let t = tokens[rng.usize(..tokens.len())];
                v.splice(at..at, t.bytes());
            }
            3 if at < v.len() => {
                let end = rng.usize(at..=v.len().min(at + 64));
                v.drain(at..end);
            }
            4 if at < v.len() => {
                let end = rng.usize(at..=v.len().min(at + 64));
                let piece = v[at..end].to_vec();
                for _ in 0..rng.usize(1..4) {
                    v.splice(at..at, piece.iter().copied());
                }
            }
            _ => {
                let i = rng.usize(..=v.len());
                v.insert(i, rng.u8(..));
            }
        }
    }
    v
}

/// Tokens of YAML (and of sonde's config) that mutations of a config insert.
pub const YAML_TOKENS: &[&str] = &[
    ":",
    ": ",
    "\n",
    "\n  ",
    "- ",
    "{",
    "}",
    "[",
    "]",
    ",",
    "'",
    "\"",
    "&a ",
    "*a",
    "!!binary ",
    "!!str ",
    "? ",
    "#",
    "~",
    "null",
    "true",
    "-1",
    "0",
    "99999999999999999999",
    "1e400",
    "0x10",
    "NaN",
    "500ms",
    "1ns",
    "999999999h",
    "64MiB",
    "0B",
    "18446744073709551615B",
    "*",
    "*:*",
    "[::1]:9",
    "::ffff:127.0.0.1:80",
    "10.0.0.0/8:*",
    "127.0.0.1:99999",
    "/proc",
    "/dev/zero",
    "../..",
    "\u{0}",
    "\u{202e}",
    "\u{1b}[2J",
    "name",
    "tenant",
    "probes",
    "targets",
    "plugin",
    "grants",
    "net",
    "exec",
    "files",
    "env",
    "limits",
    "fuel",
    "memory",
    "timeout",
    "period",
    "kind",
    "liveness",
    "startup",
    "ceiling",
    "quotas",
    "max_probes",
    "api",
    "max_connections",
    "state_dir",
    "token_env",
    "token_file",
    "on_failure",
    "command",
    "groups",
    "<<: *a",
];

/// The valid config cases, the corpus the mutations start from. References
/// to OCI registries are left out: a mutated one would wait on a network.
pub fn config_corpus() -> Vec<(PathBuf, String)> {
    let dir = crate::tools::repo().join("tests/cases/config");
    let mut out = Vec::new();
    for sub in ["valid", "invalid"] {
        for e in std::fs::read_dir(dir.join(sub)).unwrap().flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "yaml") {
                let text = std::fs::read_to_string(&p).unwrap();
                if !text.contains("oci://") {
                    out.push((p, text));
                }
            }
        }
    }
    out.sort();
    assert!(out.len() >= 3, "the config corpus is missing");
    out
}

/// A plugin body from a good component `good`: itself, random bytes, a
/// prefix of it, a bare wasm header, or it with random bytes changed.
pub fn plugin_body(rng: &mut fastrand::Rng, good: &[u8]) -> Vec<u8> {
    match rng.u8(..6) {
        0 => good.to_vec(),
        1 => bytes(rng, 4096),
        2 => good[..rng.usize(..good.len())].to_vec(),
        3 => b"\0asm\x01\0\0\0".to_vec(),
        _ => {
            let mut v = good.to_vec();
            for _ in 0..rng.usize(1..16) {
                let i = rng.usize(..v.len());
                v[i] = rng.u8(..);
            }
            v
        }
    }
}
