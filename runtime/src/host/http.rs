//! `wasi:http/outgoing-handler`, filtered: the host sends a plugin's request
//! only when its authority is the probe's target or a `net` grant. Anything
//! else fails with `HTTP-request-denied` and is recorded as a denial; no
//! connection is opened.

use super::grants::CallGrants;
use std::future::Future;
use std::sync::Arc;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

/// The HTTP hooks of one call.
pub(crate) struct Hooks {
    grants: Arc<CallGrants>,
}

impl Hooks {
    pub(crate) fn new(grants: Arc<CallGrants>) -> Self {
        Self { grants }
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
        let host = uri.host().unwrap_or_default().to_string();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        if !self.grants.allows_authority(&host, port) {
            self.grants
                .deny(format!("HTTP request to {host}:{port}: not the target and not granted"));
            return Box::new(async { Err(Error::HttpRequestDenied) });
        }
        Box::new(async move {
            use http_body_util::BodyExt;
            let (response, io) = wasmtime_wasi_http::default_send_request(request, options).await?;
            Ok((response.map(BodyExt::boxed_unsync), Box::new(io) as ResponseFuture))
        })
    }
}
