//! The probes, plugins and targets of /v1/: list, read, change, run.

use super::*;

pub(super) async fn list_probes(who: Principal, State(state): State<ApiState>) -> Response {
    let mut list: Vec<serde_json::Value> = state
        .results
        .list()
        .into_iter()
        .filter(|p| who.sees(&p.tenant))
        .map(|p| serde_json::to_value(p).unwrap_or_default())
        .collect();
    list.extend(waiting(&state, &who, None));
    json(StatusCode::OK, &list)
}

/// The probes waiting for their `oci://` plugin's pull (of `name` only,
/// when given), shown as probes in state `unknown` with a `pulling` field.
pub(super) fn waiting(state: &ApiState, who: &Principal, name: Option<&str>) -> Vec<serde_json::Value> {
    let status = state.status.lock().unwrap_or_else(|e| e.into_inner());
    status
        .pulling
        .iter()
        .filter(|w| who.sees(&w.tenant) && name.is_none_or(|n| *w.probe == *n))
        .map(|w| {
            serde_json::json!({
                "name": w.probe,
                "target": w.target,
                "kind": w.kind,
                "groups": [],
                "tenant": &*w.tenant,
                "plugin": w.plugin,
                "state": Status::Unknown,
                "stale": false,
                "consecutive": 0,
                "last": null,
                "last_transition": null,
                "pulling": w,
            })
        })
        .collect()
}

pub(super) async fn get_probe(who: Principal, State(state): State<ApiState>, Path(name): Path<String>) -> Response {
    match visible_probe(&state, &who, &name) {
        Some(p) => json(StatusCode::OK, &p),
        None => match waiting(&state, &who, Some(&name)).pop() {
            Some(w) => json(StatusCode::OK, &w),
            None => not_found("probe", &name),
        },
    }
}

/// 201 for a new plugin or probe, 200 for a replaced one.
pub(super) fn stored(key: &str, name: &str, replaced: bool) -> Response {
    let status = if replaced { StatusCode::OK } else { StatusCode::CREATED };
    json(status, &serde_json::json!({ key: name, "replaced": replaced }))
}

pub(super) async fn put_probe(
    who: Principal,
    State(state): State<ApiState>,
    Path(name): Path<String>,
    body: Body,
) -> Result<Response, HttpError> {
    let body = read_body(&state, body, sonde_core::uploads::MAX_PROBE_BYTES).await?;
    let owner = |n: &str| state.results.get(n).map(|p| p.tenant);
    let replaced = state.control.put_probe(&who, &name, &body, owner).await?;
    Ok(stored("probe", &name, replaced))
}

/// `PUT /v1/probes`: a batch, all stored or none.
pub(super) async fn put_probes(
    who: Principal,
    State(state): State<ApiState>,
    body: Body,
) -> Result<Response, HttpError> {
    let body = read_body(&state, body, sonde_core::uploads::MAX_BATCH_BYTES).await?;
    let owner = |n: &str| state.results.get(n).map(|p| p.tenant);
    let done = state.control.put_probes(&who, &body, owner).await?;
    let (replaced, added): (Vec<_>, Vec<_>) = done.into_iter().partition(|(_, r)| *r);
    let names = |v: Vec<(String, bool)>| v.into_iter().map(|(n, _)| n).collect::<Vec<_>>();
    Ok(json(
        StatusCode::OK,
        &serde_json::json!({ "added": names(added), "replaced": names(replaced) }),
    ))
}

pub(super) async fn delete_probe(
    who: Principal,
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Response, HttpError> {
    let visible = visible_probe(&state, &who, &name).is_some();
    state.control.delete_probe(&who, &name, visible).await?;
    Ok(json(StatusCode::OK, &serde_json::json!({ "deleted": name })))
}

pub(super) async fn run_probe(who: Principal, State(state): State<ApiState>, Path(name): Path<String>) -> Response {
    if visible_probe(&state, &who, &name).is_none() {
        return not_found("probe", &name);
    }
    match state.scheduler.trigger(&name).await {
        Ok(r) => json(StatusCode::OK, &r),
        Err(e @ TriggerError::NotFound(_)) => error(StatusCode::NOT_FOUND, e.to_string()),
        Err(e) => error(StatusCode::CONFLICT, e.to_string()),
    }
}

pub(super) async fn put_plugin(
    who: Principal,
    State(state): State<ApiState>,
    Path(name): Path<String>,
    headers: axum::http::HeaderMap,
    body: Body,
) -> Result<Response, HttpError> {
    let signature = upload_signature(&headers)?;
    let body = read_body(&state, body, sonde_core::uploads::MAX_PLUGIN_BYTES).await?;
    let replaced = state
        .control
        .put_plugin(&who, &name, &body, signature.as_deref())
        .await?;
    Ok(stored("plugin", &name, replaced))
}

pub(super) async fn delete_plugin(
    who: Principal,
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Response, HttpError> {
    state.control.delete_plugin(&who, &name).await?;
    Ok(json(StatusCode::OK, &serde_json::json!({ "deleted": name })))
}

pub(super) async fn list_targets(who: Principal, State(state): State<ApiState>) -> Response {
    let list: Vec<_> = state
        .results
        .targets()
        .into_iter()
        .filter(|t| who.sees(&t.tenant))
        .collect();
    json(StatusCode::OK, &list)
}

pub(super) async fn get_target(who: Principal, State(state): State<ApiState>, Path(name): Path<String>) -> Response {
    match state
        .results
        .targets()
        .into_iter()
        .find(|t| t.name == name && who.sees(&t.tenant))
    {
        Some(t) => json(StatusCode::OK, &t),
        None => not_found("target", &name),
    }
}

/// The name of the header an upload's signature comes in.
pub(super) const SIGNATURE_HEADER: &str = "sonde-signature";

/// The sigstore bundle in an upload's `Sonde-Signature` header (base64),
/// if any. Its size is the request head's (`api.max_header_bytes`, 431
/// past it), and verifying caps what it reads again.
fn upload_signature(headers: &axum::http::HeaderMap) -> Result<Option<Vec<u8>>, HttpError> {
    use base64::Engine as _;
    let Some(value) = headers.get(SIGNATURE_HEADER) else {
        return Ok(None);
    };
    let bad = |why: &str| HttpError::BadHeader(format!("the Sonde-Signature header {why}"));
    base64::engine::general_purpose::STANDARD
        .decode(value.as_bytes())
        .map(Some)
        .map_err(|_| bad("is not base64 (send the bundle file base64-encoded)"))
}
