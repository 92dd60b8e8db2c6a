//! Where a registry exchange may go. A registry is a remote party a tenant
//! chooses; what it answers must not steer the agent at itself or at the
//! node's neighbours: a redirect, a token realm or a registry name that
//! resolves to loopback, an unspecified, link-local (the cloud metadata
//! service at 169.254.169.254), multicast, broadcast or reserved address,
//! in any IPv6 spelling, is refused before any connection is made — the
//! classes of [`sonde_policy::reach`], the one home of that rule.
//!
//! One exception: a registry the operator names by a loopback address or
//! `localhost` (`oci://127.0.0.1:5000/…`, a local or test registry) may use
//! loopback, for itself and where it redirects. Link-local and the rest
//! stay refused for every registry.
//!
//! Literal addresses are checked here ([`Guard::check_url`]); names are
//! checked as they resolve ([`Guard`] is the HTTP client's resolver), and
//! the connection goes to an address so checked, never to a second lookup.

use sonde_policy::reach::{Special, special};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// Why an address is refused, as shown in errors: the kinds of address no
/// name leads a plugin to ([`sonde_policy::reach::special`]), loopback
/// excepted for a registry on loopback.
pub(crate) fn refusal(ip: IpAddr, allow_loopback: bool) -> Option<&'static str> {
    match special(ip)? {
        Special::Loopback if allow_loopback => None,
        kind => Some(kind.word()),
    }
}

fn article(word: &str) -> &'static str {
    if word.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    }
}

/// Whether a registry named `registry` (`HOST[:PORT]`, as in references)
/// may use loopback: it is `localhost` or a loopback address itself.
pub(crate) fn is_local_registry(registry: &str) -> bool {
    let host = match registry.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => registry,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost") || host.parse::<IpAddr>().is_ok_and(|ip| ip.to_canonical().is_loopback())
}

/// A refused destination: the error a redirect policy or the resolver
/// hands the HTTP client, found again in its error chain.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {place} is refused: {why}")]
pub struct Refusal {
    /// What pointed there (`a redirect to`, `the name`, …).
    pub what: &'static str,
    /// The URL or name (at most 200 characters of it).
    pub place: String,
    /// Why it is refused.
    pub why: Why,
}

/// Why a destination is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Why {
    /// A URL of another scheme than http or https.
    #[error("it is not http or https but {0}")]
    Scheme(String),
    /// A URL without a host.
    #[error("it has no host")]
    NoHost,
    /// A literal address of a class registries are not reached at
    /// (`loopback`, `link-local`, …).
    #[error("it is {} {} address", article(.0), .0)]
    Address(&'static str),
    /// A name that resolves to nothing.
    #[error("it resolves to no address")]
    NoAddress,
    /// A name whose every address is of a refused class (each with it).
    #[error("it resolves only to refused addresses: {}", refused_list(.0))]
    OnlyRefused(Vec<(IpAddr, &'static str)>),
    /// A redirect past [`MAX_REDIRECTS`](crate::MAX_REDIRECTS).
    #[error("it is more than {} redirects in a row", crate::MAX_REDIRECTS)]
    TooManyRedirects,
    /// A redirect from HTTPS to plain HTTP.
    #[error("it is plain HTTP after HTTPS")]
    Downgrade,
}

/// `ADDRESS (CLASS), …`.
fn refused_list(refused: &[(IpAddr, &'static str)]) -> String {
    refused
        .iter()
        .map(|(ip, kind)| format!("{ip} ({kind})"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The address policy of one registry's exchanges, and the resolver that
/// applies it to names.
#[derive(Clone, Debug)]
pub(crate) struct Guard {
    /// Whether loopback is allowed (the registry is on loopback itself).
    pub allow_loopback: bool,
}

impl Guard {
    /// Checks a URL about to be asked: its scheme, and its host when it is
    /// a literal address. `what` says what pointed there.
    pub(crate) fn check_url(&self, what: &'static str, url: &reqwest::Url) -> Result<(), Refusal> {
        let refuse = |why: Why| Refusal {
            what,
            place: url.as_str().chars().take(200).collect(),
            why,
        };
        if !matches!(url.scheme(), "http" | "https") {
            return Err(refuse(Why::Scheme(url.scheme().to_string())));
        }
        let ip = match url.host() {
            Some(url::Host::Ipv4(v4)) => IpAddr::V4(v4),
            Some(url::Host::Ipv6(v6)) => IpAddr::V6(v6),
            Some(url::Host::Domain(_)) => return Ok(()),
            None => return Err(refuse(Why::NoHost)),
        };
        match refusal(ip, self.allow_loopback) {
            Some(kind) => Err(refuse(Why::Address(kind))),
            None => Ok(()),
        }
    }
}

impl reqwest::dns::Resolve for Guard {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allow_loopback = self.allow_loopback;
        let host = name.as_str().to_string();
        Box::pin(async move {
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut refused = Vec::new();
            let allowed: Vec<SocketAddr> = found
                .into_iter()
                .filter(|a| match refusal(a.ip(), allow_loopback) {
                    Some(kind) => {
                        refused.push((a.ip(), kind));
                        false
                    }
                    None => true,
                })
                .collect();
            if allowed.is_empty() {
                let why = if refused.is_empty() {
                    Why::NoAddress
                } else {
                    Why::OnlyRefused(refused)
                };
                return Err(Box::new(Refusal {
                    what: "the name",
                    place: host,
                    why,
                }) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// The [`Refusal`] somewhere in `e`'s chain of causes, if there is one.
pub(crate) fn find_refusal(e: &(dyn std::error::Error + 'static)) -> Option<Refusal> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(r) = err.downcast_ref::<Refusal>() {
            return Some(r.clone());
        }
        cur = err.source();
    }
    None
}

/// The guard as the HTTP client's resolver.
pub(crate) fn resolver(guard: &Guard) -> Arc<Guard> {
    Arc::new(guard.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refused_kinds_of_address() {
        let cases = [
            ("127.0.0.1", false, Some("loopback")),
            ("127.0.0.1", true, None),
            ("::1", false, Some("loopback")),
            ("::ffff:127.0.0.1", false, Some("loopback")),
            ("0.0.0.0", true, Some("unspecified")),
            ("::", true, Some("unspecified")),
            ("169.254.169.254", true, Some("link-local")),
            ("::ffff:169.254.169.254", true, Some("link-local")),
            ("fe80::1", true, Some("link-local")),
            ("224.0.0.1", true, Some("multicast")),
            ("ff02::1", true, Some("multicast")),
            ("255.255.255.255", true, Some("broadcast")),
            ("10.1.2.3", false, None),
            ("192.0.2.7", false, None),
            ("2001:db8::1", false, None),
        ];
        for (ip, allow, want) in cases {
            assert_eq!(
                refusal(ip.parse().unwrap(), allow),
                want,
                "{ip} (loopback allowed: {allow})"
            );
        }
    }

    #[test]
    fn only_a_registry_named_by_loopback_may_use_loopback() {
        for local in [
            "localhost",
            "localhost:5000",
            "127.0.0.1:5000",
            "127.9.9.9",
            "[::1]:5000",
        ] {
            assert!(is_local_registry(local), "{local}");
        }
        for remote in [
            "registry.example.com",
            "ghcr.io:443",
            "10.0.0.1:5000",
            "localhost.example",
        ] {
            assert!(!is_local_registry(remote), "{remote}");
        }
    }

    #[test]
    fn literal_urls_are_checked_and_names_wait_for_the_resolver() {
        let guard = Guard { allow_loopback: false };
        let check = |u: &str| guard.check_url("a redirect to", &u.parse().unwrap());
        assert!(check("https://registry.example/v2/").is_ok());
        let e = check("http://169.254.169.254/latest/meta-data/").unwrap_err();
        assert_eq!(
            e.to_string(),
            "a redirect to http://169.254.169.254/latest/meta-data/ is refused: it is a link-local address"
        );
        assert!(check("http://127.0.0.1:9464/v1/probes").is_err());
        assert!(check("http://[::ffff:7f00:1]/").is_err());
        assert!(check("file:///etc/passwd").is_err());
        let local = Guard { allow_loopback: true };
        assert!(
            local
                .check_url("a redirect to", &"http://127.0.0.1:1/".parse().unwrap())
                .is_ok()
        );
        assert!(
            local
                .check_url("a redirect to", &"http://[fe80::1]/".parse().unwrap())
                .is_err()
        );
    }

    #[tokio::test]
    async fn a_name_that_resolves_to_loopback_is_refused_unless_the_registry_is_local() {
        use reqwest::dns::Resolve;
        let name = |n: &str| n.parse::<reqwest::dns::Name>().unwrap();
        let e = Guard { allow_loopback: false }
            .resolve(name("localhost"))
            .await
            .err()
            .expect("refused");
        let r = find_refusal(&*e).expect("a Refusal");
        assert!(
            matches!(&r.why, Why::OnlyRefused(found) if found.iter().all(|(_, kind)| *kind == "loopback")),
            "{r}"
        );
        let ok = Guard { allow_loopback: true }.resolve(name("localhost")).await;
        assert!(ok.is_ok_and(|mut a| a.next().is_some()));
    }
}
