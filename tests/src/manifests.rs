//! The manifests sonde ships (`deploy/kubernetes/`), as text and as the
//! documents of a multi-document YAML file.

use crate::tools::repo;

/// The text of `deploy/kubernetes/<name>`.
pub fn text(name: &str) -> String {
    let path = repo().join("deploy/kubernetes").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A multi-document YAML text's documents.
pub fn split(text: &str) -> Vec<&str> {
    text.split("\n---\n").collect()
}
