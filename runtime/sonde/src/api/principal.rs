//! Who is calling: a bearer token, checked by sonde or reviewed by the Kubernetes API server.

use super::*;

/// Who is calling: from the bearer token, or the operator when the API
/// needs none. A caller without a valid token is answered 401.
impl FromRequestParts<ApiState> for Principal {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, Response> {
        if !matches!(state.auth, ApiAuth::Token | ApiAuth::Kubernetes) {
            return Ok(Principal::Operator);
        }
        let token = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(auth::bearer)
            .filter(|t| !t.is_empty())
            .ok_or_else(unauthorized)?;
        let known = auth::authenticate(token, state.control.tenants().credentials());
        match (known, &state.reviews) {
            (Some(who), _) => Ok(who),
            (None, Some(reviews)) => reviewed(reviews, token, &parts.method, parts.uri.path()).await,
            (None, None) => Err(unauthorized()),
        }
    }
}

/// A token sonde does not know, reviewed by the API server: the operator
/// for this request when RBAC allows it, else 401 (not authenticated) or
/// 403 (not allowed); 503 when the review cannot be made now.
pub(super) async fn reviewed(
    reviews: &sonde_kubernetes::review::Reviewer,
    token: &str,
    method: &Method,
    path: &str,
) -> Result<Principal, Response> {
    use sonde_kubernetes::review::{Decision, ReviewError};
    let verb = method.as_str().to_ascii_lowercase();
    match reviews.review(token, &verb, path).await {
        Ok(Decision::Allowed { .. }) => Ok(Principal::Operator),
        Ok(Decision::Unauthenticated) => Err(unauthorized()),
        Ok(Decision::Denied { user }) => Err(error(
            StatusCode::FORBIDDEN,
            format!("{user} may not {verb} {path} (RBAC: nonResourceURLs [\"{path}\"], verbs [\"{verb}\"])"),
        )),
        Err(e) => {
            if !matches!(e, ReviewError::Busy { .. }) {
                tracing::warn!(error = %e, "api: cannot review a caller's token");
            }
            let mut r = error(StatusCode::SERVICE_UNAVAILABLE, e.to_string());
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            Err(r)
        }
    }
}

pub(super) fn unauthorized() -> Response {
    let mut r = error(
        StatusCode::UNAUTHORIZED,
        "this API needs a token: Authorization: Bearer <token>",
    );
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}
