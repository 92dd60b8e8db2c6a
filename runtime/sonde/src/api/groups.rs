//! /v1/ready/{group} and /v1/live/{group}: a group's verdict for kubelets and load balancers.

use super::*;

/// Whether a probe's state lets its group through.
pub(super) fn passes(kind: Kind, state: Status) -> bool {
    match kind {
        Kind::Liveness => state != Status::Failure,
        Kind::Readiness | Kind::Startup => matches!(state, Status::Success | Status::Warning),
    }
}

#[derive(Serialize)]
pub(super) struct GroupView {
    group: String,
    kind: Kind,
    ok: bool,
    probes: usize,
    failing: Vec<Failing>,
}

#[derive(Serialize)]
pub(super) struct Failing {
    probe: String,
    target: String,
    state: Status,
    stale: bool,
    reason: Option<String>,
    message: String,
}

/// `/v1/ready/{group}` and `/v1/live/{group}`: 200 when every probe of
/// `kind` in the group (that `who` sees) passes, else 503 with the failing.
pub(super) fn group(state: &ApiState, who: &Principal, group: &str, kind: Kind) -> Response {
    let probes: Vec<ProbeView> = state
        .results
        .list()
        .into_iter()
        .filter(|p| who.sees(&p.tenant) && p.groups.iter().any(|g| g == group))
        .collect();
    if probes.is_empty() {
        return error(StatusCode::NOT_FOUND, format!("no probe is in group {group:?}"));
    }
    let of_kind: Vec<&ProbeView> = probes.iter().filter(|p| p.kind == kind).collect();
    let failing: Vec<Failing> = of_kind
        .iter()
        .filter(|p| !passes(kind, p.state))
        .map(|p| Failing {
            probe: p.name.clone(),
            target: p.target.clone(),
            state: p.state,
            stale: p.stale,
            reason: p.last.as_ref().and_then(|o| o.result.reason).map(|r| r.to_string()),
            message: match &p.last {
                Some(o) => o.result.message.clone(),
                None => "not run yet".into(),
            },
        })
        .collect();
    let ok = failing.is_empty();
    let view = GroupView {
        group: group.to_string(),
        kind,
        ok,
        probes: of_kind.len(),
        failing,
    };
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json(status, &view)
}

pub(super) async fn ready(who: Principal, State(state): State<ApiState>, Path(g): Path<String>) -> Response {
    group(&state, &who, &g, Kind::Readiness)
}

pub(super) async fn live(who: Principal, State(state): State<ApiState>, Path(g): Path<String>) -> Response {
    group(&state, &who, &g, Kind::Liveness)
}
