//! What can be wrong with a config, as data: every refusal rule of the
//! catalog is one [`ConfigProblem`] variant, whose text names the key first
//! (`period: 50ms is below the 100ms minimum`). The pipeline's steps return
//! problems with their source location; [`Located::into_error`] turns one
//! into the [`ConfigError`] (file:line:column: text) a person reads.

use crate::auth::TokenError;
use crate::config::{ConfigError, Kind, Place};
use crate::tenants::{CeilingError, TenantId};
use sonde_sandbox::host::GrantError;
use std::path::PathBuf;
use std::time::Duration;

/// A problem and where it was written.
#[derive(Debug)]
pub struct Located {
    /// Where in the file (serde-saphyr's location; unknown is line 0).
    pub at: serde_saphyr::Location,
    /// What is wrong.
    pub problem: ConfigProblem,
}

impl Located {
    /// The problem as a person reads it, in `file`.
    pub(crate) fn into_error(self, file: &std::path::Path) -> ConfigError {
        ConfigError {
            place: crate::config::place(file, &self.at),
            message: self.problem.to_string(),
        }
    }
}

/// Whose quotas or ceiling a problem is in: a `tenants:` entry's, or a
/// `kubernetes.namespace_templates` entry's (named by its key path).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Owner {
    /// The tenant of this id.
    Tenant(String),
    /// The namespace template of this name.
    Template(String),
}

impl Owner {
    /// What goes before the key: a template's key path.
    fn path(&self) -> String {
        match self {
            Self::Tenant(_) => String::new(),
            Self::Template(name) => format!("kubernetes.namespace_templates.{name}."),
        }
    }

    /// What goes after the key: the tenant it is about.
    fn who(&self) -> String {
        match self {
            Self::Tenant(id) => format!("tenant {id:?}: "),
            Self::Template(_) => String::new(),
        }
    }
}

/// The first names of `names`, and how many more there are: an agent
/// with hundreds of tenants (one per templated namespace) does not list
/// them all in one message.
fn some_of(names: &[String]) -> String {
    const SHOWN: usize = 16;
    match names.len() {
        0 => "none".to_string(),
        n if n <= SHOWN => names.join(", "),
        n => format!("{}, and {} more", names[..SHOWN].join(", "), n - SHOWN),
    }
}

/// The rule a name follows, for messages.
const NAME_RULE: &str = "must be 1-128 letters, digits, `-`, `_` or `.`";

/// One refusal rule broken (or, for [`ConfigProblem::Ungranted`], a warning).
#[derive(Debug, thiserror::Error)]
pub enum ConfigProblem {
    /// `api:` is not a socket address.
    #[error("api: {0:?} is not an address such as 127.0.0.1:9464")]
    Api(String),
    /// An `api:` limit out of range.
    #[error("{0}")]
    ApiLimit(crate::config::ApiLimitError),
    /// A `sandbox:` bound out of range; the message names the key.
    #[error("{0}")]
    SandboxLimit(sonde_sandbox::host::bounds::LimitError),
    /// `health_timeout:` under a second.
    #[error("health_timeout: must be at least 1s")]
    HealthTimeoutTooShort,
    /// A `trust:` key file that cannot be used.
    #[error("trust: {0}")]
    TrustKey(sonde_oci::signing::SignatureError),
    /// `require_signed: true` with no key to check against.
    #[error("require_signed: no `trust` keys are listed, so no plugin file could be accepted")]
    RequireSignedWithoutTrust,

    /// A tenant id that is not a name.
    #[error("id: {0:?} {NAME_RULE}")]
    TenantIdInvalid(String),
    /// A tenant named `default`.
    #[error("id: \"default\" is the operator's tenant (targets without `tenant:`); choose another id")]
    TenantIdDefault,
    /// Two tenants with one id.
    #[error("id: tenant {id:?} is already defined at {first}")]
    TenantIdDuplicate {
        /// The id.
        id: String,
        /// Where it was first defined.
        first: Place,
    },
    /// A token that cannot be read.
    #[error("{who}: {error}")]
    Token {
        /// `tenant "acme"` or `operator token`.
        who: String,
        /// Why.
        error: TokenError,
    },
    /// Two principals with one token.
    #[error("token: tenant {tenant:?} has the same token as {other}; each needs its own")]
    TokenShared {
        /// The tenant.
        tenant: String,
        /// `the operator` or `tenant "x"`.
        other: String,
    },
    /// A quota that must be at least 1.
    #[error("{}quotas.{key}: {}{rule}", owner.path(), owner.who())]
    Quota {
        /// `max_concurrent_runs`, `timeout`, `fuel` or `memory`.
        key: &'static str,
        /// The tenant or template.
        owner: Owner,
        /// What the value must be.
        rule: &'static str,
    },
    /// A `ceiling.net` pattern naming `$(NODE_IP)` on an agent that does
    /// not know its node's address, or knows one that is not an address.
    #[error("{}ceiling.net: {}{pattern:?}: {}", owner.path(), owner.who(), node_ip_problem(found.as_deref()))]
    CeilingNodeIp {
        /// The tenant or template.
        owner: Owner,
        /// The pattern as written.
        pattern: String,
        /// The address the agent has (`kubernetes.node_ip`, else
        /// `$NODE_IP`), when it has one.
        found: Option<String>,
    },
    /// A `ceiling.net` pattern that does not parse.
    #[error("{}ceiling.net: {}{error}", owner.path(), owner.who())]
    CeilingNet {
        /// The tenant or template.
        owner: Owner,
        /// Why.
        error: GrantError,
    },
    /// A `ceiling.registries` pattern that does not parse.
    #[error("{}ceiling.registries: {}{error}", owner.path(), owner.who())]
    CeilingRegistry {
        /// The tenant or template.
        owner: Owner,
        /// Why.
        error: sonde_oci::OciError,
    },
    /// A `ceiling.signers` name that is no `trust` key's signer.
    #[error("{}ceiling.signers: {}{name:?} is not a trusted signer (trust: {})", owner.path(), owner.who(), if known.is_empty() { "none".to_string() } else { some_of(known) })]
    CeilingSigner {
        /// The tenant or template.
        owner: Owner,
        /// The name written.
        name: String,
        /// The signers `trust` lists.
        known: Vec<String>,
    },
    /// A `secrets:` key that is no secret name.
    #[error(
        "secrets: {who}{name:?} is not a secret name (1 to 63 of a-z, 0-9, `-`, `_` and `.`, starting with a letter or digit)"
    )]
    SecretName {
        /// `tenant "acme": `, or empty for the operator's.
        who: String,
        /// The name written.
        name: String,
    },
    /// A secret with both or neither of `file` and `env`.
    #[error("secrets.{name}: {who}give exactly one of `file` and `env`")]
    SecretSourceCount {
        /// `tenant "acme": `, or empty for the operator's.
        who: String,
        /// The secret's name.
        name: String,
    },
    /// A secret whose value cannot be had now; the message names its
    /// file or variable, never a value.
    #[error("secrets.{name}: {who}{error}")]
    SecretValue {
        /// `tenant "acme": `, or empty for the operator's.
        who: String,
        /// The secret's name.
        name: String,
        /// Why (`file /x: ...`, `env X: not set in sonde's environment`).
        error: String,
    },
    /// `grants.secrets` names a secret the probe's tenant does not own.
    #[error("grants.secrets: {0}")]
    SecretNotOwned(String),
    /// Another grant of the probe would give a secret away (`exec` beside
    /// secrets, a `files` grant showing a secret's file); the text names
    /// the key.
    #[error("{0}")]
    SecretExposed(String),
    /// `trust_keyless:`, reserved.
    #[error(
        "trust_keyless: keyless signatures (a Fulcio certificate and a Rekor entry) are reserved for a later release; trust the vendor's public key in `trust:` (docs/oci.md, \"Keyless signatures\")"
    )]
    KeylessReserved,
    /// Two `trust` keys with one signer name.
    #[error(
        "trust: signer {signer:?} is already the name of key {first}; rename one file (a PEM key's signer is its file name without .pub or .pem)"
    )]
    TrustSignerDuplicate {
        /// The name.
        signer: String,
        /// The id of the key listed first.
        first: String,
    },
    /// A `kubernetes.namespace_templates` name that is not a label value,
    /// so no namespace could name it.
    #[error(
        "kubernetes.namespace_templates: {0:?} is not a label value (1-63 letters, digits, `-`, `_` or `.`, starting and ending with a letter or digit), so no namespace could name it in its sonde.dev/tenant-template label"
    )]
    TemplateName(String),
    /// `kubernetes.max_templated_namespaces: 0`.
    #[error("kubernetes.max_templated_namespaces: must be at least 1")]
    TemplateCapZero,
    /// `otlp.protocol:` other than `grpc` and `http/protobuf`.
    #[error("otlp.protocol: {0:?} is not `grpc` or `http/protobuf`")]
    OtlpProtocol(String),
    /// `otlp.endpoint:` that is not a collector's URL.
    #[error("otlp.endpoint: {endpoint:?}: {why}")]
    OtlpEndpoint {
        /// As written.
        endpoint: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// An `otlp.headers` entry that cannot be sent.
    #[error("otlp.headers.{name}: {source}")]
    OtlpHeader {
        /// The header's name as written.
        name: String,
        /// What is wrong: its name, its value, or a handle in it.
        source: OtlpHeaderError,
    },
    /// An `otlp` TLS file that cannot be read.
    #[error("otlp.{key}: {}: {source}", path.display())]
    OtlpFile {
        /// `ca_file`, `cert_file` or `key_file`.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// Why it could not be read.
        source: std::io::Error,
    },
    /// `otlp.traces.success_ratio` outside 0 to 1.
    #[error("otlp.traces.success_ratio: {0} is not a share from 0 to 1")]
    OtlpSuccessRatio(f64),
    /// `otlp.cert_file` without `key_file`, or the other way round.
    #[error("otlp: cert_file and key_file go together: a client certificate needs its key")]
    OtlpIdentityHalf,
    /// `otlp.interval` under a second.
    #[error("otlp.interval: {} is below the 1s minimum", humantime::format_duration(*.0))]
    OtlpInterval(Duration),
    /// `otlp.timeout` zero or past the interval.
    #[error(
        "otlp.timeout: {} must be more than zero and at most the interval ({})",
        humantime::format_duration(*timeout),
        humantime::format_duration(*interval)
    )]
    OtlpTimeout {
        /// As given.
        timeout: Duration,
        /// The export interval in force.
        interval: Duration,
    },
    /// A tenant's `otlp.endpoint` outside its `ceiling.net`: the export
    /// connects on the tenant's behalf, under the tenant's grants.
    #[error("otlp.endpoint: tenant {tenant:?}: {endpoint:?} is outside the tenant's ceiling.net ({source})")]
    OtlpOutsideCeiling {
        /// The tenant.
        tenant: TenantId,
        /// The endpoint as written.
        endpoint: String,
        /// The grant check's refusal.
        source: sonde_policy::grants::Denied,
    },
    /// `oci.timeout: 0s` or `oci.idle_timeout: 0s`.
    #[error("oci.{key}: must be more than zero")]
    OciTimeoutZero {
        /// `timeout` or `idle_timeout`.
        key: &'static str,
    },
    /// A probe of a tenant names an `oci://` plugin outside its
    /// `ceiling.registries`.
    #[error("plugin: tenant {tenant:?}: probe {probe:?}: {reference} is outside the tenant's registries ceiling")]
    RegistryOutsideCeiling {
        /// The tenant.
        tenant: TenantId,
        /// The probe.
        probe: String,
        /// The reference as written.
        reference: String,
    },
    /// A `ceiling.exec` or `ceiling.files` path that is not absolute.
    #[error("{}{key}: {}{} must be an absolute path", owner.path(), owner.who(), path.display())]
    CeilingPath {
        /// `ceiling.exec` or `ceiling.files`.
        key: &'static str,
        /// The tenant or template.
        owner: Owner,
        /// The path.
        path: PathBuf,
    },

    /// A target or probe name that is not a name.
    #[error("name: {0:?} {NAME_RULE}")]
    NameInvalid(String),
    /// Two targets with one name.
    #[error("name: target {name:?} is already defined at {first}")]
    TargetDuplicate {
        /// The name.
        name: String,
        /// Where it was first defined.
        first: Place,
    },
    /// Two probes with one name.
    #[error(
        "name: probe {name:?}{} is already defined at {first}",
        if *.defaulted { " (the default `<target>-<kind>`; give each a `name`)" } else { "" }
    )]
    ProbeDuplicate {
        /// The name.
        name: String,
        /// Whether it is the default `<target>-<kind>`.
        defaulted: bool,
        /// Where it was first defined.
        first: Place,
    },
    /// An `address:` (or a probe's `target:`) that does not parse.
    #[error("{key}: {error}")]
    Address {
        /// `address` or `target`.
        key: &'static str,
        /// Why.
        error: GrantError,
    },
    /// `tenant:` names no tenant.
    #[error("tenant: no tenant {id:?} is defined (tenants: {})", some_of(known))]
    UnknownTenant {
        /// The id written.
        id: String,
        /// The tenants there are.
        known: Vec<String>,
    },
    /// `on_failure.command: []`.
    #[error("on_failure.command: empty; give the program's absolute path first")]
    ActionEmpty,
    /// `on_failure.command` whose program is not an absolute, existing path.
    #[error("on_failure.command: {0:?} must be the absolute path of an existing program")]
    ActionProgram(String),

    /// A second startup probe on one target.
    #[error("kind: target {0:?} already has a startup probe; it may have one")]
    SecondStartup(String),
    /// More probes than the tenant's `max_probes`.
    #[error("quotas.max_probes: tenant {tenant:?}: probe {probe:?} is over the tenant's quota of {max} probes")]
    OverQuota {
        /// The tenant.
        tenant: TenantId,
        /// The first probe over it.
        probe: String,
        /// The quota.
        max: usize,
    },
    /// `success_threshold: 0`.
    #[error("success_threshold: must be at least 1")]
    SuccessThresholdZero,
    /// `success_threshold` other than 1 on a liveness or startup probe.
    #[error("success_threshold: must be 1 for a {kind} probe (it is {value})")]
    SuccessThresholdNotOne {
        /// The probe's kind.
        kind: Kind,
        /// What was written.
        value: u32,
    },
    /// `failure_threshold: 0`.
    #[error("failure_threshold: must be at least 1")]
    FailureThresholdZero,
    /// `period:` under the minimum.
    #[error("period: {} is below the 100ms minimum", humantime::format_duration(*.0))]
    PeriodTooShort(Duration),
    /// `timeout: 0s`.
    #[error("timeout: must be more than zero")]
    TimeoutZero,
    /// `limits.memory:` over the engine's ceiling.
    #[error("limits.memory: {} is more than the 1GiB ceiling", bytesize::ByteSize(*.0))]
    MemoryOverMax(u64),
    /// A `grants.net` pattern that does not parse.
    #[error("grants.net: {0}")]
    GrantNet(GrantError),
    /// A `grants.ip_protocol` that is not `ip4` or `ip6`.
    #[error("grants.ip_protocol: {0}")]
    GrantIpProtocol(sonde_policy::grants::IpVersionError),
    /// A `grants.exec` path that is not an existing program.
    #[error("grants.exec: {} must be the absolute path of an existing program", .0.display())]
    GrantExec(PathBuf),
    /// A `grants.files` path that is not an existing directory.
    #[error("grants.files: {} must be the absolute path of a directory", .0.display())]
    GrantFiles(PathBuf),
    /// A `grants.files` directory that is, or holds, a pseudo-filesystem
    /// (`/proc`, `/sys`, `/dev`, …), through which a plugin could read the
    /// agent itself.
    #[error(
        "grants.files: {} {} (a pseudo-filesystem exposes the agent's own process and the kernel); grant a directory of ordinary files",
        path.display(),
        if mount == path { format!("is a {fstype} filesystem") } else { format!("holds {}, a {fstype} filesystem", mount.display()) }
    )]
    GrantFilesPseudo {
        /// The directory granted.
        path: PathBuf,
        /// The pseudo-filesystem's mount point: the directory, or one in it.
        mount: PathBuf,
        /// Its type (`proc`, `sysfs`, …).
        fstype: String,
    },
    /// A grant, target or limit over the tenant's ceiling or quotas.
    #[error("{key}: {error}")]
    Ceiling {
        /// The key at fault (`grants.net`, `target`, `timeout`, …).
        key: &'static str,
        /// Which and why.
        error: CeilingError,
    },
    /// A group that is not a name.
    #[error("groups: {0:?} {NAME_RULE}")]
    Group(String),
    /// A label that cannot go on the probe's series.
    #[error("labels: {key:?} {why}")]
    Label {
        /// The label's name.
        key: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The plugin cannot be had.
    #[error("plugin: {0}")]
    Plugin(super::ResolveError),
    /// The plugin's config does not fit its schema.
    #[error("config{}: {message} (plugin {plugin})", if at.is_empty() { String::new() } else { format!(" at {at}") })]
    Schema {
        /// The JSON pointer of the value at fault (empty: the whole config).
        at: String,
        /// What the validator said.
        message: String,
        /// The plugin as written.
        plugin: String,
    },

    /// A warning, not an error: the plugin says it needs something its
    /// grants do not give.
    #[error("probe {probe:?}: plugin {plugin} asks for {missing}, which its grants do not cover")]
    Ungranted {
        /// The probe.
        probe: String,
        /// The plugin as written.
        plugin: String,
        /// `net db:5432 (why)`.
        missing: String,
    },
}

/// Why `$(NODE_IP)` cannot be filled in, with what `found` holds.
fn node_ip_problem(found: Option<&str>) -> String {
    match found {
        None => "$(NODE_IP) is the node's address, which the agent does not know: set kubernetes.node_ip, or NODE_IP (the shipped DaemonSet sets it from status.hostIP)".to_string(),
        Some(ip) => format!("$(NODE_IP) is the node's address, and {ip:?} (kubernetes.node_ip, else NODE_IP) is not an IP address"),
    }
}

/// Why an `otlp.headers` entry cannot be sent.
#[derive(Debug, thiserror::Error)]
pub enum OtlpHeaderError {
    /// Its name is not a header name.
    #[error("not a header name")]
    Name,
    /// Its value holds bytes a header cannot.
    #[error("not a header value")]
    Value,
    /// A malformed handle in its value.
    #[error(transparent)]
    Handle(#[from] sonde_policy::secrets::template::TemplateError),
    /// A handle names no secret of the export's owner.
    #[error("$(secret:{name}) is not one of {owner} `secrets:`")]
    UnknownSecret {
        /// The secret named.
        name: String,
        /// Whose secrets were looked in: `the operator's`, `tenant "acme"'s`.
        owner: String,
    },
}
