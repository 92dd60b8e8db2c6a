//! Why an API call is refused, and reading a request's body within its limits.

use super::*;

/// Why an API call is answered with an error: each becomes its status and
/// a JSON `{"error": …}` body ([`IntoResponse`]), so a handler says `?`.
#[derive(Debug)]
pub(crate) enum HttpError {
    /// A change the control refused.
    Refused(ControlError),
    /// The request's body is over its limit.
    BodyTooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// The request's body did not arrive within `api: body_read_timeout`.
    BodyTimeout(std::time::Duration),
    /// The request's body could not be read.
    BodyUnreadable(String),
    /// A request header is malformed: what is wrong with it.
    BadHeader(String),
}

impl From<ControlError> for HttpError {
    fn from(e: ControlError) -> Self {
        Self::Refused(e)
    }
}

impl IntoResponse for HttpError {
    /// The one place a refused call becomes an HTTP status.
    fn into_response(self) -> Response {
        match self {
            Self::Refused(e) => {
                let status = match &e {
                    ControlError::BadName { .. } | ControlError::BadSpec { .. } => StatusCode::BAD_REQUEST,
                    ControlError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
                    ControlError::NotFound { .. } => StatusCode::NOT_FOUND,
                    ControlError::Conflict(_) => StatusCode::CONFLICT,
                    ControlError::Invalid { .. } => StatusCode::UNPROCESSABLE_ENTITY,
                    ControlError::Unavailable { .. } | ControlError::Pulling { .. } => StatusCode::SERVICE_UNAVAILABLE,
                    ControlError::Internal { .. } => StatusCode::INTERNAL_SERVER_ERROR,
                };
                error(status, e.to_string())
            }
            Self::BodyTooLarge { limit } => error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the body is larger than the {limit} byte limit"),
            ),
            Self::BodyTimeout(timeout) => error(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the body did not arrive within {} (api: body_read_timeout)",
                    humantime::format_duration(timeout)
                ),
            ),
            Self::BodyUnreadable(why) => error(StatusCode::BAD_REQUEST, format!("cannot read the body: {why}")),
            Self::BadHeader(why) => error(StatusCode::BAD_REQUEST, why),
        }
    }
}

/// The request body, whole: at most `limit` bytes (else 413), arrived
/// within the API's `body_read_timeout` (else 408).
pub(super) async fn read_body(state: &ApiState, body: Body, limit: usize) -> Result<Bytes, HttpError> {
    // A declared length past the limit is refused before a byte is read.
    if hyper::body::Body::size_hint(&body).lower() > limit as u64 {
        return Err(HttpError::BodyTooLarge { limit });
    }
    let timeout = state.limits.body_read_timeout;
    let read = http_body_util::Limited::new(body, limit).collect();
    let Ok(read) = tokio::time::timeout(timeout, read).await else {
        return Err(HttpError::BodyTimeout(timeout));
    };
    match read {
        Ok(b) => Ok(b.to_bytes()),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
            Err(HttpError::BodyTooLarge { limit })
        }
        Err(e) => Err(HttpError::BodyUnreadable(e.to_string())),
    }
}
