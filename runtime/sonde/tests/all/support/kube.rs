//! Which real API server an e2e suite runs against
//! (`runtime/sonde/tests/all/kubernetes/e2e*.rs`): the kubeconfig
//! `SONDE_E2E_KUBECONFIG` names. Without one a suite is skipped and says
//! so, unless `SONDE_REQUIRE_KUBE` is set (scripts/test sets it beside the
//! clusters it starts): then a missing server is a failure, and only
//! `SONDE_SKIP_KUBE=<reason>` skips, printing the reason.

use std::path::PathBuf;

/// The kubeconfig test `test` runs against; `None` when it is to be
/// skipped (it has said why). `needs` says what the server must serve.
pub(crate) fn e2e_kubeconfig(test: &str, needs: &str) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("SONDE_E2E_KUBECONFIG") {
        return Some(PathBuf::from(path));
    }
    if let Ok(reason) = std::env::var("SONDE_SKIP_KUBE") {
        eprintln!("SKIPPED {test}: SONDE_SKIP_KUBE says: {reason}");
        return None;
    }
    let how = format!("set SONDE_E2E_KUBECONFIG to a kubeconfig of a test cluster ({needs}) to run it");
    assert!(
        std::env::var_os("SONDE_REQUIRE_KUBE").is_none(),
        "{test}: no API server under SONDE_REQUIRE_KUBE: {how} (scripts/kube-cluster.sh starts one), or SONDE_SKIP_KUBE=<reason> to skip it"
    );
    eprintln!("SKIPPED {test}: {how}");
    None
}
