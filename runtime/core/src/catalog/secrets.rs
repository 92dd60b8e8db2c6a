//! The `secrets:` blocks, the operator's and each tenant's: every secret
//! becomes a [`SecretCell`] of its owner, and a probe's `grants.secrets`
//! the cells of its own tenant it names ([`grant`]).
//!
//! No value is ever part of a problem's text: a problem names the secret,
//! its file or its variable.

use super::problem::{ConfigProblem, Located};
use crate::config::{SecretSpec, Spanned};
use crate::tenants::{Tenant, Tenants};
use sonde_policy::secrets::{SecretCell, SecretError, SecretGrants, SecretValue, valid_name};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// The cells of `specs`, owned by `owner` (a tenant's id, or the
/// operator's `default`), files relative to `base`. A secret that cannot be
/// read now is a problem; it is kept, so a later fix of its file reaches
/// probes without a reload, but the config is refused meanwhile.
pub(crate) fn cells(
    base: &Path,
    owner: &str,
    operator: bool,
    specs: &BTreeMap<String, Spanned<SecretSpec>>,
    problems: &mut Vec<Located>,
) -> Vec<Arc<SecretCell>> {
    let who = if operator {
        String::new()
    } else {
        format!("tenant {owner:?}: ")
    };
    let owner: Arc<str> = owner.into();
    let mut out = Vec::new();
    for (name, spec) in specs {
        let mut problem = |problem| {
            problems.push(Located {
                at: spec.referenced,
                problem,
            })
        };
        if !valid_name(name) {
            problem(ConfigProblem::SecretName {
                who: who.clone(),
                name: name.clone(),
            });
            continue;
        }
        let cell = match (&spec.value.file, &spec.value.env) {
            (Some(file), None) => SecretCell::file(name, owner.clone(), &base.join(&file.value)),
            (None, Some(var)) => {
                let var = var.value.trim();
                let value = match crate::auth::take_env(var) {
                    Some(v) => SecretValue::new(v.into_bytes()),
                    None => Err(SecretError::Unavailable("not set in sonde's environment".into())),
                };
                SecretCell::given(name, owner.clone(), &format!("env {var}"), value)
            }
            _ => {
                problem(ConfigProblem::SecretSourceCount {
                    who: who.clone(),
                    name: name.clone(),
                });
                continue;
            }
        };
        if let Err(e) = cell.current() {
            let error = match e {
                SecretError::Read { .. } | SecretError::WorldAccessible { .. } => e.to_string(),
                other => format!("{}: {other}", cell.source()),
            };
            problem(ConfigProblem::SecretValue {
                who: who.clone(),
                name: name.clone(),
                error,
            });
        }
        out.push(Arc::new(cell));
    }
    out
}

/// The secrets a probe may be granted: its tenant's own, and those a
/// change gives ([`crate::catalog::Change::secrets`]) whose owner is that
/// tenant.
pub(crate) struct Owned<'a> {
    /// The probe's tenant.
    pub(crate) tenant: &'a Tenant,
    /// The change's cells (of any owner; only the tenant's count).
    pub(crate) given: &'a [Arc<SecretCell>],
}

impl Owned<'_> {
    /// The cell named `name`: a given one first, then the tenant's.
    fn find(&self, name: &str) -> Option<&Arc<SecretCell>> {
        let id: &str = &self.tenant.id;
        self.given
            .iter()
            .find(|c| c.owner() == id && c.name() == name)
            .or_else(|| self.tenant.secrets.iter().find(|c| c.name() == name))
    }

    /// Every name it may grant, given ones first.
    fn names(&self) -> Vec<&str> {
        let id: &str = &self.tenant.id;
        let mut names: Vec<&str> = self
            .given
            .iter()
            .filter(|c| c.owner() == id)
            .map(|c| c.name())
            .collect();
        for c in &self.tenant.secrets {
            if !names.contains(&c.name()) {
                names.push(c.name());
            }
        }
        names
    }
}

/// The cells `names` (a probe's `grants.secrets`) stand for, each of
/// `owned`'s tenant's own; a name it does not own is a problem that says
/// whether another tenant does (without naming which: a tenant learns
/// nothing of another's secrets).
pub(crate) fn grant(
    owned: &Owned<'_>,
    tenants: &Tenants,
    names: &[Spanned<String>],
    problems: &mut Vec<Located>,
) -> SecretGrants {
    let tenant = owned.tenant;
    let mut cells: Vec<Arc<SecretCell>> = Vec::new();
    for n in names {
        let name = n.value.trim();
        let why = match owned.find(name) {
            Some(cell) if cells.iter().any(|c| Arc::ptr_eq(c, cell)) => Some(format!("{name:?} is listed twice")),
            Some(cell) => {
                cells.push(cell.clone());
                None
            }
            None => {
                let elsewhere = tenants
                    .iter()
                    .any(|t| t.id != tenant.id && t.secrets.iter().any(|c| c.name() == name));
                let own = owned.names();
                Some(format!(
                    "{name:?} is not a secret of tenant {:?}{} (its secrets: {})",
                    tenant.id,
                    if elsewhere {
                        "; a probe may use only its own tenant's secrets"
                    } else {
                        ""
                    },
                    if own.is_empty() {
                        "none".to_string()
                    } else {
                        own.join(", ")
                    }
                ))
            }
        };
        if let Some(why) = why {
            problems.push(Located {
                at: n.referenced,
                problem: ConfigProblem::SecretNotOwned(why),
            });
        }
    }
    SecretGrants::new(cells)
}

/// What a probe's other grants would give away of secrets: a program it
/// may run reads any file the agent can and writes what it likes, past any
/// scrubber, so a probe with secrets runs none; and a `files` grant that
/// shows a secret's file (literally or once links are resolved) hands the
/// plugin its bytes, whoever owns it.
pub(crate) fn check_exposure(
    tenants: &Tenants,
    grants: &sonde_policy::Grants,
    names: &[Spanned<String>],
    files_at: &[Spanned<std::path::PathBuf>],
    problems: &mut Vec<Located>,
) {
    if !grants.secrets.is_empty() && !grants.exec.is_empty() {
        problems.push(Located {
            at: names[0].referenced,
            problem: ConfigProblem::SecretExposed(
                "grants.secrets: a probe granted secrets may not also be granted exec: a program reads files and writes output past the host's scrubbing; give the secret to another probe".into(),
            ),
        });
    }
    for (grant, at) in grants.files.iter().zip(files_at) {
        let real_grant = std::fs::canonicalize(grant).ok();
        for cell in tenants.iter().flat_map(|t| t.secrets.iter()) {
            let Some(path) = cell.path() else { continue };
            let real = std::fs::canonicalize(path).ok();
            let shown =
                path.starts_with(grant) || matches!((&real, &real_grant), (Some(r), Some(g)) if r.starts_with(g));
            if shown {
                problems.push(Located {
                    at: at.referenced,
                    problem: ConfigProblem::SecretExposed(format!(
                        "grants.files: {} shows the file of secret {:?}; grant a directory without secret files",
                        grant.display(),
                        cell.name()
                    )),
                });
            }
        }
    }
}
