//! `wasi:http/outgoing-handler`, filtered: the host sends a plugin's request
//! only when its authority is the probe's target or a `net` grant. Anything
//! else fails with `HTTP-request-denied` and is recorded as a denial; no
//! connection is opened. Each request sent opens a connection, which
//! counts against the call's socket bound ([`super::bounds`]); past it, the
//! request fails with `connection-limit-reached` and the run is reported
//! as `host-limit`.

use super::bounds::CallBounds;
use super::grants::{CallGrants, Use};
use std::future::Future;
use std::sync::Arc;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

/// The `wasi:http` hooks of one call (built per call): its grants, checked
/// before the host sends anything, and its bounds.
pub(crate) struct Hooks {
    grants: Arc<CallGrants>,
    bounds: CallBounds,
}

impl Hooks {
    pub(crate) fn new(grants: Arc<CallGrants>, bounds: CallBounds) -> Self {
        Self { grants, bounds }
    }
}

type ResponseFuture = Box<dyn Future<Output = Result<(), Error>> + Send>;

impl WasiHttpHooks for Hooks {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: ResponseFuture,
    ) -> Box<dyn Future<Output = Result<(http::Response<WasiBody>, ResponseFuture), Error>> + Send> {
        drop(fut);
        let uri = request.uri();
        let https = uri.scheme() == Some(&http::uri::Scheme::HTTPS);
        let host = uri.host().unwrap_or_default();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        if self.grants.authorize(Use::Http { host, port }).is_err() {
            return Box::new(async { Err(Error::HttpRequestDenied) });
        }
        if self.bounds.take_socket().is_err() {
            return Box::new(async { Err(Error::ConnectionLimitReached) });
        }
        Box::new(async move {
            use http_body_util::BodyExt;
            let (response, io) = wasmtime_wasi_http::default_send_request(request, options).await?;
            Ok((response.map(BodyExt::boxed_unsync), Box::new(io) as ResponseFuture))
        })
    }
}
