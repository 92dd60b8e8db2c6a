//! `wasi:sockets` (`ip-name-lookup`, and the address check of `tcp` and
//! `udp`), filtered: TCP and UDP reach only the probe's target and
//! its `net` grants, a socket never listens, and a name lookup answers only
//! for granted names. Every refusal is recorded, so the run is reported as
//! `denied` whatever the plugin does with the error.
//!
//! Creating a socket (even one never connected) holds a file descriptor,
//! so it counts against the call's socket bound ([`super::bounds`]): past
//! it, `create-tcp-socket` and `create-udp-socket` answer
//! `new-socket-limit` and the run is reported as `host-limit`.
//!
//! A name lookup is the host's own ([`Lookup`]), not wasmtime-wasi's, so
//! that it is bounded: an address in any spelling is answered at once (the
//! one canonical parse of the grants), and a name is resolved through
//! [`super::dial::lookup`] — agent-wide lookup slots and blocking threads
//! — with at most [`LOOKUPS_PER_CALL`](super::bounds::LOOKUPS_PER_CALL)
//! in flight per call. Past that, `resolve-addresses` answers
//! `temporary-resolver-failure` and the run is reported as `host-limit`.
//! What a lookup finds is admitted once, by
//! [`CallGrants::admit_resolved`]: the plugin sees (and may connect to)
//! only the addresses its name may lead to ([`sonde_policy::reach`]); a name that
//! leads nowhere it may answers `access-denied`, recorded as a denial.

use super::bounds::{CallBounds, LookupSlot};
use sonde_policy::grants::{CallGrants, Host, Use};
use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use wasmtime::component::{HasData, Linker, Resource};
use wasmtime_wasi::WasiCtxBuilder;
use wasmtime_wasi::p2::bindings::sockets::ip_name_lookup::{self, ResolveAddressStream};
use wasmtime_wasi::p2::bindings::sockets::network::{self, ErrorCode, IpAddress, IpAddressFamily, Network};
use wasmtime_wasi::p2::bindings::sockets::{tcp_create_socket, udp_create_socket};
use wasmtime_wasi::p2::{DynPollable, Pollable, SocketError, TcpSocket, UdpSocket};
use wasmtime_wasi::sockets::{SocketAddrUse, WasiSocketsCtxView};

/// The sockets state of one call (built per call): the names being
/// resolved, by lookup-stream handle, until their answer is admitted.
#[derive(Default)]
pub(crate) struct SocketsCtx {
    lookups: HashMap<u32, String>,
}

/// Installs the address check of one call in its WASI context: every
/// connect, send, bind and listen goes through the grants.
pub(crate) fn configure(builder: &mut WasiCtxBuilder, grants: Arc<CallGrants>) {
    builder.allow_tcp(true).allow_udp(true).allow_ip_name_lookup(true);
    builder.socket_addr_check(move |addr, usage| {
        let allowed = grants.authorize(use_of(addr, usage)).is_ok();
        Box::pin(async move { allowed })
    });
}

fn use_of(addr: SocketAddr, usage: SocketAddrUse) -> Use<'static> {
    match usage {
        // Implicit binds before a connect use port 0.
        SocketAddrUse::TcpBind | SocketAddrUse::UdpBind => Use::Bind(addr),
        SocketAddrUse::TcpListen | SocketAddrUse::TcpAccept => Use::Listen(addr),
        SocketAddrUse::TcpConnect | SocketAddrUse::UdpSend | SocketAddrUse::UdpReceive => Use::Connect(addr),
    }
}

/// What the name lookup sees of one call: wasmtime-wasi's sockets, the
/// call's grants, and its [`SocketsCtx`].
pub(crate) struct SocketsView<'a> {
    /// wasmtime-wasi's sockets of the call.
    pub(crate) inner: WasiSocketsCtxView<'a>,
    /// The call's grants.
    pub(crate) grants: &'a CallGrants,
    /// The call's lookups.
    pub(crate) ctx: &'a mut SocketsCtx,
    /// The call's bounds.
    pub(crate) bounds: &'a mut CallBounds,
}

struct Sockets;

impl HasData for Sockets {
    type Data<'a> = SocketsView<'a>;
}

/// Replaces wasmtime-wasi's `ip-name-lookup` in `linker` (the
/// once-per-process phase) with one that answers only for granted names,
/// and its `tcp-create-socket` and `udp-create-socket` with ones that count
/// against the call's bounds: wasmtime-wasi has no hook for either. `get`
/// gives the view of the call in the store's data.
pub(crate) fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    get: fn(&mut T) -> SocketsView<'_>,
) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let added = ip_name_lookup::add_to_linker::<T, Sockets>(linker, get)
        .and_then(|()| tcp_create_socket::add_to_linker::<T, Sockets>(linker, get))
        .and_then(|()| udp_create_socket::add_to_linker::<T, Sockets>(linker, get));
    linker.allow_shadowing(false);
    added
}

impl SocketsView<'_> {
    fn take_socket(&mut self) -> Result<(), SocketError> {
        self.bounds.take_socket().map_err(|_| ErrorCode::NewSocketLimit.into())
    }
}

impl tcp_create_socket::Host for SocketsView<'_> {
    fn create_tcp_socket(&mut self, family: IpAddressFamily) -> Result<Resource<TcpSocket>, SocketError> {
        self.take_socket()?;
        tcp_create_socket::Host::create_tcp_socket(&mut self.inner, family)
    }
}

impl udp_create_socket::Host for SocketsView<'_> {
    async fn create_udp_socket(&mut self, family: IpAddressFamily) -> Result<Resource<UdpSocket>, SocketError> {
        self.take_socket()?;
        udp_create_socket::Host::create_udp_socket(&mut self.inner, family).await
    }
}

impl network::Host for SocketsView<'_> {
    fn convert_error_code(&mut self, error: SocketError) -> wasmtime::Result<ErrorCode> {
        network::Host::convert_error_code(&mut self.inner, error)
    }

    fn network_error_code(&mut self, err: Resource<wasmtime::Error>) -> wasmtime::Result<Option<ErrorCode>> {
        network::Host::network_error_code(&mut self.inner, err)
    }
}

impl network::HostNetwork for SocketsView<'_> {
    fn drop(&mut self, this: Resource<Network>) -> wasmtime::Result<()> {
        network::HostNetwork::drop(&mut self.inner, this)
    }
}

type Resolving = Pin<Box<dyn Future<Output = Result<Vec<IpAddr>, ErrorCode>> + Send>>;

/// One name lookup of a plugin (the host's `resolve-address-stream`): the
/// lookup in flight, holding its per-call slot, or its answer.
pub(crate) enum Lookup {
    /// In flight; the slot counts it against the call's bound until done.
    Pending { resolving: Resolving, _slot: LookupSlot },
    /// Answered.
    Done(Result<std::vec::IntoIter<IpAddr>, ErrorCode>),
}

impl Lookup {
    fn poll_done(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if let Self::Pending { resolving, .. } = self {
            match resolving.as_mut().poll(cx) {
                Poll::Ready(r) => *self = Self::Done(r.map(Vec::into_iter)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for Lookup {
    async fn ready(&mut self) {
        std::future::poll_fn(|cx| self.poll_done(cx)).await
    }
}

/// The handle the guest holds, as the binding's type (a handle is its
/// index in the table; the entry there is a [`Lookup`]).
fn as_stream(lookup: &Resource<Lookup>) -> Resource<ResolveAddressStream> {
    Resource::new_own(lookup.rep())
}

fn as_lookup(stream: &Resource<ResolveAddressStream>) -> Resource<Lookup> {
    Resource::new_borrow(stream.rep())
}

impl ip_name_lookup::Host for SocketsView<'_> {
    fn resolve_addresses(
        &mut self,
        network: Resource<Network>,
        name: String,
    ) -> Result<Resource<ResolveAddressStream>, SocketError> {
        self.inner.table.get(&network)?;
        if self.grants.authorize(Use::Lookup(&name)).is_err() {
            return Err(ErrorCode::AccessDenied.into());
        }
        let lookup = match Host::parse(&name) {
            Host::Ip(ip) => Lookup::Done(Ok(vec![ip].into_iter())),
            Host::Numeric => return Err(ErrorCode::InvalidArgument.into()),
            Host::Name(_) => {
                // An ASCII name as a resolver takes it (IDNA to punycode).
                let Ok(url::Host::Domain(domain)) = url::Host::parse(&name) else {
                    return Err(ErrorCode::InvalidArgument.into());
                };
                let slot = self
                    .bounds
                    .take_lookup()
                    .map_err(|_| SocketError::from(ErrorCode::TemporaryResolverFailure))?;
                let bounds = self.bounds.clone();
                let resolving: Resolving = Box::pin(async move {
                    super::dial::lookup(&domain, &bounds).await.map_err(|e| {
                        tracing::debug!(error = %e, "name lookup failed");
                        ErrorCode::NameUnresolvable
                    })
                });
                Lookup::Pending { resolving, _slot: slot }
            }
        };
        let lookup = self.inner.table.push(lookup)?;
        self.ctx.lookups.insert(lookup.rep(), name);
        Ok(as_stream(&lookup))
    }
}

impl ip_name_lookup::HostResolveAddressStream for SocketsView<'_> {
    fn resolve_next_address(
        &mut self,
        stream: Resource<ResolveAddressStream>,
    ) -> Result<Option<IpAddress>, SocketError> {
        let rep = stream.rep();
        let lookup = self.inner.table.get_mut(&as_lookup(&stream))?;
        let waker = std::task::Waker::noop();
        if lookup.poll_done(&mut Context::from_waker(waker)).is_pending() {
            return Err(ErrorCode::WouldBlock.into());
        }
        // The first answer is admitted once: the addresses the name may
        // lead to are kept (and may be connected to), the others left out;
        // a name that leads only where it may not is a denial.
        if let Some(name) = self.ctx.lookups.remove(&rep)
            && let Lookup::Done(Ok(addrs)) = lookup
        {
            let found: Vec<IpAddr> = addrs.collect();
            *lookup = match self.grants.admit_resolved(&name, found) {
                Ok(admitted) => Lookup::Done(Ok(admitted.into_iter())),
                Err(_) => Lookup::Done(Err(ErrorCode::AccessDenied)),
            };
        }
        let next = match lookup {
            Lookup::Done(Ok(addrs)) => addrs.next(),
            Lookup::Done(Err(e)) => return Err((*e).into()),
            Lookup::Pending { .. } => unreachable!("polled to completion above"),
        };
        Ok(next.map(IpAddress::from))
    }

    fn subscribe(&mut self, stream: Resource<ResolveAddressStream>) -> wasmtime::Result<Resource<DynPollable>> {
        wasmtime_wasi::p2::subscribe(self.inner.table, as_lookup(&stream))
    }

    fn drop(&mut self, stream: Resource<ResolveAddressStream>) -> wasmtime::Result<()> {
        self.ctx.lookups.remove(&stream.rep());
        self.inner.table.delete(Resource::<Lookup>::new_own(stream.rep()))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sonde_policy::grants::{Grants, NetPattern};

    #[test]
    fn binds_only_ephemeral_and_never_listens() {
        let g = CallGrants::new(
            Some(NetPattern::for_target("127.0.0.1:80").unwrap()),
            Arc::new(Grants::default()),
            Arc::default(),
        );
        let allows = |addr: &str, usage| g.authorize(use_of(addr.parse().unwrap(), usage)).is_ok();
        assert!(allows("0.0.0.0:0", SocketAddrUse::TcpBind));
        assert!(!allows("0.0.0.0:8080", SocketAddrUse::TcpBind));
        assert!(!allows("127.0.0.1:80", SocketAddrUse::TcpListen));
        assert!(allows("127.0.0.1:80", SocketAddrUse::TcpConnect));
        assert!(!allows("127.0.0.1:81", SocketAddrUse::UdpSend));
    }
}
