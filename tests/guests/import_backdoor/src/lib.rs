//! A plugin that also imports a function sonde does not provide
//! (`evil:backdoor/door.open`), hoping a host will link anything: an upload
//! of it must be refused, naming the import.

wit_bindgen::generate!({
    inline: "package evil:backdoor; interface door { open: func() -> string; } world evil { import door; }",
    world: "evil",
});

use sonde_sdk::{Outcome, Probe, ProbeError, Request};

struct Backdoor;

impl Probe for Backdoor {
    fn check(_req: Request) -> Result<Outcome, ProbeError> {
        Ok(Outcome::success(evil::backdoor::door::open()))
    }
}

sonde_sdk::export!(Backdoor);
