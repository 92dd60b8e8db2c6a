//! The plugin a command names: a built-in or a file.

use super::error::CliError;
use sonde_sandbox::engine::{Engine, Plugin};
use std::sync::Arc;

/// Loads a plugin named on the command line: a built-in name, or a path to
/// a `.wasm` component.
pub(crate) async fn load_plugin(engine: &Engine, name: &str) -> Result<Arc<Plugin>, CliError> {
    let looks_like_path = name.contains('/') || name.ends_with(".wasm");
    if looks_like_path {
        return Ok(engine.load_file(std::path::Path::new(name)).await?);
    }
    match sonde_builtins::get(name) {
        Some(bytes) => Ok(engine.load(name, bytes).await?),
        None => Err(CliError::Message(format!(
            "unknown built-in plugin {name:?} (built-ins: {}); to run a file, give its path, such as ./{name}.wasm",
            sonde_builtins::names().collect::<Vec<_>>().join(", ")
        ))),
    }
}
