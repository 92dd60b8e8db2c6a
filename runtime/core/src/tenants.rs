//! Tenants: who owns which probes, what they may use, and how they prove
//! who they are.
//!
//! Every probe belongs to its target's tenant; a target without `tenant:`
//! belongs to the operator's [`DEFAULT_TENANT`], which has no ceiling. A
//! configured tenant has [`Quotas`] (probe count, concurrent runs, and the
//! highest `timeout`, `fuel` and `memory` a probe may ask for) and a
//! [`Ceiling`]: the widest `net`, `exec` and `files` grants its probes may
//! have, the probe's own target included. [`Tenant::check`] is the one check
//! of a probe against both.
//!
//! A tenant may have an API [`Token`]; reading tokens and telling callers
//! apart is [`crate::auth`]'s, which [`Tenants::credentials`] feeds.
//!
//! A ceiling at work: `tests::a_ceiling_admits_what_it_covers_and_names_what_it_does_not`.

use crate::auth::{Principal, Token};
use sonde_policy::grants::path_within;
use sonde_policy::reach::Reach;
use sonde_sandbox::engine::{Limits, limits};
use sonde_sandbox::host::{GrantError, Grants, NetPattern};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Reads a tenant's or the operator's token; the registry's way in to
/// [`crate::auth`].
pub use crate::auth::read_token;

/// A tenant's id, shared by every probe and target it owns.
pub type TenantId = Arc<str>;

/// The operator's tenant: probes of targets without `tenant:`. It has no
/// ceiling and no quotas beyond the agent's own limits.
pub const DEFAULT_TENANT: &str = "default";

/// Default `quotas.max_probes` of a configured tenant.
pub const DEFAULT_MAX_PROBES: usize = 100;
/// Default `quotas.max_concurrent_runs` of a configured tenant.
pub const DEFAULT_MAX_CONCURRENT_RUNS: u32 = 4;
/// Default `quotas.timeout` (the longest per-call deadline) of a configured
/// tenant.
pub const DEFAULT_MAX_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `quotas.fuel` (the largest per-call fuel budget) of a configured
/// tenant: the per-call default.
pub const DEFAULT_MAX_FUEL: u64 = limits::DEFAULT_FUEL;
/// Default `quotas.memory` (the largest per-call memory cap) of a
/// configured tenant: the per-call default.
pub const DEFAULT_MAX_MEMORY: u64 = limits::DEFAULT_MEMORY;

/// What a tenant may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quotas {
    /// Most probes it may own (`max_probes`, default 100).
    pub max_probes: usize,
    /// Most runs of its probes at once (`max_concurrent_runs`, default 4);
    /// further runs wait in its queue.
    pub max_concurrent_runs: u32,
    /// Longest per-call `timeout` a probe may have (`timeout`, default 10s).
    pub timeout: Duration,
    /// Largest per-call `limits.fuel` (`fuel`, default 1,000,000,000).
    pub fuel: u64,
    /// Largest per-call `limits.memory` (`memory`, default 64MiB).
    pub memory: u64,
}

impl Default for Quotas {
    fn default() -> Self {
        Self {
            max_probes: DEFAULT_MAX_PROBES,
            max_concurrent_runs: DEFAULT_MAX_CONCURRENT_RUNS,
            timeout: DEFAULT_MAX_TIMEOUT,
            fuel: DEFAULT_MAX_FUEL,
            memory: DEFAULT_MAX_MEMORY,
        }
    }
}

impl Quotas {
    /// The operator's: bounded only by the agent's own limits.
    pub const UNLIMITED: Quotas = Quotas {
        max_probes: usize::MAX,
        max_concurrent_runs: u32::MAX,
        timeout: Duration::MAX,
        fuel: u64::MAX,
        memory: limits::MAX_MEMORY,
    };

    /// The per-call limits a probe gets when it does not set them: the
    /// defaults, lowered to these ceilings.
    pub fn default_limits(&self) -> Limits {
        let d = Limits::default();
        Limits {
            timeout: d.timeout.min(self.timeout),
            fuel: d.fuel.min(self.fuel),
            memory: d.memory.min(self.memory),
        }
    }
}

/// The widest grants a tenant's probes may have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ceiling {
    /// Addresses its probes may reach, targets included (`net`).
    pub net: Vec<NetPattern>,
    /// Programs its probes may be granted: a path, or a directory whose
    /// programs all are (`exec`).
    pub exec: Vec<PathBuf>,
    /// Directories its probes may be granted, or directories under them
    /// (`files`).
    pub files: Vec<PathBuf>,
    /// Where its probes' `oci://` plugins may come from (`registries`).
    pub registries: Vec<sonde_oci::RegistryScope>,
    /// The trusted signers whose signature makes its plugin files and
    /// `oci://` plugins runnable (`signers`); `None`: any, as the agent's
    /// `trust` and `require_signed` say. Built-ins are always runnable.
    pub signers: Option<Vec<String>>,
    /// Whether a name its probes are granted may lead to a private address
    /// (`names_may_reach: [.., private]`; default no).
    pub names_reach_private: bool,
    /// Whether such a name may lead to a public address
    /// (`names_may_reach: [public, ..]`; default yes).
    pub names_reach_public: bool,
}

impl Default for Ceiling {
    fn default() -> Self {
        Self {
            net: Vec::new(),
            exec: Vec::new(),
            files: Vec::new(),
            registries: Vec::new(),
            signers: None,
            names_reach_private: Reach::TENANT.names_private,
            names_reach_public: Reach::TENANT.names_public,
        }
    }
}

impl Ceiling {
    /// A ceiling from its written parts.
    pub fn parse(net: &[&str], exec: &[&str], files: &[&str]) -> Result<Self, GrantError> {
        Ok(Self {
            net: net.iter().map(|n| n.parse()).collect::<Result<_, _>>()?,
            exec: exec.iter().map(PathBuf::from).collect(),
            files: files.iter().map(PathBuf::from).collect(),
            ..Self::default()
        })
    }

    /// Whether every address `grant` can match is matched by one of the
    /// ceiling's `net` patterns.
    pub fn covers_net(&self, grant: &NetPattern) -> bool {
        self.net.iter().any(|c| grant.within(c))
    }

    /// Whether the program `path` may be granted.
    pub fn covers_exec(&self, path: &Path) -> bool {
        path_within(path, &self.exec)
    }

    /// Whether the directory `path` may be granted.
    pub fn covers_files(&self, path: &Path) -> bool {
        path_within(path, &self.files)
    }
}

/// A probe that does not fit its tenant's ceiling or quotas.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CeilingError {
    /// The probe's target is outside the tenant's `net` ceiling.
    #[error("tenant {tenant:?}: probe {probe:?}: target {target:?} is outside the tenant's net ceiling")]
    Target {
        /// The tenant.
        tenant: TenantId,
        /// The probe.
        probe: String,
        /// The target as written.
        target: String,
    },
    /// A `grants.net` pattern is wider than the ceiling.
    #[error("tenant {tenant:?}: probe {probe:?}: grants.net {grant:?} is wider than the tenant's net ceiling")]
    Net {
        /// The tenant.
        tenant: TenantId,
        /// The probe.
        probe: String,
        /// The grant as written.
        grant: String,
        /// Its place in the probe's `grants.net`.
        index: usize,
    },
    /// A `grants.exec` program is outside the ceiling.
    #[error("tenant {tenant:?}: probe {probe:?}: grants.exec {grant:?} is not in the tenant's exec ceiling")]
    Exec {
        /// The tenant.
        tenant: TenantId,
        /// The probe.
        probe: String,
        /// The program.
        grant: PathBuf,
        /// Its place in the probe's `grants.exec`.
        index: usize,
    },
    /// A `grants.files` directory is outside the ceiling.
    #[error("tenant {tenant:?}: probe {probe:?}: grants.files {grant:?} is not in the tenant's files ceiling")]
    Files {
        /// The tenant.
        tenant: TenantId,
        /// The probe.
        probe: String,
        /// The directory.
        grant: PathBuf,
        /// Its place in the probe's `grants.files`.
        index: usize,
    },
    /// A per-call limit is over the tenant's quota.
    #[error("tenant {tenant:?}: probe {probe:?}: {limit} {value} is over the tenant's quota of {quota}")]
    Limit {
        /// The tenant.
        tenant: TenantId,
        /// The probe.
        probe: String,
        /// `timeout`, `limits.fuel` or `limits.memory`.
        limit: &'static str,
        /// The probe's value, as written for a person.
        value: String,
        /// The quota, likewise.
        quota: String,
    },
}

/// A tenant: its id, quotas, ceiling and API token.
#[derive(Clone, Debug)]
pub struct Tenant {
    /// Its id.
    pub id: TenantId,
    /// What it may use.
    pub quotas: Quotas,
    /// The widest grants of its probes; `None` for the operator (no ceiling).
    pub ceiling: Option<Ceiling>,
    /// Its API token, if it has one.
    pub token: Option<Token>,
    /// Its secrets (`secrets:`), which only its probes may use.
    pub secrets: Vec<Arc<sonde_policy::secrets::SecretCell>>,
}

impl Tenant {
    /// A tenant with no token.
    pub fn new(id: &str, quotas: Quotas, ceiling: Ceiling) -> Self {
        Self {
            id: id.into(),
            quotas,
            ceiling: Some(ceiling),
            token: None,
            secrets: Vec::new(),
        }
    }

    /// What its probes' names may lead to, and whether they may reach the
    /// agent's own listeners ([`sonde_policy::reach`]): the operator's
    /// probes may, through an address grant; a tenant's never.
    pub fn reach(&self) -> Reach {
        match &self.ceiling {
            None => Reach::OPERATOR,
            Some(c) => Reach {
                names_public: c.names_reach_public,
                names_private: c.names_reach_private,
                own_listeners: false,
            },
        }
    }

    /// The operator's tenant: no ceiling, no quotas.
    pub fn operator() -> Self {
        Self {
            id: DEFAULT_TENANT.into(),
            quotas: Quotas::UNLIMITED,
            ceiling: None,
            token: None,
            secrets: Vec::new(),
        }
    }

    /// Whether `target` (`address` parsed), a probe's target or one a
    /// `/probe` request names, is inside the ceiling: the one check of
    /// [`Tenant::check`] that depends on the target alone.
    pub fn check_target(&self, probe: &str, address: &str, target: &NetPattern) -> Result<(), CeilingError> {
        match &self.ceiling {
            Some(ceiling) if !ceiling.covers_net(target) => Err(CeilingError::Target {
                tenant: self.id.clone(),
                probe: probe.to_string(),
                target: address.to_string(),
            }),
            _ => Ok(()),
        }
    }

    /// Every way probe `probe` (its target `address`, `grants` and
    /// `limits`) exceeds this tenant's ceiling or per-call quotas.
    pub fn check(&self, probe: &str, address: &str, grants: &Grants, limits: &Limits) -> Vec<CeilingError> {
        let mut errors = Vec::new();
        let tenant = &self.id;
        let q = &self.quotas;
        let mut limit = |limit, over: bool, value: String, quota: String| {
            if over {
                errors.push(CeilingError::Limit {
                    tenant: tenant.clone(),
                    probe: probe.to_string(),
                    limit,
                    value,
                    quota,
                });
            }
        };
        let dur = |d: Duration| humantime::format_duration(d).to_string();
        let size = |b: u64| bytesize::ByteSize(b).to_string();
        limit(
            "timeout",
            limits.timeout > q.timeout,
            dur(limits.timeout),
            dur(q.timeout),
        );
        limit(
            "limits.fuel",
            limits.fuel > q.fuel,
            limits.fuel.to_string(),
            q.fuel.to_string(),
        );
        limit(
            "limits.memory",
            limits.memory > q.memory,
            size(limits.memory),
            size(q.memory),
        );
        let Some(ceiling) = &self.ceiling else {
            return errors;
        };
        // A target that does not parse is the registry's error, not ours;
        // one that parses must be within the ceiling like any grant.
        if !address.is_empty()
            && let Ok(target) = NetPattern::for_target(address)
            && let Err(e) = self.check_target(probe, address, &target)
        {
            errors.push(e);
        }
        for (index, n) in grants.net.iter().enumerate() {
            if !ceiling.covers_net(n) {
                errors.push(CeilingError::Net {
                    tenant: tenant.clone(),
                    probe: probe.to_string(),
                    grant: n.to_string(),
                    index,
                });
            }
        }
        for (index, x) in grants.exec.iter().enumerate() {
            if !ceiling.covers_exec(x) {
                errors.push(CeilingError::Exec {
                    tenant: tenant.clone(),
                    probe: probe.to_string(),
                    grant: x.clone(),
                    index,
                });
            }
        }
        for (index, f) in grants.files.iter().enumerate() {
            if !ceiling.covers_files(f) {
                errors.push(CeilingError::Files {
                    tenant: tenant.clone(),
                    probe: probe.to_string(),
                    grant: f.clone(),
                    index,
                });
            }
        }
        errors
    }
}

/// Every tenant of a config, the operator's [`DEFAULT_TENANT`] first, and
/// the operator's token.
#[derive(Clone, Debug)]
pub struct Tenants {
    list: Vec<Arc<Tenant>>,
    operator_token: Option<Token>,
}

impl Default for Tenants {
    fn default() -> Self {
        Self {
            list: vec![Arc::new(Tenant::operator())],
            operator_token: None,
        }
    }
}

impl Tenants {
    /// The operator's tenant plus `tenants` (whose ids the caller has made
    /// unique and different from [`DEFAULT_TENANT`]), with the operator's
    /// token.
    pub fn new(tenants: Vec<Tenant>, operator_token: Option<Token>) -> Self {
        let mut list = vec![Arc::new(Tenant::operator())];
        list.extend(tenants.into_iter().map(Arc::new));
        Self { list, operator_token }
    }

    /// These tenants with the operator's secrets set to `secrets`.
    pub fn with_operator_secrets(mut self, secrets: Vec<Arc<sonde_policy::secrets::SecretCell>>) -> Self {
        let mut operator = Tenant::clone(&self.list[0]);
        operator.secrets = secrets;
        self.list[0] = Arc::new(operator);
        self
    }

    /// These tenants and `more` (whose ids the caller has made unique and
    /// different from every one here), with the same operator token: the
    /// config's tenants and those made for Kubernetes namespaces.
    pub fn extended(&self, more: Vec<Tenant>) -> Self {
        let mut list = self.list.clone();
        list.extend(more.into_iter().map(Arc::new));
        Self {
            list,
            operator_token: self.operator_token.clone(),
        }
    }

    /// The tenant `id`.
    pub fn get(&self, id: &str) -> Option<&Arc<Tenant>> {
        self.list.iter().find(|t| &*t.id == id)
    }

    /// The operator's tenant.
    pub fn operator(&self) -> &Arc<Tenant> {
        &self.list[0]
    }

    /// Every tenant, the operator's first.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Tenant>> {
        self.list.iter()
    }

    /// How many tenants there are, the operator's included.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Never true: the operator's tenant is always there.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Whether any token is configured (the API then requires one).
    pub fn has_tokens(&self) -> bool {
        self.operator_token.is_some() || self.list.iter().any(|t| t.token.is_some())
    }

    /// Every configured token and whose it is, the operator's first: what
    /// [`crate::auth::authenticate`] compares a bearer token with.
    pub fn credentials(&self) -> impl Iterator<Item = (&Token, Principal)> {
        let operator = self.operator_token.iter().map(|t| (t, Principal::Operator));
        let tenants = self
            .list
            .iter()
            .filter_map(|t| Some((t.token.as_ref()?, Principal::Tenant(t.id.clone()))));
        operator.chain(tenants)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ceiling_admits_what_it_covers_and_names_what_it_does_not() {
        let acme = Tenant::new(
            "acme",
            Quotas::default(),
            Ceiling::parse(&["10.0.0.0/8:*", "*.acme.internal:443"], &[], &[]).unwrap(),
        );
        let grants = Grants {
            net: vec!["db.acme.internal:443".parse().unwrap()],
            ..Grants::default()
        };
        assert!(
            acme.check("shop-ready", "10.1.2.3:8080", &grants, &Limits::default())
                .is_empty()
        );
        let wide = Grants {
            net: vec!["*:443".parse().unwrap()],
            ..Grants::default()
        };
        let errors = acme.check("shop-ready", "10.1.2.3:8080", &wide, &Limits::default());
        assert!(errors[0].to_string().contains("\"*:443\""));
    }

    fn pat(s: &str) -> NetPattern {
        s.parse().unwrap()
    }

    fn within(grant: &str, ceiling: &str) -> bool {
        pat(grant).within(&pat(ceiling))
    }

    #[test]
    fn cidrs_within_cidrs() {
        assert!(within("10.1.0.0/16:80", "10.0.0.0/8:80"));
        assert!(within("10.1.2.3:80", "10.0.0.0/8:*"));
        assert!(within("10.0.0.0/8:80", "10.0.0.0/8:80"));
        // Wider than the ceiling, or beside it.
        assert!(!within("10.0.0.0/7:80", "10.0.0.0/8:80"));
        assert!(!within("0.0.0.0/0:80", "10.0.0.0/8:80"));
        assert!(!within("11.0.0.1:80", "10.0.0.0/8:80"));
        // The host bits of the grant do not matter beyond the ceiling's prefix.
        assert!(within("10.255.255.255/32:1", "10.0.0.0/8:*"));
        // Families never mix, even the v4-mapped range.
        assert!(!within("[::ffff:10.0.0.1]:80", "10.0.0.0/8:80"));
        assert!(!within("10.0.0.1:80", "[::ffff:10.0.0.0/104]:80"));
        assert!(within("[fd00::1]:80", "[fd00::/8]:*"));
        assert!(!within("[fd00::/7]:80", "[fd00::/8]:*"));
        assert!(within("[::/0]:80", "[::/0]:*"));
    }

    #[test]
    fn ports() {
        assert!(within("10.0.0.1:443", "10.0.0.1:*"));
        assert!(within("10.0.0.1:443", "10.0.0.1:443"));
        assert!(!within("10.0.0.1:*", "10.0.0.1:443"));
        assert!(!within("10.0.0.1:444", "10.0.0.1:443"));
        assert!(within("10.0.0.1:*", "10.0.0.1:*"));
    }

    #[test]
    fn names_and_wildcards() {
        assert!(within("db.acme.internal:443", "*.acme.internal:443"));
        assert!(within("a.b.acme.internal:443", "*.acme.internal:443"));
        assert!(within("DB.Acme.Internal:443", "*.acme.internal:443"));
        // `*.d` does not cover `d` itself, nor a name that merely ends alike.
        assert!(!within("acme.internal:443", "*.acme.internal:443"));
        assert!(!within("evilacme.internal:443", "*.acme.internal:443"));
        // A wildcard is never within a plain name, and is within a wider wildcard.
        assert!(!within("*.acme.internal:443", "acme.internal:443"));
        assert!(within("*.eu.acme.internal:443", "*.acme.internal:443"));
        assert!(within("*.acme.internal:443", "*.acme.internal:*"));
        assert!(!within("*.internal:443", "*.acme.internal:443"));
        assert!(within("db.internal:5432", "db.internal:5432"));
        assert!(!within("db2.internal:5432", "db.internal:5432"));
        // Names and addresses never cover each other: a name resolves anywhere.
        assert!(!within("db.internal:5432", "0.0.0.0/0:*"));
        assert!(!within("10.0.0.1:5432", "*.internal:*"));
    }

    #[test]
    fn any_host() {
        assert!(within("*:443", "*:*"));
        assert!(within("*:443", "*:443"));
        assert!(!within("*:443", "0.0.0.0/0:443"));
        assert!(!within("*:443", "*.acme.internal:443"));
        assert!(!within("*:*", "*:443"));
        assert!(within("db.internal:1", "*:*"));
        assert!(within("10.0.0.0/8:1", "*:1"));
    }

    fn acme() -> Tenant {
        Tenant::new(
            "acme",
            Quotas {
                timeout: Duration::from_secs(2),
                fuel: 100,
                memory: 1 << 20,
                ..Quotas::default()
            },
            Ceiling::parse(&["10.0.0.0/8:*", "*.acme.internal:443"], &["/usr/bin"], &["/etc"]).unwrap(),
        )
    }

    fn limits() -> Limits {
        Limits {
            timeout: Duration::from_secs(1),
            fuel: 100,
            memory: 1 << 20,
        }
    }

    #[test]
    fn the_target_counts_as_a_grant() {
        let t = acme();
        assert!(t.check("p", "10.1.2.3:8080", &Grants::default(), &limits()).is_empty());
        assert!(
            t.check("p", "http://10.1.2.3/x", &Grants::default(), &limits())
                .is_empty()
        );
        assert!(
            t.check("p", "https://shop.acme.internal/", &Grants::default(), &limits())
                .is_empty()
        );
        let e = t.check("p", "127.0.0.1:8080", &Grants::default(), &limits());
        assert!(matches!(&e[..], [CeilingError::Target { .. }]), "{e:?}");
        assert!(e[0].to_string().contains("127.0.0.1:8080"), "{}", e[0]);
        // A name without a port may be reached on any port: wider than `:443`.
        let e = t.check("p", "shop.acme.internal", &Grants::default(), &limits());
        assert_eq!(e.len(), 1, "{e:?}");
        // Probes without a target only have their grants checked.
        assert!(t.check("p", "", &Grants::default(), &limits()).is_empty());
    }

    #[test]
    fn every_grant_and_limit_over_the_ceiling_is_named() {
        let t = acme();
        let grants = Grants {
            net: vec![pat("10.0.0.1:22"), pat("*:443"), pat("11.0.0.0/8:1")],
            exec: vec!["/usr/bin/true".into(), "/bin/sh".into(), "/usr/bin/../../bin/sh".into()],
            files: vec!["/etc/ssl".into(), "/var".into()],
            ..Grants::default()
        };
        let over = Limits {
            timeout: Duration::from_secs(3),
            fuel: 101,
            memory: 2 << 20,
        };
        let e = t.check("shop", "10.1.2.3:80", &grants, &over);
        let text: Vec<String> = e.iter().map(ToString::to_string).collect();
        assert_eq!(text.len(), 8, "{text:#?}");
        assert!(
            text[0].contains("timeout 3s is over the tenant's quota of 2s"),
            "{}",
            text[0]
        );
        assert!(text[1].contains("limits.fuel 101"), "{}", text[1]);
        assert!(text[2].contains("limits.memory"), "{}", text[2]);
        assert_eq!(
            text[3],
            "tenant \"acme\": probe \"shop\": grants.net \"*:443\" is wider than the tenant's net ceiling"
        );
        assert!(matches!(e[3], CeilingError::Net { index: 1, .. }));
        assert!(matches!(e[4], CeilingError::Net { index: 2, .. }));
        assert!(matches!(e[5], CeilingError::Exec { index: 1, .. }));
        assert!(
            matches!(e[6], CeilingError::Exec { index: 2, .. }),
            "`..` never climbs out"
        );
        assert!(matches!(e[7], CeilingError::Files { index: 1, .. }));
    }

    #[test]
    fn a_link_out_of_an_allowed_directory_is_not_within() {
        let dir = tempfile::tempdir().unwrap();
        let allowed = dir.path().join("allowed");
        std::fs::create_dir(&allowed).unwrap();
        std::os::unix::fs::symlink("/etc", allowed.join("etc")).unwrap();
        std::fs::create_dir(allowed.join("sub")).unwrap();
        let c = Ceiling {
            files: vec![allowed.clone()],
            ..Ceiling::default()
        };
        assert!(c.covers_files(&allowed.join("sub")));
        assert!(c.covers_files(&allowed));
        assert!(!c.covers_files(&allowed.join("etc")));
        assert!(!c.covers_files(dir.path()));
    }

    #[test]
    fn the_operator_has_no_ceiling() {
        let grants = Grants {
            net: vec![pat("*:*")],
            ..Grants::default()
        };
        assert!(
            Tenant::operator()
                .check("p", "127.0.0.1:1", &grants, &Limits::default())
                .is_empty()
        );
    }

    #[test]
    fn defaults_are_lowered_to_the_quota() {
        let q = acme().quotas;
        assert_eq!(q.default_limits(), limits());
        assert_eq!(Quotas::UNLIMITED.default_limits(), Limits::default());
    }

    #[test]
    fn every_token_is_a_credential_and_none_prints() {
        let mut acme = acme();
        acme.token = Token::new("acme-token");
        let tenants = Tenants::new(
            vec![acme, Tenant::new("beta", Quotas::default(), Ceiling::default())],
            Token::new("op-token"),
        );
        let whose = |token: &str| crate::auth::authenticate(token, tenants.credentials());
        assert_eq!(whose("acme-token"), Some(Principal::Tenant("acme".into())));
        assert_eq!(whose("op-token"), Some(Principal::Operator));
        assert_eq!(whose("nobody"), None);
        assert_eq!(tenants.credentials().count(), 2, "beta has no token");
        let debug = format!("{tenants:?}");
        assert!(!debug.contains("acme-token") && !debug.contains("op-token"), "{debug}");
    }
}
