//! A change of the probe set: what is asked ([`Change`]), what it was
//! checked into ([`Prepared`]) and what a commit hands the scheduler
//! ([`Delta`]).

use super::*;

/// A change to a catalog: targets (each with its probes) to remove, then
/// targets to add. A target added under the name of one removed replaces
/// it; under the name of one that stays, it is refused as a duplicate.
#[derive(Debug, Default)]
pub struct Change {
    /// Names of targets to remove, with all their probes.
    pub remove: Vec<Arc<str>>,
    /// Targets to add, as parsed from a file or built from a stored probe
    /// (`source` names where they came from in errors).
    pub add: Vec<config::Target>,
    /// Secrets the added probes' `grants.secrets` may name beside their
    /// tenant's own `secrets:`, each usable by the probes of its owner's
    /// tenant only, and looked up first: the Kubernetes agent's cells of a
    /// SondeCheck's `secretRefs`, read from Secrets of the check's
    /// namespace. Whoever builds the change vouches for them.
    pub secrets: Vec<Arc<sonde_policy::secrets::SecretCell>>,
}

impl Change {
    /// Adds `targets`.
    pub fn add(targets: Vec<config::Target>) -> Self {
        Self {
            add: targets,
            ..Self::default()
        }
    }

    /// Removes the targets named `names`.
    pub fn remove(names: impl IntoIterator<Item = impl Into<Arc<str>>>) -> Self {
        Self {
            remove: names.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }
}

/// A [`Change`] checked against a catalog, ready to [`Catalog::commit`].
#[derive(Debug, Default)]
#[must_use = "a prepared change does nothing until it is committed"]
pub struct Prepared {
    /// The catalog generation it was checked against.
    pub(super) generation: u64,
    pub(super) remove: Vec<Arc<str>>,
    pub(super) targets: Vec<TargetEntry>,
    pub(super) probes: Vec<Arc<ProbeSpec>>,
    /// What deserves attention but does not refuse the change.
    pub warnings: Vec<ConfigError>,
    /// Probes whose `oci://` plugin its registry could not give now: left
    /// out of a whole load, refusing an incremental change.
    pub(super) unavailable: Vec<Unavailable>,
    /// Probes whose `oci://` plugin is being pulled in the background (in
    /// the agent): not in the change; added when the pull lands.
    pub(super) waiting: Vec<Waiting>,
    /// What the change's `oci://` plugins cost to resolve, by tenant.
    pub(super) pulls: Vec<Pull>,
}

/// A probe left out for now because its `oci://` plugin is being pulled in
/// the background; it is added when the pull lands.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Waiting {
    /// The probe.
    pub probe: Arc<str>,
    /// Its target.
    pub target: Arc<str>,
    /// The tenant that owns it.
    #[serde(serialize_with = "as_str")]
    pub tenant: TenantId,
    /// Its kind.
    pub kind: Kind,
    /// The plugin, as written.
    pub plugin: String,
    /// When the pull started.
    #[serde(serialize_with = "rfc3339")]
    pub since: std::time::SystemTime,
}

fn as_str<S: serde::Serializer>(t: &TenantId, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(t)
}

fn rfc3339<S: serde::Serializer>(t: &std::time::SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&humantime::format_rfc3339_seconds(*t))
}

/// One `oci://` plugin resolved for a change, and what it cost: charged to
/// the tenant whose probe named it first (`sonde_tenant_oci_pull_*`).
#[derive(Clone, Debug)]
pub struct Pull {
    /// The tenant charged.
    pub tenant: TenantId,
    /// The reference as written.
    pub reference: String,
    /// Bytes from the registry and time spent.
    pub cost: PullCost,
}

/// A probe left out of a load because its `oci://` plugin could not be
/// pulled and was not cached: the rest of the config runs without it.
#[derive(Clone, Debug)]
pub struct Unavailable {
    /// The probe.
    pub probe: Arc<str>,
    /// The tenant that owns it.
    pub tenant: TenantId,
    /// The `oci://` plugin, as written, whose pull failed (none when the
    /// probe is left out for another reason).
    pub plugin: Option<String>,
    /// Where and why, as a config error would say it.
    pub error: ConfigError,
}

impl Prepared {
    /// The probes it adds or replaces.
    pub fn probes(&self) -> impl Iterator<Item = &Arc<ProbeSpec>> {
        self.probes.iter()
    }

    /// What resolving its `oci://` plugins cost, by tenant (whether or not
    /// it is then committed: the pulls happened).
    pub fn pulls(&self) -> &[Pull] {
        &self.pulls
    }

    /// The probes it leaves out until their plugin's pull lands.
    pub fn waiting(&self) -> &[Waiting] {
        &self.waiting
    }
}

/// One target as the scheduler needs it: its spec and its probes' names.
#[derive(Clone, Debug)]
pub struct TargetUpdate {
    /// The target.
    pub spec: Arc<TargetSpec>,
    /// The names of all its probes.
    pub probes: Vec<Arc<str>>,
    /// Whether one of them is a startup probe.
    pub has_startup: bool,
}

/// What a committed change did, for the scheduler: the targets and probes
/// added or replaced, and those removed. A `full` delta is a whole
/// catalog: anything it does not name is gone.
#[derive(Clone, Debug, Default)]
pub struct Delta {
    /// Whether this is the whole catalog.
    pub full: bool,
    /// Targets added or replaced.
    pub targets: Vec<TargetUpdate>,
    /// Probes added or replaced.
    pub probes: Vec<Arc<ProbeSpec>>,
    /// Targets removed.
    pub removed_targets: Vec<Arc<str>>,
    /// Probes removed.
    pub removed_probes: Vec<Arc<str>>,
}

impl From<&Catalog> for Delta {
    fn from(r: &Catalog) -> Self {
        r.delta()
    }
}

impl From<Catalog> for Delta {
    fn from(r: Catalog) -> Self {
        r.delta()
    }
}
