//! `wasi:sockets`, filtered: TCP and UDP reach only the probe's target and
//! its `net` grants, a socket never listens, and a name lookup answers only
//! for granted names. Every refusal is recorded, so the run is reported as
//! `denied` whatever the plugin does with the error.

use super::HostState;
use super::grants::CallGrants;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use wasmtime::component::{HasData, Linker, Resource};
use wasmtime_wasi::WasiCtxBuilder;
use wasmtime_wasi::p2::bindings::sockets::ip_name_lookup::{self, ResolveAddressStream};
use wasmtime_wasi::p2::bindings::sockets::network::{self, ErrorCode, IpAddress, Network};
use wasmtime_wasi::p2::{DynPollable, SocketError};
use wasmtime_wasi::sockets::{SocketAddrUse, WasiSocketsCtxView, WasiSocketsView};

/// Names being resolved in this call, by lookup-stream handle.
#[derive(Default)]
pub(crate) struct Lookups(HashMap<u32, String>);

/// Installs the address check for one call.
pub(crate) fn configure(builder: &mut WasiCtxBuilder, grants: Arc<CallGrants>) {
    builder.allow_tcp(true).allow_udp(true).allow_ip_name_lookup(true);
    builder.socket_addr_check(move |addr, usage| {
        let allowed = allows(&grants, addr, usage);
        if !allowed {
            grants.deny(match usage {
                SocketAddrUse::TcpListen => format!("listen on {addr}"),
                SocketAddrUse::TcpBind | SocketAddrUse::UdpBind => format!("bind {addr}"),
                _ => format!("connect to {addr}: not the target and not granted"),
            });
        }
        Box::pin(async move { allowed })
    });
}

fn allows(grants: &CallGrants, addr: SocketAddr, usage: SocketAddrUse) -> bool {
    match usage {
        // Implicit binds before a connect use port 0; a plugin has no
        // business holding a fixed port.
        SocketAddrUse::TcpBind | SocketAddrUse::UdpBind => addr.port() == 0,
        SocketAddrUse::TcpListen | SocketAddrUse::TcpAccept => false,
        SocketAddrUse::TcpConnect | SocketAddrUse::UdpSend | SocketAddrUse::UdpReceive => grants.allows_addr(addr),
    }
}

/// The name-lookup view of one call.
pub(crate) struct FilteredLookup<'a> {
    inner: WasiSocketsCtxView<'a>,
    grants: &'a CallGrants,
    lookups: &'a mut Lookups,
}

struct LookupData;

impl HasData for LookupData {
    type Data<'a> = FilteredLookup<'a>;
}

fn lookup_view(state: &mut HostState) -> FilteredLookup<'_> {
    FilteredLookup {
        inner: state.sandbox.sockets(),
        grants: &state.grants,
        lookups: &mut state.lookups,
    }
}

pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    ip_name_lookup::add_to_linker::<HostState, LookupData>(linker, lookup_view)
}

fn to_std(ip: IpAddress) -> IpAddr {
    match ip {
        IpAddress::Ipv4((a, b, c, d)) => IpAddr::V4(Ipv4Addr::new(a, b, c, d)),
        IpAddress::Ipv6((a, b, c, d, e, f, g, h)) => IpAddr::V6(Ipv6Addr::new(a, b, c, d, e, f, g, h)),
    }
}

impl network::Host for FilteredLookup<'_> {
    fn convert_error_code(&mut self, error: SocketError) -> wasmtime::Result<ErrorCode> {
        network::Host::convert_error_code(&mut self.inner, error)
    }

    fn network_error_code(&mut self, err: Resource<wasmtime::Error>) -> wasmtime::Result<Option<ErrorCode>> {
        network::Host::network_error_code(&mut self.inner, err)
    }
}

impl network::HostNetwork for FilteredLookup<'_> {
    fn drop(&mut self, this: Resource<Network>) -> wasmtime::Result<()> {
        network::HostNetwork::drop(&mut self.inner, this)
    }
}

impl ip_name_lookup::Host for FilteredLookup<'_> {
    fn resolve_addresses(
        &mut self,
        network: Resource<Network>,
        name: String,
    ) -> Result<Resource<ResolveAddressStream>, SocketError> {
        if !self.grants.allows_lookup(&name) {
            self.grants
                .deny(format!("look up {name:?}: not the target and not granted"));
            return Err(ErrorCode::AccessDenied.into());
        }
        let stream = ip_name_lookup::Host::resolve_addresses(&mut self.inner, network, name.clone())?;
        self.lookups.0.insert(stream.rep(), name);
        Ok(stream)
    }
}

impl ip_name_lookup::HostResolveAddressStream for FilteredLookup<'_> {
    fn resolve_next_address(
        &mut self,
        stream: Resource<ResolveAddressStream>,
    ) -> Result<Option<IpAddress>, SocketError> {
        let rep = stream.rep();
        let next = ip_name_lookup::HostResolveAddressStream::resolve_next_address(&mut self.inner, stream)?;
        if let (Some(ip), Some(name)) = (next, self.lookups.0.get(&rep)) {
            self.grants.note_resolved(name, to_std(ip));
        }
        Ok(next)
    }

    fn subscribe(&mut self, stream: Resource<ResolveAddressStream>) -> wasmtime::Result<Resource<DynPollable>> {
        ip_name_lookup::HostResolveAddressStream::subscribe(&mut self.inner, stream)
    }

    fn drop(&mut self, stream: Resource<ResolveAddressStream>) -> wasmtime::Result<()> {
        self.lookups.0.remove(&stream.rep());
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
        assert!(allows(&g, "0.0.0.0:0".parse().unwrap(), SocketAddrUse::TcpBind));
        assert!(!allows(&g, "0.0.0.0:8080".parse().unwrap(), SocketAddrUse::TcpBind));
        assert!(!allows(&g, "127.0.0.1:80".parse().unwrap(), SocketAddrUse::TcpListen));
        assert!(allows(&g, "127.0.0.1:80".parse().unwrap(), SocketAddrUse::TcpConnect));
        assert!(!allows(&g, "127.0.0.1:81".parse().unwrap(), SocketAddrUse::UdpSend));
    }
}
