//! The per-call use of secrets: [`CallGrants::expand`] turns a text with
//! handles into the bytes the host sends, after checking each secret and
//! the peer through [`CallGrants::authorize`] (`Use::Secret`), and
//! [`CallGrants::scrubber`] what the host scrubs from every answer it hands
//! the plugin.

use super::call::{CallGrants, Denied, Use};
use crate::secrets::SecretError;
use crate::secrets::scrub::Scrubber;
use crate::secrets::template::Template;
use std::sync::Arc;
use zeroize::Zeroizing;

/// The most values one call may build from secrets (each is scrubbed from
/// every later answer).
pub(super) const MAX_EXPANSIONS: usize = 64;

/// Why a text with handles could not be expanded. Messages name secrets,
/// never their values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretUseError {
    /// The secret is not granted, or the peer is not: recorded as the
    /// run's denial.
    #[error(transparent)]
    Denied(#[from] Denied),
    /// A malformed handle, or one in a place that takes none.
    #[error("{0}")]
    Invalid(String),
    /// The secret has no value now (a file gone, a Kubernetes Secret
    /// missing).
    #[error("{0}")]
    Unavailable(String),
}

impl CallGrants {
    /// Whether the probe is granted any secret (then every answer is
    /// scrubbed and its own sockets are refused).
    pub fn holds_secrets(&self) -> bool {
        !self.config().secrets.is_empty()
    }

    /// The bytes `text` stands for when sent toward `toward`'s peer, or
    /// `None` when it holds no handle (send `text` as it is). Each secret
    /// it names is checked through [`CallGrants::authorize`]
    /// (`Use::Secret`, recorded as a denial when refused), and what is
    /// built from the secrets is scrubbed from every later answer.
    pub fn expand(&self, text: &str, toward: Use<'_>) -> Result<Option<Zeroizing<Vec<u8>>>, SecretUseError> {
        let template = match Template::parse(text) {
            Ok(None) => return Ok(None),
            Ok(Some(t)) => t,
            Err(e) => return Err(SecretUseError::Invalid(e.to_string())),
        };
        let Some((host, port)) = toward.authority() else {
            return Err(SecretUseError::Invalid("secrets go only toward a peer".into()));
        };
        for name in template.names() {
            self.authorize(Use::Secret { name, host, port })?;
        }
        let mut state = self.scrub.lock().unwrap_or_else(|e| e.into_inner());
        if state.expansions >= MAX_EXPANSIONS {
            return Err(SecretUseError::Invalid(format!(
                "more than {MAX_EXPANSIONS} values built from secrets in one call"
            )));
        }
        let mut used = Vec::new();
        let expanded = template.expand(|name| {
            let cell = self.config().secrets.get(name).expect("authorized above");
            let value = cell.current().map_err(|e| unavailable(name, &cell.source(), &e))?;
            if self.config().secrets.is_burned(&value) {
                return Err(SecretUseError::Unavailable(format!(
                    "secret {name:?} is refused to this probe until its value changes: a peer paused in the middle of reflecting it, and part of the reflection reached the plugin"
                )));
            }
            used.push(value.clone());
            Ok::<_, SecretUseError>(value)
        })?;
        state.expansions += 1;
        // A value rotated since the probe's scrubber was built is checked
        // too. (What a `$(base64:...)` encoded needs nothing more: the
        // views decode base64.)
        let current = self.config().secrets.values();
        let stale = used
            .iter()
            .filter(|u| !current.iter().any(|c| Arc::ptr_eq(c, u)))
            .map(|u| Zeroizing::new(u.expose().to_vec()));
        let before = state.extra.len();
        state.extra.extend(stale);
        if state.extra.len() != before {
            state.built = None;
        }
        Ok(Some(expanded.bytes))
    }

    /// Part of a reflection reached the plugin (a peer paused in the middle
    /// of it): the probe's secrets are refused to it until their values
    /// change, so that it cannot be done again, and the operator is told.
    pub fn secrets_spilled(&self) {
        self.config().secrets.burn();
        tracing::error!(
            secrets = %self.config().secrets.names().collect::<Vec<_>>().join(","),
            "a peer paused in the middle of reflecting a secret and fewer than 12 of its bytes reached the plugin; the probe may not use these secrets until their values change (rotate them)"
        );
    }

    /// What every answer handed to the plugin is checked against: the
    /// reflections of every granted secret and of every value built from
    /// them in this call; `None` when the probe holds no secret.
    pub fn scrubber(&self) -> Option<Arc<Scrubber>> {
        if !self.holds_secrets() {
            return None;
        }
        let mut state = self.scrub.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(built) = &state.built {
            return Some(built.clone());
        }
        if state.extra.is_empty() {
            // The probe's own, shared by its calls.
            let scrubber = self.config().secrets.scrubber();
            state.built = Some(scrubber.clone());
            return Some(scrubber);
        }
        let values = self.config().secrets.values();
        let scrubber = Arc::new(Scrubber::new(
            values
                .iter()
                .map(|v| v.expose())
                .chain(state.extra.iter().map(|e| e.as_slice())),
        ));
        state.built = Some(scrubber.clone());
        Some(scrubber)
    }
}

fn unavailable(name: &str, source: &str, e: &SecretError) -> SecretUseError {
    match e {
        SecretError::Unavailable(why) => SecretUseError::Unavailable(format!("secret {name:?} ({source}): {why}")),
        other => SecretUseError::Unavailable(format!("secret {name:?}: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grants::{Grants, NetPattern};
    use crate::secrets::{SecretCell, SecretGrants, SecretValue};

    fn call(secrets: &[(&str, &str)]) -> CallGrants {
        let cells = secrets
            .iter()
            .map(|(n, v)| {
                Arc::new(SecretCell::given(
                    n,
                    Arc::from("a"),
                    &format!("env {}", n.to_uppercase()),
                    SecretValue::new(v.as_bytes().to_vec()),
                ))
            })
            .collect();
        let grants = Grants {
            secrets: SecretGrants::new(cells),
            ..Grants::default()
        };
        CallGrants::new(
            Some(NetPattern::for_target("api.acme.test:443").unwrap()),
            Arc::new(grants),
            Arc::default(),
        )
    }

    fn http(host: &str) -> Use<'_> {
        Use::Http { host, port: 443 }
    }

    #[test]
    fn secrets_expand_only_toward_granted_peers_and_only_when_granted() {
        let g = call(&[("token", "tok-0123456789")]);
        assert_eq!(g.expand("no handle", http("api.acme.test")), Ok(None));
        let bytes = g
            .expand("Bearer $(secret:token)", http("api.acme.test"))
            .unwrap()
            .unwrap();
        assert_eq!(bytes.as_slice(), b"Bearer tok-0123456789");
        assert_eq!(g.denial_message(), None);

        let e = g.expand("Bearer $(secret:token)", http("evil.test")).unwrap_err();
        assert!(matches!(e, SecretUseError::Denied(_)), "{e:?}");
        assert_eq!(
            g.denial_message().unwrap(),
            "denied: use secret \"token\" toward evil.test:443: not the target and not granted"
        );
        let g = call(&[("token", "tok-0123456789")]);
        let e = g.expand("$(secret:other)", http("api.acme.test")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "secret \"other\" is not in the probe's grants.secrets (token)"
        );
        assert!(g.denial_message().unwrap().contains("use secret \"other\""));
        assert!(!e.to_string().contains("tok-0123456789"));
    }

    #[test]
    fn answers_that_reflect_a_secret_or_what_was_built_from_it_are_withheld() {
        use crate::secrets::scrub::WITHHELD;
        let g = call(&[("pw", "correct-horse-battery")]);
        let scrubber = g.scrubber().unwrap();
        assert_eq!(scrubber.text("echo: correct-horse-battery"), WITHHELD);
        assert_eq!(scrubber.text("echo: nothing"), "echo: nothing");
        // What the call built: the base64 of `user:password`.
        g.expand("Basic $(base64:alice:$(secret:pw))", http("api.acme.test"))
            .unwrap();
        let scrubber = g.scrubber().unwrap();
        let basic = "Authorization: Basic YWxpY2U6Y29ycmVjdC1ob3JzZS1iYXR0ZXJ5";
        assert_eq!(scrubber.text(basic), WITHHELD);
        assert!(call(&[]).scrubber().is_none());
    }

    #[test]
    fn a_spilled_secret_is_refused_to_the_probe_from_then_on() {
        let g = call(&[("pw", "correct-horse-battery")]);
        assert!(g.expand("$(secret:pw)", http("api.acme.test")).is_ok());
        g.secrets_spilled();
        let e = g.expand("$(secret:pw)", http("api.acme.test")).unwrap_err();
        assert!(
            matches!(&e, SecretUseError::Unavailable(m) if m.contains("until its value changes")),
            "{e:?}"
        );
    }

    #[test]
    fn a_probe_with_secrets_opens_no_socket_of_its_own() {
        let g = call(&[("pw", "correct-horse-battery")]);
        assert!(g.authorize(Use::Connect("10.0.0.1:443".parse().unwrap())).is_err());
        assert!(g.denial_message().unwrap().contains("through the host's transports"));
        assert!(
            call(&[])
                .authorize(Use::Connect("1.2.3.4:443".parse().unwrap()))
                .is_err(),
            "not granted anyway"
        );
    }

    #[test]
    fn an_unavailable_secret_is_named_not_shown() {
        let cell = Arc::new(SecretCell::given(
            "pw",
            Arc::from("a"),
            "Secret shop/db key password",
            Err(SecretError::Unavailable("the Secret does not exist".into())),
        ));
        let grants = Grants {
            secrets: SecretGrants::new(vec![cell]),
            ..Grants::default()
        };
        let g = CallGrants::new(
            Some(NetPattern::for_target("db:5432").unwrap()),
            Arc::new(grants),
            Arc::default(),
        );
        let e = g
            .expand("$(secret:pw)", Use::Tcp { host: "db", port: 5432 })
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "secret \"pw\" (Secret shop/db key password): the Secret does not exist"
        );
    }
}
