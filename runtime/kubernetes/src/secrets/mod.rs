//! The Secrets of SondeChecks' `secretRefs`: which this agent reads, what
//! each read found, and the [`SecretCell`] each reference becomes.
//!
//! The agent reads a Secret with one `GET` of that Secret (`read`), never
//! a list or a watch (a watch needs `list` on every Secret its RBAC would
//! cover); it reads only the Secrets of checks that gate a Pod of its own
//! node, at most [`MAX_PER_NAMESPACE`] per namespace and [`MAX_SECRETS`]
//! in all, a present one again every [`REREAD_EVERY`] and whenever its
//! check changes, a missing or unreadable one sooner (from [`FIRST_RETRY`],
//! doubling up to [`REREAD_EVERY`]). So a Secret created, changed or
//! deleted is seen without a restart.
//!
//! One cell per (namespace, tenant, reference name, Secret, key): every
//! probe of the check holds it, and a new value reaches them at their next
//! run ([`SecretCell::set`]). Where a Secret or key is missing, forbidden
//! or unusable, the cell says so (naming the Secret and key, never a
//! value), and the check's gates are held `Unknown` (`Held::Problem`).
//!
//! The book is a state machine, without I/O: the controller registers what
//! its Pods' checks want (`SecretBook::want`), starts the reads it hands
//! out (`SecretBook::due`) and records what they found
//! (`SecretBook::record`).

pub(crate) mod read;

use crate::crd::{MAX_SECRET_REFS, SecretRef};
pub(crate) use read::{Outcome, read};
use sonde_policy::secrets::{SecretCell, SecretError, SecretValue, valid_name};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// How often a Secret that was read is read again.
pub const REREAD_EVERY: Duration = Duration::from_secs(30);
/// The first retry of a Secret that is missing or could not be read; each
/// next one waits twice as long, up to [`REREAD_EVERY`].
pub const FIRST_RETRY: Duration = Duration::from_secs(1);
/// The most Secrets the agent reads in one namespace.
pub const MAX_PER_NAMESPACE: usize = 32;
/// The most Secrets the agent reads in all.
pub const MAX_SECRETS: usize = 256;
/// The most reads under way at once.
pub const MAX_READS_IN_FLIGHT: usize = 4;
/// The ClusterRole a namespace's owner binds to let the agent read its
/// Secrets.
pub const READER_ROLE: &str = "sonde-secret-reader";

/// A Secret by namespace and name.
pub(crate) type SecretKey = (String, String);

/// One reference's cell: whose, which name, from which Secret and key.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct CellKey {
    pub(crate) namespace: String,
    /// The tenant of the namespace (the cell's owner).
    pub(crate) owner: String,
    /// The reference's name (the handle's).
    pub(crate) name: String,
    pub(crate) secret: String,
    pub(crate) key: String,
}

impl CellKey {
    /// The key of `r`, a reference of a check of `namespace` (tenant `owner`).
    pub(crate) fn of(namespace: &str, owner: &str, r: &SecretRef) -> Self {
        Self {
            namespace: namespace.into(),
            owner: owner.into(),
            name: r.name.clone(),
            secret: r.secret_name.clone(),
            key: r.key.clone(),
        }
    }

    fn secret_key(&self) -> SecretKey {
        (self.namespace.clone(), self.secret.clone())
    }
}

/// Why a reference has no usable value: the Event's reason and a message
/// naming the reference, Secret and key (never a value).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Problem {
    /// `SecretMissing`, `SecretForbidden`, `SecretInvalid`,
    /// `SecretUnreadable` or `SecretLimit`.
    pub(crate) reason: &'static str,
    pub(crate) message: String,
}

/// A reference as a gate sees it.
#[derive(Clone, Debug)]
pub(crate) enum Held {
    /// Its value is there: the probe holds the cell.
    Ready(Arc<SecretCell>),
    /// Not read yet: the gate waits, and nothing is written.
    Pending,
    /// No usable value: the gate is `Unknown`, with an Event on the check.
    Problem(Problem),
}

/// What a reference's cell holds now.
#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    Pending,
    Ready,
    Problem(Problem),
}

struct Cell {
    cell: Arc<SecretCell>,
    state: State,
}

/// A Secret the agent reads.
struct Entry {
    /// The keys its references ask for.
    keys: BTreeSet<String>,
    /// What the last read found (`None`: not read yet).
    outcome: Option<Outcome>,
    /// When it is next read.
    next: Instant,
    /// Reads in a row that did not find it usable.
    failures: u32,
    in_flight: bool,
}

/// The Secrets the agent reads and the cells of the references to them.
#[derive(Default)]
pub(crate) struct SecretBook {
    secrets: BTreeMap<SecretKey, Entry>,
    cells: BTreeMap<CellKey, Cell>,
}

impl SecretBook {
    /// The reference `key` as a gate sees it, registering it (and its
    /// Secret, due now) when it is new. A Secret past the caps is not read.
    pub(crate) fn want(&mut self, key: &CellKey, now: Instant) -> Held {
        let secret = key.secret_key();
        if !self.secrets.contains_key(&secret) {
            let in_namespace = self.secrets.keys().filter(|(ns, _)| *ns == key.namespace).count();
            if in_namespace >= MAX_PER_NAMESPACE || self.secrets.len() >= MAX_SECRETS {
                return Held::Problem(Problem {
                    reason: "SecretLimit",
                    message: format!(
                        "{}: not read: this agent reads at most {MAX_PER_NAMESPACE} Secrets per namespace and {MAX_SECRETS} in all",
                        about(key)
                    ),
                });
            }
            self.secrets.insert(
                secret.clone(),
                Entry {
                    keys: BTreeSet::new(),
                    outcome: None,
                    next: now,
                    failures: 0,
                    in_flight: false,
                },
            );
        }
        let entry = self.secrets.get_mut(&secret).expect("inserted above");
        if entry.keys.insert(key.key.clone()) && entry.outcome.is_some() {
            // A key the last read did not keep: read it again now.
            entry.next = now;
        }
        let cell = self.cells.entry(key.clone()).or_insert_with(|| {
            let source = format!("Secret {}/{} key {}", key.namespace, key.secret, key.key);
            let pending = Err(SecretError::Unavailable(format!("{}: not read yet", about(key))));
            Cell {
                cell: Arc::new(SecretCell::given(
                    &key.name,
                    key.owner.as_str().into(),
                    &source,
                    pending,
                )),
                state: State::Pending,
            }
        });
        if cell.state == State::Pending
            && let Some(outcome) = &entry.outcome
        {
            let (state, value) = judge(key, outcome);
            cell.cell.set(value);
            cell.state = state;
        }
        match &cell.state {
            State::Pending => Held::Pending,
            State::Ready => Held::Ready(cell.cell.clone()),
            State::Problem(p) => Held::Problem(p.clone()),
        }
    }

    /// Reads Secret `secret` at once (its check changed), unless a read is
    /// under way.
    pub(crate) fn hurry(&mut self, secret: &SecretKey, now: Instant) {
        if let Some(e) = self.secrets.get_mut(secret) {
            e.next = e.next.min(now);
        }
    }

    /// The reads to start now (each Secret with the keys to keep), marked
    /// under way; at most [`MAX_READS_IN_FLIGHT`] at once.
    pub(crate) fn due(&mut self, now: Instant) -> Vec<(SecretKey, Vec<String>)> {
        let mut room = MAX_READS_IN_FLIGHT.saturating_sub(self.secrets.values().filter(|e| e.in_flight).count());
        let mut out = Vec::new();
        for (secret, e) in &mut self.secrets {
            if room == 0 {
                break;
            }
            if !e.in_flight && e.next <= now {
                e.in_flight = true;
                room -= 1;
                out.push((secret.clone(), e.keys.iter().cloned().collect()));
            }
        }
        out
    }

    /// When the next read is due (`None`: nothing to read, or no room for
    /// another read until one under way ends).
    pub(crate) fn next_due(&self) -> Option<Instant> {
        let in_flight = self.secrets.values().filter(|e| e.in_flight).count();
        if in_flight >= MAX_READS_IN_FLIGHT {
            return None;
        }
        self.secrets.values().filter(|e| !e.in_flight).map(|e| e.next).min()
    }

    /// Records what the read of `secret` found: every cell of it takes its
    /// new value. Returns whether any reference's state changed (its
    /// check's gates are to be reconciled).
    pub(crate) fn record(&mut self, secret: &SecretKey, outcome: Outcome, now: Instant) -> bool {
        let Some(e) = self.secrets.get_mut(secret) else {
            return false;
        };
        e.in_flight = false;
        // An answer that says nothing keeps what an earlier read found.
        let keep = matches!(outcome, Outcome::Failed(_)) && e.outcome.is_some();
        let usable = matches!(outcome, Outcome::Read { .. });
        if usable {
            e.failures = 0;
            e.next = now + REREAD_EVERY;
        } else {
            e.failures = e.failures.saturating_add(1);
            e.next = now + retry_after(e.failures);
        }
        if !keep {
            e.outcome = Some(outcome);
        }
        let Some(outcome) = &e.outcome else { return false };
        let mut changed = false;
        for (key, c) in self.cells.iter_mut().filter(|(k, _)| k.secret_key() == *secret) {
            let (state, value) = judge(key, outcome);
            c.cell.set(value);
            changed |= c.state != state;
            c.state = state;
        }
        changed
    }

    /// Keeps only the references in `wanted` (those of checks that gate a
    /// Pod of this node) and the Secrets they name; a reference dropped
    /// here starts over as pending when it is wanted again.
    pub(crate) fn retain(&mut self, wanted: &BTreeSet<CellKey>) {
        self.cells.retain(|k, _| wanted.contains(k));
        let named: BTreeSet<SecretKey> = self.cells.keys().map(CellKey::secret_key).collect();
        self.secrets.retain(|k, _| named.contains(k));
        for (secret, e) in &mut self.secrets {
            e.keys = self
                .cells
                .keys()
                .filter(|k| k.secret_key() == *secret)
                .map(|k| k.key.clone())
                .collect();
        }
    }

    /// How many Secrets it reads.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.secrets.len()
    }
}

/// How long to wait before reading again after `failures` reads in a row
/// that did not find the Secret usable.
fn retry_after(failures: u32) -> Duration {
    let doubled = FIRST_RETRY.saturating_mul(1u32 << failures.saturating_sub(1).min(16));
    doubled.min(REREAD_EVERY)
}

/// `secretRef "NAME" (Secret "S" in namespace "NS", key "K")`.
fn about(key: &CellKey) -> String {
    format!(
        "secretRef {:?} (Secret {:?} in namespace {:?}, key {:?})",
        key.name, key.secret, key.namespace, key.key
    )
}

/// What `outcome` means for the reference `key`: its state, and the value
/// its cell takes.
fn judge(key: &CellKey, outcome: &Outcome) -> (State, Result<SecretValue, SecretError>) {
    let problem = |reason: &'static str, message: String| {
        let value = Err(SecretError::Unavailable(message.clone()));
        (State::Problem(Problem { reason, message }), value)
    };
    let about = about(key);
    match outcome {
        Outcome::Read { values, keys } => match values.get(&key.key) {
            Some(Ok(v)) => (State::Ready, Ok(v.clone())),
            Some(Err(e)) => problem("SecretInvalid", format!("{about}: {e}")),
            // There, but not asked for by that read: the next one keeps it.
            None if keys.contains(&key.key) => (
                State::Pending,
                Err(SecretError::Unavailable(format!("{about}: not read yet"))),
            ),
            None => problem(
                "SecretMissing",
                format!(
                    "{about}: the Secret has no such key (its keys: {})",
                    if keys.is_empty() {
                        "none".into()
                    } else {
                        keys.join(", ")
                    }
                ),
            ),
        },
        Outcome::NotFound => problem("SecretMissing", format!("{about}: the Secret does not exist")),
        Outcome::Forbidden => problem(
            "SecretForbidden",
            format!(
                "{about}: the agent may not read it (403): the namespace's owner lets it by binding the ClusterRole {READER_ROLE} to the agent's ServiceAccount with a RoleBinding in namespace {:?} (deploy/kubernetes/examples/secret-reader-rolebinding.yaml)",
                key.namespace
            ),
        ),
        Outcome::Failed(why) => problem("SecretUnreadable", format!("{about}: cannot be read: {why}")),
    }
}

/// Why a check's `secretRefs` cannot be used as written (an API server
/// with the CRD's schema refuses each first).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RefsError {
    /// More references than a check may hold.
    #[error("secretRefs: {0} entries; at most {MAX_SECRET_REFS}")]
    TooMany(usize),
    /// A reference's `name` is not a secret name.
    #[error(
        "secretRefs: {0:?} is not a secret name (1 to 63 of a-z, 0-9, '-', '_' and '.', starting with a letter or digit)"
    )]
    Name(String),
    /// Two references share a `name`.
    #[error("secretRefs: {0:?} is listed twice")]
    Twice(String),
    /// A `secretName` that is not a Secret's name.
    #[error("secretRefs: {name:?}: secretName {secret:?} is not a Secret's name")]
    SecretName {
        /// The reference's `name`.
        name: String,
        /// Its `secretName`.
        secret: String,
    },
    /// A `key` that is not a Secret's key.
    #[error("secretRefs: {name:?}: key {key:?} is not a Secret's key")]
    Key {
        /// The reference's `name`.
        name: String,
        /// Its `key`.
        key: String,
    },
}

/// Whether a check's `secretRefs` can be used as written.
pub(crate) fn check_refs(refs: &[SecretRef]) -> Result<(), RefsError> {
    if refs.len() > MAX_SECRET_REFS {
        return Err(RefsError::TooMany(refs.len()));
    }
    for (i, r) in refs.iter().enumerate() {
        if !valid_name(&r.name) {
            return Err(RefsError::Name(r.name.clone()));
        }
        if refs[..i].iter().any(|o| o.name == r.name) {
            return Err(RefsError::Twice(r.name.clone()));
        }
        if !dns_subdomain(&r.secret_name) {
            return Err(RefsError::SecretName {
                name: r.name.clone(),
                secret: r.secret_name.clone(),
            });
        }
        let key_ok = (1..=253).contains(&r.key.len())
            && r.key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !key_ok {
            return Err(RefsError::Key {
                name: r.name.clone(),
                key: r.key.clone(),
            });
        }
    }
    Ok(())
}

/// Whether `name` is a DNS subdomain (RFC 1123), as Kubernetes names a
/// Secret.
fn dns_subdomain(name: &str) -> bool {
    (1..=253).contains(&name.len())
        && name.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

/// Cells for a dry run of a check's probe (the status writer's): the
/// references' names, owned by `owner`, with no value.
pub(crate) fn stand_ins(owner: &str, refs: &[SecretRef]) -> Vec<Arc<SecretCell>> {
    refs.iter()
        .map(|r| {
            let none = Err(SecretError::Unavailable("a dry run reads no Secret".into()));
            Arc::new(SecretCell::given(&r.name, owner.into(), "a dry run", none))
        })
        .collect()
}

#[cfg(test)]
mod tests;
