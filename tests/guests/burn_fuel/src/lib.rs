//! Burns CPU on real work that would end, but only after far more fuel than
//! any budget allows.

use sonde_sdk::{Outcome, Probe, ProbeError, Request};

struct BurnFuel;

impl Probe for BurnFuel {
    fn check(_req: Request) -> Result<Outcome, ProbeError> {
        let mut x: u64 = 1;
        for i in 0..u64::MAX {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
        Ok(Outcome::success(format!("{x}")))
    }
}

sonde_sdk::export!(BurnFuel);
