//! The files sonde ships: its manifests (`deploy/kubernetes/`), as text
//! and as the documents of a multi-document YAML file, and the fenced YAML
//! blocks of a doc.

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

/// The fenced YAML blocks of `text`: (line, info string, body).
pub fn yaml_blocks(text: &str) -> Vec<(usize, String, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, String, String)> = None;
    for (i, line) in text.lines().enumerate() {
        match (&mut open, line.trim_start().strip_prefix("```")) {
            (None, Some(info)) if info.starts_with("yaml") => open = Some((i + 1, info.to_string(), String::new())),
            (None, Some(_)) => open = Some((i + 1, "other".into(), String::new())),
            (Some(_), Some(_)) => {
                let block = open.take().unwrap();
                if block.1.starts_with("yaml") {
                    blocks.push(block);
                }
            }
            (Some((_, _, body)), None) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, None) => {}
        }
    }
    blocks
}
