//! The built-in plugins, compiled from `plugins/` by the build script and
//! embedded in the binary. They are trusted by being embedded.

include!(concat!(env!("OUT_DIR"), "/builtins.rs"));

/// The component of the built-in plugin `name`, if there is one.
pub fn get(name: &str) -> Option<&'static [u8]> {
    BUILTINS.iter().find(|(n, _)| *n == name).map(|(_, b)| *b)
}

/// The names of every built-in plugin.
pub fn names() -> impl Iterator<Item = &'static str> {
    BUILTINS.iter().map(|(n, _)| *n)
}
