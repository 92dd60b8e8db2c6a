//! The API tokens of the tenants and the operator, as `settings` reads
//! them: each from its file or variable, and no two principals with one.

use super::problem::{ConfigProblem, Located};
use crate::auth::Token;
use crate::config::Spanned;
use crate::tenants::{self, Tenant};
use serde_saphyr::Location;
use std::path::{Path, PathBuf};

/// A token read from its file (relative to `base`) or environment
/// variable; `None` when none is set, or when it cannot be read (a
/// problem of `who`'s, at its key or else at `fallback`).
pub(super) fn token(
    base: &Path,
    problems: &mut Vec<Located>,
    who: &str,
    f: &Option<Spanned<PathBuf>>,
    env: &Option<Spanned<String>>,
    fallback: Location,
) -> Option<Token> {
    let token_path = f.as_ref().map(|f| base.join(&f.value));
    let at = f
        .as_ref()
        .map(|f| f.referenced)
        .or(env.as_ref().map(|e| e.referenced))
        .unwrap_or(fallback);
    match tenants::read_token(token_path.as_deref(), env.as_ref().map(|e| e.value.trim())) {
        Ok(t) => t,
        Err(error) => {
            problems.push(Located {
                at,
                problem: ConfigProblem::Token {
                    who: who.to_string(),
                    error,
                },
            });
            None
        }
    }
}

/// One token, one principal: a token shared by two would let one act as
/// the other. Each tenant in `list` (defined at `id_at`) whose token is the
/// operator's or an earlier tenant's is named.
pub(super) fn check_distinct(
    list: &[Tenant],
    id_at: &[Location],
    operator: Option<&Token>,
    problems: &mut Vec<Located>,
) {
    for (i, t) in list.iter().enumerate() {
        let Some(token) = &t.token else { continue };
        let clash = if operator == Some(token) {
            Some("the operator".to_string())
        } else {
            list[..i]
                .iter()
                .find(|o| o.token.as_ref() == Some(token))
                .map(|o| format!("tenant {:?}", o.id))
        };
        if let Some(other) = clash {
            problems.push(Located {
                at: id_at[i],
                problem: ConfigProblem::TokenShared {
                    tenant: t.id.to_string(),
                    other,
                },
            });
        }
    }
}
