//! The container image's recipe (`deploy/kubernetes/Containerfile`).

use crate::repo;

/// The image's base images are pinned by digest: a tag alone moves.
#[test]
fn the_containerfile_pins_its_base_images_by_digest() {
    let path = repo().join("deploy/kubernetes/Containerfile");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let froms: Vec<&str> = text.lines().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(froms.len(), 2, "{froms:?}");
    for from in froms {
        let image = from.split_whitespace().nth(1).unwrap();
        let digest = image.split_once("@sha256:").map(|(_, d)| d).unwrap_or_default();
        assert!(
            digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()),
            "not pinned by digest: {from}"
        );
    }
}
