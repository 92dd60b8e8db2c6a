//! Allocates memory until something stops it.

use sonde_sdk::{Outcome, Probe, ProbeError, Request};

struct AllocForever;

impl Probe for AllocForever {
    fn check(_req: Request) -> Result<Outcome, ProbeError> {
        let mut hoard: Vec<Vec<u8>> = Vec::new();
        loop {
            // Touch every page so the memory is really used.
            hoard.push(vec![1u8; 1 << 20]);
            std::hint::black_box(&hoard);
        }
    }
}

sonde_sdk::export!(AllocForever);
