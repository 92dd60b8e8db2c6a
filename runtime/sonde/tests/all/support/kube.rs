//! Which real API server an e2e suite runs against
//! (`runtime/sonde/tests/all/kubernetes/e2e*.rs`): the kubeconfig
//! `SONDE_E2E_KUBECONFIG` names; and which real node the real-node suite
//! runs on (`kubernetes/real_node.rs`): the directory `SONDE_E2E_NODE_DIR`
//! names, of a cluster `scripts/kube-cluster.sh start VERSION DIR --node`
//! started. Without one a suite is skipped and says so, unless
//! `SONDE_REQUIRE_KUBE` is set (scripts/test sets it beside the clusters
//! it starts): then a missing server is a failure, and only
//! `SONDE_SKIP_KUBE=<reason>` skips, printing the reason.

use std::path::PathBuf;

/// The kubeconfig test `test` runs against; `None` when it is to be
/// skipped (it has said why). `needs` says what the server must serve.
pub(crate) fn e2e_kubeconfig(test: &str, needs: &str) -> Option<PathBuf> {
    from_env(
        "SONDE_E2E_KUBECONFIG",
        test,
        &format!(
            "set SONDE_E2E_KUBECONFIG to a kubeconfig of a test cluster ({needs}) to run it (scripts/kube-cluster.sh starts one)"
        ),
    )
}

/// The directory of the cluster with a real node test `test` runs on;
/// `None` when it is to be skipped (it has said why).
pub(crate) fn e2e_node_dir(test: &str) -> Option<PathBuf> {
    from_env(
        "SONDE_E2E_NODE_DIR",
        test,
        "set SONDE_E2E_NODE_DIR to the DIR of `scripts/kube-cluster.sh start VERSION DIR --node` (as root) to run it",
    )
}

/// The path in `var`, or the skip (or failure) its absence means.
fn from_env(var: &str, test: &str, how: &str) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(var) {
        return Some(PathBuf::from(path));
    }
    if let Ok(reason) = std::env::var("SONDE_SKIP_KUBE") {
        eprintln!("SKIPPED {test}: SONDE_SKIP_KUBE says: {reason}");
        return None;
    }
    assert!(
        std::env::var_os("SONDE_REQUIRE_KUBE").is_none(),
        "{test}: no server under SONDE_REQUIRE_KUBE: {how}, or SONDE_SKIP_KUBE=<reason> to skip it"
    );
    eprintln!("SKIPPED {test}: {how}");
    None
}
