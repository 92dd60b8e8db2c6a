//! `oci://` references and the registry patterns of a tenant's ceiling.

use super::OciError;
use sonde_policy::identity::Digest;
use std::fmt;

/// A plugin in an OCI registry: `oci://HOST[:PORT]/REPO[:TAG][@sha256:HEX]`.
///
/// At least a tag or a digest must be given (sonde never guesses `latest`).
/// With a digest the reference is *pinned*: it names one manifest forever,
/// whatever happens to any tag.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Reference {
    registry: String,
    repository: String,
    tag: Option<String>,
    digest: Option<String>,
}

/// The scheme every registry reference starts with.
pub(crate) const SCHEME: &str = "oci://";

impl Reference {
    /// Parses `oci://HOST[:PORT]/REPO[:TAG][@sha256:HEX]`. The host is a DNS
    /// name, `localhost` or an IPv4 address; the repository has one or more
    /// `/`-separated lowercase components (the OCI distribution grammar).
    pub fn parse(s: &str) -> Result<Self, OciError> {
        let bad = |detail: &str| OciError::InvalidReference {
            reference: s.to_string(),
            detail: detail.to_string(),
        };
        let rest = s.strip_prefix(SCHEME).ok_or_else(|| bad("must start with oci://"))?;
        let (registry, path) = rest
            .split_once('/')
            .ok_or_else(|| bad("expected oci://HOST/REPOSITORY:TAG or @sha256:DIGEST"))?;
        check_registry(registry).map_err(|d| bad(&d.to_string()))?;
        let (name_tag, digest) = match path.split_once('@') {
            Some((n, d)) => {
                if Digest::parse(d).is_err() {
                    return Err(bad("the digest must be sha256: and 64 lowercase hex digits"));
                }
                (n, Some(d.to_string()))
            }
            None => (path, None),
        };
        let (repository, tag) = match name_tag.rsplit_once(':') {
            Some((r, t)) if !t.contains('/') => (r, Some(t.to_string())),
            _ => (name_tag, None),
        };
        check_repository(repository).map_err(|d| bad(&d.to_string()))?;
        if let Some(t) = &tag {
            check_tag(t).map_err(|d| bad(&d.to_string()))?;
        }
        if tag.is_none() && digest.is_none() {
            return Err(bad(
                "name a tag (:1.4) or a digest (@sha256:…); sonde does not assume :latest",
            ));
        }
        Ok(Self {
            registry: registry.to_string(),
            repository: repository.to_string(),
            tag,
            digest,
        })
    }

    /// Whether `s` is meant as a registry reference (starts with `oci://`).
    pub fn is_oci(s: &str) -> bool {
        s.starts_with(SCHEME)
    }

    /// The registry: `HOST` or `HOST:PORT`.
    pub fn registry(&self) -> &str {
        &self.registry
    }

    /// The repository inside the registry, such as `acme/pg-check`.
    pub fn repository(&self) -> &str {
        &self.repository
    }

    /// The tag, if the reference names one.
    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    /// The manifest digest (`sha256:HEX`), if the reference is pinned.
    pub fn digest(&self) -> Option<&str> {
        self.digest.as_deref()
    }

    /// Whether the reference names a digest, so it cannot change.
    pub fn is_pinned(&self) -> bool {
        self.digest.is_some()
    }

    /// The same repository pinned to `digest` (the tag is kept for display).
    pub fn with_digest(&self, digest: &str) -> Self {
        Self {
            digest: Some(digest.to_string()),
            ..self.clone()
        }
    }

    /// The same repository at another tag, with no digest.
    pub(crate) fn with_tag(&self, tag: &str) -> Self {
        Self {
            tag: Some(tag.to_string()),
            digest: None,
            ..self.clone()
        }
    }

    /// The reference as oci-client takes it.
    pub(crate) fn to_client(&self) -> oci_client::Reference {
        match (&self.tag, &self.digest) {
            (_, Some(d)) => {
                oci_client::Reference::with_digest(self.registry.clone(), self.repository.clone(), d.clone())
            }
            (Some(t), None) => {
                oci_client::Reference::with_tag(self.registry.clone(), self.repository.clone(), t.clone())
            }
            (None, None) => unreachable!("parse requires a tag or a digest"),
        }
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for Reference {
    type Err = OciError;
    fn from_str(s: &str) -> Result<Self, OciError> {
        Self::parse(s)
    }
}

/// What is wrong with one part of a reference.
#[derive(Debug, thiserror::Error)]
enum PartError {
    #[error("registry port {0:?} is not a port number")]
    Port(String),
    #[error("registry host {0:?} is not a host name or IPv4 address")]
    Host(String),
    #[error("the repository must be 1 to 255 characters")]
    RepositoryLength,
    #[error("repository component {0:?} must be lowercase letters and digits separated by . _ __ or -")]
    RepositoryComponent(String),
    #[error("tag {0:?} must be 1 to 128 of letters, digits, . _ - (not starting with . or -)")]
    Tag(String),
}

fn check_registry(registry: &str) -> Result<(), PartError> {
    let (host, port) = match registry.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (registry, None),
    };
    if let Some(p) = port
        && !matches!(p.parse::<u16>(), Ok(n) if n != 0)
    {
        return Err(PartError::Port(p.to_string()));
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if host.is_empty() || host.len() > 253 || !host.split('.').all(label_ok) {
        return Err(PartError::Host(host.to_string()));
    }
    Ok(())
}

/// One repository path component: `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`.
fn component_ok(c: &str) -> bool {
    let b = c.as_bytes();
    if b.is_empty() || !b[0].is_ascii_alphanumeric() || !b[b.len() - 1].is_ascii_alphanumeric() {
        return false;
    }
    if !b
        .iter()
        .all(|&x| x.is_ascii_lowercase() || x.is_ascii_digit() || matches!(x, b'.' | b'_' | b'-'))
    {
        return false;
    }
    // Separators: one `.`, one or two `_`, or any run of `-`; never mixed.
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_alphanumeric() {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !b[i].is_ascii_alphanumeric() {
            i += 1;
        }
        let sep = &c[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-');
        if !ok {
            return false;
        }
    }
    true
}

fn check_repository(repository: &str) -> Result<(), PartError> {
    if repository.is_empty() || repository.len() > 255 {
        return Err(PartError::RepositoryLength);
    }
    match repository.split('/').find(|c| !component_ok(c)) {
        Some(c) => Err(PartError::RepositoryComponent(c.to_string())),
        None => Ok(()),
    }
}

fn check_tag(tag: &str) -> Result<(), PartError> {
    let b = tag.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|&x| x.is_ascii_alphanumeric() || matches!(x, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(PartError::Tag(tag.to_string()))
    }
}

/// A pattern of registry references, as a tenant's ceiling lists them:
/// `registry.acme.io/acme/*` (every repository under `acme/`),
/// `registry.acme.io/*` (the whole registry) or
/// `registry.acme.io/acme/pg-check` (that repository, any tag or digest).
/// An `oci://` prefix is allowed and ignored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegistryScope {
    registry: String,
    /// Repository path (no trailing `/`), empty for the whole registry.
    path: String,
    /// Whether the pattern ends in `/*`.
    subtree: bool,
}

impl RegistryScope {
    /// Parses a pattern; `*` is allowed only as the whole last component.
    pub fn parse(s: &str) -> Result<Self, OciError> {
        let bad = |detail: &str| OciError::InvalidReference {
            reference: s.to_string(),
            detail: detail.to_string(),
        };
        let rest = s.strip_prefix(SCHEME).unwrap_or(s);
        let (registry, path) = rest
            .split_once('/')
            .ok_or_else(|| bad("expected HOST/REPOSITORY, HOST/PREFIX/* or HOST/*"))?;
        check_registry(registry).map_err(|d| bad(&d.to_string()))?;
        let (path, subtree) = match path.strip_suffix('*') {
            Some("") => (String::new(), true),
            Some(p) => match p.strip_suffix('/') {
                Some(p) => (p.to_string(), true),
                None => return Err(bad("* must be a whole path component, as in acme/*")),
            },
            None => (path.to_string(), false),
        };
        if path.contains('*') {
            return Err(bad("* is allowed only at the end, as in acme/*"));
        }
        if !path.is_empty() {
            check_repository(&path).map_err(|d| bad(&d.to_string()))?;
        } else if !subtree {
            return Err(bad("name a repository, PREFIX/* or * after the host"));
        }
        Ok(Self {
            registry: registry.to_string(),
            path,
            subtree,
        })
    }

    /// Whether `reference` falls under this pattern: the same registry (host
    /// and port, compared exactly) and a repository equal to the path, or
    /// under it for a `/*` pattern (`acme/*` covers `acme/x` and `acme/x/y`,
    /// not `acme` nor `acme-evil/x`).
    pub fn covers(&self, reference: &Reference) -> bool {
        if !self.registry.eq_ignore_ascii_case(reference.registry()) {
            return false;
        }
        let repo = reference.repository();
        if !self.subtree {
            return repo == self.path;
        }
        if self.path.is_empty() {
            return true;
        }
        repo.strip_prefix(self.path.as_str())
            .is_some_and(|rest| rest.starts_with('/') && rest.len() > 1)
    }
}

impl fmt::Display for RegistryScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.path.is_empty(), self.subtree) {
            (true, _) => write!(f, "{}/*", self.registry),
            (false, true) => write!(f, "{}/{}/*", self.registry, self.path),
            (false, false) => write!(f, "{}/{}", self.registry, self.path),
        }
    }
}

impl std::str::FromStr for RegistryScope {
    type Err = OciError;
    fn from_str(s: &str) -> Result<Self, OciError> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn parses_tags_digests_and_ports() {
        let r = Reference::parse("oci://registry.example.com/acme/pg-check:1.4").unwrap();
        assert_eq!(
            (r.registry(), r.repository(), r.tag(), r.digest()),
            ("registry.example.com", "acme/pg-check", Some("1.4"), None)
        );
        let r = Reference::parse(&format!("oci://127.0.0.1:5000/pg@{D}")).unwrap();
        assert_eq!(
            (r.registry(), r.repository(), r.tag(), r.digest()),
            ("127.0.0.1:5000", "pg", None, Some(D))
        );
        assert!(r.is_pinned());
        let r = Reference::parse(&format!("oci://localhost:5000/a/b/c:v1@{D}")).unwrap();
        assert_eq!((r.repository(), r.tag()), ("a/b/c", Some("v1")));
        assert_eq!(r.to_string(), format!("oci://localhost:5000/a/b/c:v1@{D}"));
    }

    #[test]
    fn refuses_what_is_not_a_reference() {
        for bad in [
            "registry.example.com/acme/pg:1",
            "oci://registry.example.com/acme/pg",
            "oci://registry.example.com/Acme/pg:1",
            "oci://registry.example.com/acme/pg:.bad",
            "oci://registry.example.com/acme/pg@sha256:abc",
            "oci://registry.example.com/acme/pg@md5:0123",
            "oci://registry.example.com:0/pg:1",
            "oci://registry.example.com:99999/pg:1",
            "oci://reg_istry/pg:1",
            "oci://registry.example.com/acme//pg:1",
            "oci://registry.example.com/acme/pg-:1",
            "oci://registry.example.com/a._b:1",
            "oci://host",
        ] {
            let e = Reference::parse(bad).unwrap_err();
            assert!(e.to_string().contains(bad), "{bad}: {e}");
        }
    }

    #[test]
    fn a_scope_covers_its_subtree_and_nothing_beside_it() {
        let s = RegistryScope::parse("registry.acme.io/acme/*").unwrap();
        let r = |s: &str| Reference::parse(s).unwrap();
        assert!(s.covers(&r("oci://registry.acme.io/acme/pg:1")));
        assert!(s.covers(&r("oci://registry.acme.io/acme/team/pg:1")));
        assert!(s.covers(&r("oci://REGISTRY.acme.io/acme/pg:1")));
        assert!(!s.covers(&r("oci://registry.acme.io/acme:1")));
        assert!(!s.covers(&r("oci://registry.acme.io/acme-evil/pg:1")));
        assert!(!s.covers(&r("oci://registry.acme.io/other/pg:1")));
        assert!(!s.covers(&r("oci://registry.acme.io:5000/acme/pg:1")));
        assert!(!s.covers(&r("oci://evil.io/acme/pg:1")));

        let whole = RegistryScope::parse("oci://registry.acme.io/*").unwrap();
        assert!(whole.covers(&r("oci://registry.acme.io/x:1")));
        assert!(!whole.covers(&r("oci://registry.acme.io.evil.io/x:1")));

        let one = RegistryScope::parse("registry.acme.io/acme/pg").unwrap();
        assert!(one.covers(&r(&format!("oci://registry.acme.io/acme/pg@{D}"))));
        assert!(!one.covers(&r("oci://registry.acme.io/acme/pg2:1")));
        assert_eq!(one.to_string(), "registry.acme.io/acme/pg");

        for bad in [
            "registry.acme.io",
            "registry.acme.io/ac*",
            "registry.acme.io/*/x",
            "registry.acme.io/",
        ] {
            assert!(RegistryScope::parse(bad).is_err(), "{bad}");
        }
    }
}
