//! The fuzzing convention every seeded test follows (docs/security.md):
//! each case is made from one 64-bit seed; `SONDE_FUZZ_SEED` replays one,
//! `SONDE_FUZZ_ITERS` runs more than a target's CI default, and a failing
//! case prints the command that replays it.

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
pub(crate) struct Case {
    module: &'static str,
    target: &'static str,
    /// The case's seed.
    pub(crate) seed: u64,
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
pub(crate) fn cases(
    module: &'static str,
    target: &'static str,
    default: u64,
) -> impl Iterator<Item = (Case, fastrand::Rng)> {
    let base = base_seed(module, target);
    (0..iterations(default)).map(move |i| {
        let seed = base.wrapping_add(i);
        (Case { module, target, seed }, fastrand::Rng::with_seed(seed))
    })
}
