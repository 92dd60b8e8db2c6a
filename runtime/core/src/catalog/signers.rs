//! The names signatures go by: each `trust` key's signer name (a PEM
//! key's file name) is one key's, and each `ceiling.signers` names trust
//! keys.

use super::problem::{ConfigProblem, Located, Owner};
use crate::config;

/// Each `trust` key's signer name is one key's; each ceiling's `signers`
/// (tenants' and namespace templates') names `trust` keys.
pub(super) fn check_trust_names(trust: &super::Trust, file: &config::File, problems: &mut Vec<Located>) {
    for (i, k) in trust.keys.iter().enumerate() {
        if let Some(first) = trust.keys[..i].iter().find(|o| o.signer() == k.signer())
            && let Some(at) = file.trust.get(i)
        {
            problems.push(Located {
                at: at.referenced,
                problem: ConfigProblem::TrustSignerDuplicate {
                    signer: k.signer().to_string(),
                    first: first.key_id().to_string(),
                },
            });
        }
    }
    let mut known: Vec<String> = trust.keys.iter().map(|k| k.signer().to_string()).collect();
    known.dedup();
    let templates = file.kubernetes.iter().flat_map(|k| k.namespace_templates.iter());
    let ceilings = file
        .tenants
        .iter()
        .map(|t| (Owner::Tenant(t.id.value.trim().to_string()), &t.ceiling))
        .chain(templates.map(|(name, t)| (Owner::Template(name.clone()), &t.value.ceiling)));
    for (owner, c) in ceilings {
        for name in c.signers.iter().flatten() {
            if !known.iter().any(|k| k == name.value.trim()) {
                problems.push(Located {
                    at: name.referenced,
                    problem: ConfigProblem::CeilingSigner {
                        owner: owner.clone(),
                        name: name.value.clone(),
                        known: known.clone(),
                    },
                });
            }
        }
    }
}
