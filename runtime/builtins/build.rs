//! Builds the built-in plugins under `plugins/` for wasm32-wasip2 and
//! generates the table that embeds them (`$OUT_DIR/builtins.rs`).

use std::path::Path;

fn main() {
    // Read at run time, not baked in with env!: a build script binary
    // reused from another checkout's target dir must build this checkout.
    let root = Path::new(&std::env::var_os("CARGO_MANIFEST_DIR").expect("run by cargo")).join("../..");
    let plugins = sonde_build::packages_in(&root.join("plugins"));
    let names: Vec<&str> = plugins.iter().map(|(n, _)| n.as_str()).collect();
    let built = sonde_build::build(&root, &names);
    let mut table =
        String::from("/// Built-in plugins: (name, component bytes).\npub static BUILTINS: &[(&str, &[u8])] = &[\n");
    for b in &built {
        let short = b.package.strip_prefix("sonde-plugin-").unwrap_or(&b.package);
        table.push_str(&format!(
            "    ({short:?}, include_bytes!({:?})),\n",
            b.wasm.display().to_string()
        ));
    }
    table.push_str("];\n");
    let out = Path::new(&std::env::var_os("OUT_DIR").unwrap()).join("builtins.rs");
    std::fs::write(out, table).unwrap();
}
