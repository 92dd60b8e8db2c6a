//! The per-call check: a call's [`CallGrants`], the [`Use`] of a
//! capability it decides on, and the [`Denied`] a refusal becomes (recorded
//! so the run is reported as denied whatever the plugin makes of it).

use super::pattern::{Grants, Host, HostPattern, NetPattern, PortPattern, canonical_ip};
use crate::reach::{self, OwnListeners};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// The most denials one call keeps; the rest are counted.
const MAX_DENIALS: usize = 8;

/// One use of a capability, as the host is about to make it for a plugin:
/// what [`CallGrants::authorize`] decides on.
#[derive(Clone, Copy, Debug)]
pub enum Use<'a> {
    /// `wasi:sockets`: looking up a name.
    Lookup(&'a str),
    /// `wasi:sockets`: a TCP connect, or a UDP send or receive.
    Connect(SocketAddr),
    /// `wasi:sockets`: binding a local address (port 0 only: a plugin
    /// holds no fixed port).
    Bind(SocketAddr),
    /// `wasi:sockets`: listening or accepting (never).
    Listen(SocketAddr),
    /// An HTTP request, through `wasi:http` or sonde's `http`.
    Http {
        /// The URL's host.
        host: &'a str,
        /// Its port, the scheme's default filled in.
        port: u16,
    },
    /// A connection by sonde's `tcp`.
    Tcp {
        /// The host to dial.
        host: &'a str,
        /// The port.
        port: u16,
    },
    /// A handshake by sonde's `tls`.
    Tls {
        /// The host to dial.
        host: &'a str,
        /// The port.
        port: u16,
    },
    /// A call by sonde's `grpc`.
    Grpc {
        /// The authority's host.
        host: &'a str,
        /// Its port.
        port: u16,
    },
    /// An ICMP echo by sonde's `icmp`. ICMP has no port: only a pattern of
    /// any port (`host:*`, as a bare-host target grants) covers it.
    Icmp {
        /// The host to ping.
        host: &'a str,
    },
    /// A request and its reply by sonde's `udp`.
    Udp {
        /// The host to send to.
        host: &'a str,
        /// The port.
        port: u16,
    },
    /// Running a program by sonde's `exec`.
    Exec(&'a str),
    /// Putting the bytes of the secret `name` on the wire toward
    /// `host:port`: the secret must be in the probe's `grants.secrets`,
    /// and the peer its target or a `net` grant.
    Secret {
        /// The secret's name, as the handle wrote it.
        name: &'a str,
        /// The peer's host.
        host: &'a str,
        /// The peer's port.
        port: u16,
    },
    /// A `wasi:filesystem` path operation inside a `files` grant that the
    /// filesystem refused before making it: the path leads outside the
    /// grant, or names what is not a regular file or directory.
    FileRefused {
        /// The descriptor method, such as `open-at`.
        method: &'a str,
        /// The path it names.
        path: &'a str,
        /// Why it is refused (`leads outside the files grant`, `a FIFO`).
        why: &'a str,
    },
    /// A `wasi:filesystem` path operation (`method`) on `path`.
    File {
        /// The descriptor method, such as `open-at`.
        method: &'a str,
        /// The path it names, if any.
        path: Option<&'a str>,
    },
}

/// Why a use of a capability is refused.
#[derive(Debug)]
enum Refusal {
    /// Nothing grants it.
    NotGranted,
    /// A rule refuses it; the words say which.
    Because(String),
}

/// What `what` is, as a denial names it: `TCP connection to db:5432`.
fn describe(what: Use<'_>) -> String {
    match what {
        Use::Lookup(name) => format!("look up {name:?}"),
        Use::Connect(addr) => format!("connect to {addr}"),
        Use::Bind(addr) => format!("bind {addr}"),
        Use::Listen(addr) => format!("listen on {addr}"),
        Use::Http { host, port } => format!("HTTP request to {host}:{port}"),
        Use::Tcp { host, port } => format!("TCP connection to {host}:{port}"),
        Use::Tls { host, port } => format!("TLS handshake with {host}:{port}"),
        Use::Grpc { host, port } => format!("gRPC call to {host}:{port}"),
        Use::Icmp { host } => format!("ICMP echo to {host}"),
        Use::Udp { host, port } => format!("UDP exchange with {host}:{port}"),
        Use::Exec(program) => format!("exec {program}"),
        Use::Secret { name, host, port } => format!("use secret {name:?} toward {host}:{port}"),
        Use::FileRefused { method, path, .. } => format!("filesystem {method} {path}"),
        Use::File { method, path } => {
            format!(
                "filesystem {method} /{}",
                path.unwrap_or_default().trim_start_matches('/')
            )
        }
    }
}

impl<'a> Use<'a> {
    /// The host and port a connection for this use goes to: for `http`,
    /// `tcp`, `tls`, `grpc` and `udp`.
    pub fn authority(self) -> Option<(&'a str, u16)> {
        match self {
            Use::Http { host, port }
            | Use::Tcp { host, port }
            | Use::Tls { host, port }
            | Use::Grpc { host, port }
            | Use::Udp { host, port } => Some((host, port)),
            _ => None,
        }
    }
}

/// What port a peer check is for: a connection's, or none for an ICMP
/// echo, which only a pattern of any port covers.
#[derive(Clone, Copy, Debug)]
enum PeerPort {
    Port(u16),
    Icmp,
}

impl PeerPort {
    fn admitted_by(self, pattern: PortPattern) -> bool {
        match self {
            Self::Port(port) => pattern.matches(port),
            Self::Icmp => pattern == PortPattern::Any,
        }
    }
}

/// A use of a capability the grants do not allow; it has been recorded.
/// The message is what the plugin is told.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Denied(pub String);

/// The most addresses one call's `wasi:sockets` lookups may add to what it
/// may connect to (and the most refused ones kept to explain a denial).
const MAX_RESOLVED: usize = 256;

/// The grants of one call, consulted by every host capability through
/// [`CallGrants::authorize`] (what a plugin asks for) and
/// [`CallGrants::authorize_peer`] (the address a connection is about to
/// reach). Names the plugin resolves through a granted pattern extend what
/// it may connect to, so a name grant covers the addresses the name
/// resolved to in this call — those a name may lead to ([`crate::reach`]).
#[derive(Debug)]
pub struct CallGrants {
    target: Option<NetPattern>,
    config: Arc<Grants>,
    /// The agent's own listeners, which the engine keeps.
    listeners: Arc<OwnListeners>,
    resolved: Mutex<Resolved>,
    denials: Mutex<(Vec<String>, usize)>,
    /// What this call scrubs from answers ([`crate::secrets::scrub`]).
    pub(super) scrub: Mutex<crate::secrets::scrub::ScrubState>,
}

/// What this call's `wasi:sockets` lookups found: the addresses admitted
/// (with the ports the name was granted for) and, to explain a later
/// connection to one, those refused.
#[derive(Debug, Default)]
struct Resolved {
    admitted: Vec<(IpAddr, PortPattern)>,
    refused: Vec<(IpAddr, String)>,
}

impl CallGrants {
    /// The grants of one call of a probe whose target is `target`, on an
    /// agent listening on `listeners`.
    pub fn new(target: Option<NetPattern>, config: Arc<Grants>, listeners: Arc<OwnListeners>) -> Self {
        Self {
            target,
            config,
            listeners,
            resolved: Mutex::new(Resolved::default()),
            denials: Mutex::new((Vec::new(), 0)),
            scrub: Mutex::default(),
        }
    }

    /// The probe's grants as configured.
    pub fn config(&self) -> &Grants {
        &self.config
    }

    fn patterns(&self) -> impl Iterator<Item = &NetPattern> {
        self.target.iter().chain(&self.config.net)
    }

    /// The one grant check: whether the plugin may make `what`. A refusal
    /// is recorded (so the run is reported as `denied` whatever the plugin
    /// makes of it) and returned with the message for the plugin.
    pub fn authorize(&self, what: Use<'_>) -> Result<(), Denied> {
        match self.refusal(what) {
            None => Ok(()),
            Some(refusal) => Err(self.refuse(what, refusal)),
        }
    }

    fn refusal(&self, what: Use<'_>) -> Option<Refusal> {
        let allowed = match what {
            Use::Lookup(name) => {
                let host = Host::parse(name);
                self.patterns().any(|p| p.host.matches(&host))
            }
            // A plugin's own socket carries what a peer answers straight
            // to the plugin, past the scrubber: a probe that holds secrets
            // talks to peers through the host's transports only.
            Use::Connect(_) if !self.config.secrets.is_empty() => {
                return Some(Refusal::Because(crate::secrets::NO_OWN_SOCKETS.into()));
            }
            // A plugin's own socket: the address is all there is to check.
            Use::Connect(addr) => return self.peer_refusal(None, addr, PeerPort::Port(addr.port())),
            Use::Bind(addr) => addr.port() == 0,
            Use::Listen(_) => false,
            Use::Http { host, port }
            | Use::Tcp { host, port }
            | Use::Tls { host, port }
            | Use::Grpc { host, port }
            | Use::Udp { host, port } => {
                let host = Host::parse(host);
                self.patterns().any(|p| p.matches(&host, port))
            }
            Use::Icmp { host } => {
                let host = Host::parse(host);
                self.patterns()
                    .any(|p| p.port == PortPattern::Any && p.host.matches(&host))
            }
            Use::Secret { name, host, port } => {
                if self.config.secrets.get(name).is_none() {
                    return Some(Refusal::Because(crate::secrets::not_granted(
                        name,
                        &self.config.secrets,
                    )));
                }
                let host = Host::parse(host);
                self.patterns().any(|p| p.matches(&host, port))
            }
            Use::Exec(program) => {
                let path = Path::new(program);
                path.is_absolute() && self.config.exec.iter().any(|p| p == path)
            }
            // The filesystem shows only the granted paths, read-only; a path
            // operation reaches this check only where none is granted.
            Use::File { .. } | Use::FileRefused { .. } => false,
        };
        (!allowed).then_some(Refusal::NotGranted)
    }

    /// Records `what` as refused, and returns the denial for the plugin.
    fn refuse(&self, what: Use<'_>, refusal: Refusal) -> Denied {
        let not_granted = "not the target and not granted";
        let (reason, tell) = match (refusal, what) {
            (Refusal::Because(why), _) => (why.clone(), why),
            (_, Use::Lookup(name)) => (not_granted.into(), format!("{name:?} is {not_granted}")),
            (_, Use::Connect(addr)) => (not_granted.into(), format!("{addr} is {not_granted}")),
            (_, Use::Bind(addr)) => (
                "only port 0 may be bound".into(),
                format!("binding {addr} is not allowed"),
            ),
            (_, Use::Listen(addr)) => (
                "a plugin never listens".into(),
                format!("listening on {addr} is not allowed"),
            ),
            (
                _,
                Use::Http { host, port }
                | Use::Tcp { host, port }
                | Use::Tls { host, port }
                | Use::Grpc { host, port }
                | Use::Udp { host, port }
                | Use::Secret { host, port, .. },
            ) => (not_granted.into(), format!("{host}:{port} is {not_granted}")),
            (_, Use::Icmp { host }) => (
                "not the target and no `net` grant of it with any port".into(),
                format!("{host} is not the target and no `net` grant of it with any port (`HOST:*`) covers ICMP"),
            ),
            (_, Use::Exec(program)) => (
                "not granted".into(),
                format!("{program} is not in the probe's exec grant"),
            ),
            (_, Use::FileRefused { path, why, .. }) => (why.to_string(), format!("{path}: {why}")),
            (_, Use::File { path, .. }) => (
                "no `files` granted".into(),
                format!(
                    "/{} is not in the probe's files grant",
                    path.unwrap_or_default().trim_start_matches('/')
                ),
            ),
        };
        self.record(format!("{}: {reason}", describe(what)));
        Denied(tell)
    }

    /// Whether a pattern that names addresses (an IP, a CIDR or `*`) lets
    /// the probe reach `ip` on `port`; `explicit` leaves `*` out.
    fn address_granted(&self, ip: IpAddr, port: PeerPort, explicit: bool) -> bool {
        let host = Host::Ip(canonical_ip(ip));
        self.patterns()
            .filter(|p| !explicit || matches!(p.host, HostPattern::Cidr(..)))
            .any(|p| port.admitted_by(p.port) && p.host.matches(&host))
    }

    /// Why a connection to `addr` may not be made, or `None` if it may:
    /// the rule every connection a plugin makes the host open obeys, by
    /// any path. `name` is the name `addr` was resolved from by the host,
    /// if it was; a plugin's own socket connects to an address, which its
    /// own lookups in this call may have admitted.
    ///
    /// The agent's own listeners come first: never a tenant's, and the
    /// operator's only through an IP or CIDR grant. Then an address grant
    /// (IP, CIDR or `*`) reaches any address it covers, and a granted name
    /// only the addresses its [`Reach`](crate::reach::Reach) allows.
    ///
    /// For ICMP (`port` is [`PeerPort::Icmp`]) only patterns of any port
    /// count, and no listener is reached (an echo reaches no port).
    fn peer_refusal(&self, name: Option<&str>, addr: SocketAddr, port: PeerPort) -> Option<Refusal> {
        let ip = canonical_ip(addr.ip());
        let shown = SocketAddr::new(ip, addr.port());
        let listener = match port {
            PeerPort::Port(_) => self.listeners.reached_by(shown),
            PeerPort::Icmp => None,
        };
        if let Some(listener) = listener {
            let via = name.map_or_else(String::new, |n| format!("{n} resolved to {ip}: "));
            if !self.config.reach.own_listeners {
                return Some(Refusal::Because(format!(
                    "{via}{shown} reaches the agent's own listener {listener}, which no tenant's probe may reach"
                )));
            }
            if !self.address_granted(ip, port, true) {
                return Some(Refusal::Because(format!(
                    "{via}{shown} reaches the agent's own listener {listener}: only an IP or CIDR grant of it reaches it, not a name or `*`"
                )));
            }
            return None;
        }
        if self.address_granted(ip, port, false) {
            return None;
        }
        match name {
            Some(name) => {
                let host = Host::parse(name);
                if !self
                    .patterns()
                    .any(|p| port.admitted_by(p.port) && p.host.matches(&host))
                {
                    return Some(Refusal::NotGranted);
                }
                reach::name_refusal(self.config.reach, name, ip).map(Refusal::Because)
            }
            None => {
                let resolved = self.resolved.lock().unwrap_or_else(|e| e.into_inner());
                if resolved.admitted.iter().any(|(r, p)| *r == ip && port.admitted_by(*p)) {
                    return None;
                }
                let refused = resolved.refused.iter().find(|(r, _)| *r == ip);
                Some(refused.map_or(Refusal::NotGranted, |(_, why)| Refusal::Because(why.clone())))
            }
        }
    }

    /// The one check of the addresses a connection is about to try, by any
    /// path (the host's `tcp`, `tls`, `http` and `grpc`, `wasi:http`): those
    /// of `candidates` (the addresses `name` resolved to, in the resolver's
    /// order, or the one address the plugin wrote) that
    /// [`Self::peer_refusal`] allows, in order and in canonical form. When
    /// none is allowed, the first refusal is recorded as the denial of
    /// `what`; addresses left out while another is allowed are not (a name
    /// may resolve to several, and the host connects only to one it
    /// checked).
    pub fn authorize_peer(
        &self,
        what: Use<'_>,
        name: Option<&str>,
        candidates: &[SocketAddr],
    ) -> Result<Vec<SocketAddr>, Denied> {
        let mut allowed = Vec::with_capacity(candidates.len());
        let mut first_refusal = None;
        for addr in candidates {
            let port = match what {
                Use::Icmp { .. } => PeerPort::Icmp,
                _ => PeerPort::Port(addr.port()),
            };
            match self.peer_refusal(name, *addr, port) {
                None => allowed.push(SocketAddr::new(canonical_ip(addr.ip()), addr.port())),
                Some(refusal) => {
                    tracing::debug!(name, %addr, ?refusal, "address left out");
                    first_refusal.get_or_insert(refusal);
                }
            }
        }
        if !allowed.is_empty() {
            return Ok(allowed);
        }
        let refusal = first_refusal
            .unwrap_or_else(|| Refusal::Because(format!("{} resolved to no address", name.unwrap_or("the host"))));
        Err(self.refuse(what, refusal))
    }

    /// Whether a connection already open to `peer` (a pooled one, opened
    /// for the name `name` by another call) may serve this call: the same
    /// rule as [`Self::authorize_peer`], recording nothing (a refused
    /// connection is set aside and a new one checked and opened).
    pub fn permits_peer(&self, name: Option<&str>, peer: SocketAddr) -> bool {
        self.config.ip_protocol.is_none_or(|p| p.permits(&peer))
            && self.peer_refusal(name, peer, PeerPort::Port(peer.port())).is_none()
    }

    /// The IP version the probe's connections prefer, if it says
    /// ([`crate::grants::IpProtocol`]).
    pub fn ip_protocol(&self) -> Option<super::IpProtocol> {
        self.config.ip_protocol
    }

    /// Admits what a plugin's `wasi:sockets` lookup of the granted `name`
    /// found: the addresses the name may lead to ([`crate::reach`]) are
    /// returned and may be connected to on the ports granted for `name`;
    /// the others are left out. When every address is left out, the first
    /// refusal is recorded as a denial of the lookup.
    pub fn admit_resolved(&self, name: &str, ips: Vec<IpAddr>) -> Result<Vec<IpAddr>, Denied> {
        let host = Host::parse(name);
        let ports: Vec<PortPattern> = self
            .patterns()
            .filter(|p| p.host.matches(&host))
            .map(|p| p.port)
            .collect();
        let mut admitted = Vec::with_capacity(ips.len());
        let mut first_refusal = None;
        let mut resolved = self.resolved.lock().unwrap_or_else(|e| e.into_inner());
        for ip in ips {
            let ip = canonical_ip(ip);
            let refusal = if self.patterns().any(|p| p.host.matches(&Host::Ip(ip))) {
                None
            } else {
                reach::name_refusal(self.config.reach, name, ip)
            };
            match refusal {
                None => {
                    for port in &ports {
                        if resolved.admitted.len() < MAX_RESOLVED && !resolved.admitted.contains(&(ip, *port)) {
                            resolved.admitted.push((ip, *port));
                        }
                    }
                    admitted.push(ip);
                }
                Some(why) => {
                    if resolved.refused.len() < MAX_RESOLVED {
                        resolved.refused.push((ip, why.clone()));
                    }
                    first_refusal.get_or_insert(why);
                }
            }
        }
        drop(resolved);
        match (admitted.is_empty(), first_refusal) {
            (true, Some(why)) => Err(self.refuse(Use::Lookup(name), Refusal::Because(why))),
            _ => Ok(admitted),
        }
    }

    /// Records a denied use of a capability.
    fn record(&self, what: String) {
        let what = crate::text::plugin_text(what, 1024);
        tracing::debug!(denied = %what, "capability denied");
        let mut d = self.denials.lock().unwrap_or_else(|e| e.into_inner());
        if d.0.len() < MAX_DENIALS {
            d.0.push(what);
        }
        d.1 += 1;
    }

    /// The denials recorded so far, as one message, or `None`.
    pub fn denial_message(&self) -> Option<String> {
        let d = self.denials.lock().unwrap_or_else(|e| e.into_inner());
        let (list, total) = (&d.0, d.1);
        let first = list.first()?;
        Some(match total {
            1 => format!("denied: {first}"),
            n => format!("denied: {first} (and {} more)", n - 1),
        })
    }
}

#[cfg(test)]
impl CallGrants {
    /// Whether `what` would be allowed, recording nothing.
    pub(super) fn allows(&self, what: Use<'_>) -> bool {
        self.refusal(what).is_none()
    }
}
