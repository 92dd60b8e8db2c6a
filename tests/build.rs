//! Builds the hostile test guests under `tests/guests/` for wasm32-wasip2 and
//! emits a constant with each component's path (`$OUT_DIR/guests.rs`).

use std::path::Path;

fn main() {
    // Read at run time, not baked in with env!: a build script binary
    // reused from another checkout's target dir must build this checkout.
    let root = Path::new(&std::env::var_os("CARGO_MANIFEST_DIR").expect("run by cargo")).join("..");
    let guests = sonde_build::packages_in(&root.join("tests/guests"));
    let names: Vec<&str> = guests.iter().map(|(n, _)| n.as_str()).collect();
    let built = sonde_build::build(&root, &names);
    let mut consts = String::new();
    for b in &built {
        consts.push_str(&format!(
            "/// The `{}` test guest's component.\npub const {}: &str = {:?};\n",
            b.package,
            b.package.to_uppercase(),
            b.wasm.display().to_string()
        ));
    }
    let out = Path::new(&std::env::var_os("OUT_DIR").unwrap()).join("guests.rs");
    std::fs::write(out, consts).unwrap();
}
