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

use super::bounds::CallBounds;
use super::grants::{CallGrants, Use};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use wasmtime::component::{HasData, Linker, Resource};
use wasmtime_wasi::WasiCtxBuilder;
use wasmtime_wasi::p2::bindings::sockets::ip_name_lookup::{self, ResolveAddressStream};
use wasmtime_wasi::p2::bindings::sockets::network::{self, ErrorCode, IpAddress, IpAddressFamily, Network};
use wasmtime_wasi::p2::bindings::sockets::{tcp_create_socket, udp_create_socket};
use wasmtime_wasi::p2::{DynPollable, SocketError, TcpSocket, UdpSocket};
use wasmtime_wasi::sockets::{SocketAddrUse, WasiSocketsCtxView};

/// The sockets state of one call (built per call): the names being
/// resolved, by lookup-stream handle, so each address they resolve to can
/// be granted.
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

fn to_std(ip: IpAddress) -> IpAddr {
    match ip {
        IpAddress::Ipv4((a, b, c, d)) => IpAddr::V4(Ipv4Addr::new(a, b, c, d)),
        IpAddress::Ipv6((a, b, c, d, e, f, g, h)) => IpAddr::V6(Ipv6Addr::new(a, b, c, d, e, f, g, h)),
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

impl ip_name_lookup::Host for SocketsView<'_> {
    fn resolve_addresses(
        &mut self,
        network: Resource<Network>,
        name: String,
    ) -> Result<Resource<ResolveAddressStream>, SocketError> {
        if self.grants.authorize(Use::Lookup(&name)).is_err() {
            return Err(ErrorCode::AccessDenied.into());
        }
        let stream = ip_name_lookup::Host::resolve_addresses(&mut self.inner, network, name.clone())?;
        self.ctx.lookups.insert(stream.rep(), name);
        Ok(stream)
    }
}

impl ip_name_lookup::HostResolveAddressStream for SocketsView<'_> {
    fn resolve_next_address(
        &mut self,
        stream: Resource<ResolveAddressStream>,
    ) -> Result<Option<IpAddress>, SocketError> {
        let rep = stream.rep();
        let next = ip_name_lookup::HostResolveAddressStream::resolve_next_address(&mut self.inner, stream)?;
        if let (Some(ip), Some(name)) = (next, self.ctx.lookups.get(&rep)) {
            self.grants.note_resolved(name, to_std(ip));
        }
        Ok(next)
    }

    fn subscribe(&mut self, stream: Resource<ResolveAddressStream>) -> wasmtime::Result<Resource<DynPollable>> {
        ip_name_lookup::HostResolveAddressStream::subscribe(&mut self.inner, stream)
    }

    fn drop(&mut self, stream: Resource<ResolveAddressStream>) -> wasmtime::Result<()> {
        self.ctx.lookups.remove(&stream.rep());
        ip_name_lookup::HostResolveAddressStream::drop(&mut self.inner, stream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::grants::{Grants, NetPattern};

    #[test]
    fn binds_only_ephemeral_and_never_listens() {
        let g = CallGrants::new(
            Some(NetPattern::for_target("127.0.0.1:80").unwrap()),
            Arc::new(Grants::default()),
        );
        let allows = |addr: &str, usage| g.authorize(use_of(addr.parse().unwrap(), usage)).is_ok();
        assert!(allows("0.0.0.0:0", SocketAddrUse::TcpBind));
        assert!(!allows("0.0.0.0:8080", SocketAddrUse::TcpBind));
        assert!(!allows("127.0.0.1:80", SocketAddrUse::TcpListen));
        assert!(allows("127.0.0.1:80", SocketAddrUse::TcpConnect));
        assert!(!allows("127.0.0.1:81", SocketAddrUse::UdpSend));
    }
}
