//! The API's callers in Kubernetes (`api: {auth: kubernetes}` or
//! `--api-auth kubernetes`): a caller's bearer token is checked with the
//! API server's `TokenReview` (authentication.k8s.io/v1) and the request is
//! authorised with a `SubjectAccessReview` (authorization.k8s.io/v1), as
//! cluster components' metrics endpoints do. So Prometheus scrapes
//! `/metrics` with its ServiceAccount token, and a user reads `/v1/probes`
//! when RBAC lets them.
//!
//! The authorisation asks about a *non-resource URL*: the request's path
//! and its method in lower case as the verb (`get /metrics`,
//! `get /v1/probes/web`, `put /v1/probes/web`). RBAC grants those with a
//! ClusterRole's `nonResourceURLs` (a trailing `*` covers a subtree), as
//! `deploy/kubernetes/rbac.yaml`'s `sonde-reader` does.
//!
//! Work an unauthenticated flood can cause is bounded ([`ReviewLimits`]):
//! results are cached (a token's review, and each (token, verb, path)
//! decision) in two maps of at most `max_entries` each, a yes for
//! `allowed_ttl`, a no for `denied_ttl`; at most `max_in_flight` callers
//! are being reviewed at once, and one more is answered at once
//! ([`ReviewError::Busy`]) rather than queued; each call to the API server
//! gives up after `timeout`. Tokens are kept only as their SHA-256.

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// The bounds of the reviews.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReviewLimits {
    /// How long an authenticated token and an allowed request are
    /// remembered. Default 60s: a revoked token or binding still works
    /// for up to this long.
    pub allowed_ttl: Duration,
    /// How long an unauthenticated token and a denied request are
    /// remembered. Default 10s: a new binding takes effect within this.
    pub denied_ttl: Duration,
    /// Entries of each cache (tokens; decisions). At the limit, expired
    /// entries go first, then the one closest to expiring. Default 4096.
    pub max_entries: usize,
    /// Callers being reviewed at once; one more is answered 503 at once.
    /// Default 8.
    pub max_in_flight: usize,
    /// Each call to the API server gives up after this. Default 5s.
    pub timeout: Duration,
}

impl Default for ReviewLimits {
    fn default() -> Self {
        Self {
            allowed_ttl: Duration::from_secs(60),
            denied_ttl: Duration::from_secs(10),
            max_entries: 4096,
            max_in_flight: 8,
            timeout: Duration::from_secs(5),
        }
    }
}

/// What the API server said of a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The token is valid and RBAC allows the request.
    Allowed {
        /// The user the token belongs to.
        user: String,
    },
    /// The token is not valid (expired, revoked, for another audience, or
    /// not a token at all).
    Unauthenticated,
    /// The token is valid but RBAC does not allow the request.
    Denied {
        /// The user the token belongs to.
        user: String,
    },
}

/// Why a request could not be reviewed.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// `max_in_flight` reviews are under way already.
    #[error("{max} token reviews are in flight already; try again")]
    Busy {
        /// The limit.
        max: usize,
    },
    /// The API server refused or failed the review.
    #[error(
        "the API server did not answer the {kind}: {source}; does sonde's ServiceAccount have `create` on {resource} (deploy/kubernetes/rbac.yaml)?"
    )]
    Failed {
        /// `TokenReview` or `SubjectAccessReview`.
        kind: &'static str,
        /// `tokenreviews.authentication.k8s.io` or the other.
        resource: &'static str,
        /// The client's error.
        source: kube::Error,
    },
    /// The API server did not answer within the timeout.
    #[error("the API server did not answer the {kind} within {timeout:?}")]
    Timeout {
        /// `TokenReview` or `SubjectAccessReview`.
        kind: &'static str,
        /// The limit.
        timeout: Duration,
    },
}

/// A bounded map whose entries expire.
struct Expiring<K, V> {
    map: HashMap<K, (V, Instant)>,
    max: usize,
}

impl<K: Hash + Eq + Clone, V: Clone> Expiring<K, V> {
    fn new(max: usize) -> Self {
        Self {
            map: HashMap::new(),
            max: max.max(1),
        }
    }

    fn get(&self, k: &K, now: Instant) -> Option<V> {
        self.map
            .get(k)
            .filter(|(_, until)| *until > now)
            .map(|(v, _)| v.clone())
    }

    fn insert(&mut self, k: K, v: V, until: Instant, now: Instant) {
        if self.map.len() >= self.max && !self.map.contains_key(&k) {
            self.map.retain(|_, (_, u)| *u > now);
            if self.map.len() >= self.max
                && let Some(first) = self.map.iter().min_by_key(|(_, (_, u))| *u).map(|(k, _)| k.clone())
            {
                self.map.remove(&first);
            }
        }
        self.map.insert(k, (v, until));
    }

    fn len(&self) -> usize {
        self.map.len()
    }
}

type Digest32 = [u8; 32];

struct Caches {
    /// Token digest -> its user, or `None` when not authenticated.
    tokens: Expiring<Digest32, Option<UserInfo>>,
    /// (token digest, verb, path) -> allowed.
    decisions: Expiring<(Digest32, String, String), bool>,
}

/// Reviews API callers with the API server, with a bounded cache.
pub struct Reviewer {
    client: kube::Client,
    limits: ReviewLimits,
    caches: Mutex<Caches>,
    in_flight: Arc<Semaphore>,
}

impl std::fmt::Debug for Reviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reviewer")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl Reviewer {
    /// A reviewer asking the API server `client` talks to.
    pub fn new(client: kube::Client, limits: ReviewLimits) -> Self {
        Self {
            client,
            limits,
            caches: Mutex::new(Caches {
                tokens: Expiring::new(limits.max_entries),
                decisions: Expiring::new(limits.max_entries),
            }),
            in_flight: Arc::new(Semaphore::new(limits.max_in_flight.max(1))),
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> ReviewLimits {
        self.limits
    }

    /// Entries in the (token, decision) caches now.
    pub fn cached(&self) -> (usize, usize) {
        let c = self.caches.lock().unwrap_or_else(|e| e.into_inner());
        (c.tokens.len(), c.decisions.len())
    }

    /// Whether the holder of `token` may `verb` (an HTTP method in lower
    /// case) the API's `path`: from the cache, else from the API server.
    pub async fn review(&self, token: &str, verb: &str, path: &str) -> Result<Decision, ReviewError> {
        let digest: Digest32 = Sha256::digest(token.as_bytes()).into();
        let key = (digest, verb.to_string(), path.to_string());
        let now = Instant::now();
        let (user, allowed) = {
            let c = self.caches.lock().unwrap_or_else(|e| e.into_inner());
            (c.tokens.get(&digest, now), c.decisions.get(&key, now))
        };
        match (&user, allowed) {
            (Some(None), _) => return Ok(Decision::Unauthenticated),
            (Some(Some(u)), Some(allowed)) => return Ok(decision(u, allowed)),
            _ => {}
        }
        let _permit = self
            .in_flight
            .clone()
            .try_acquire_owned()
            .map_err(|_| ReviewError::Busy {
                max: self.limits.max_in_flight,
            })?;
        let user = match user {
            Some(u) => u,
            None => {
                let u = self.token_review(token).await?;
                let ttl = if u.is_some() {
                    self.limits.allowed_ttl
                } else {
                    self.limits.denied_ttl
                };
                let now = Instant::now();
                let mut c = self.caches.lock().unwrap_or_else(|e| e.into_inner());
                c.tokens.insert(digest, u.clone(), now + ttl, now);
                u
            }
        };
        let Some(user) = user else {
            return Ok(Decision::Unauthenticated);
        };
        let allowed = self.access_review(&user, verb, path).await?;
        let ttl = if allowed {
            self.limits.allowed_ttl
        } else {
            self.limits.denied_ttl
        };
        let now = Instant::now();
        self.caches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .decisions
            .insert(key, allowed, now + ttl, now);
        Ok(decision(&user, allowed))
    }

    /// Creates `review` (a `kind` of `resource`) within the review timeout,
    /// and returns what the API server answered.
    async fn create<K>(&self, kind: &'static str, resource: &'static str, review: &K) -> Result<K, ReviewError>
    where
        K: kube::Resource + Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
        K::DynamicType: Default,
    {
        let api: Api<K> = Api::all(self.client.clone());
        tokio::time::timeout(self.limits.timeout, api.create(&PostParams::default(), review))
            .await
            .map_err(|_| ReviewError::Timeout {
                kind,
                timeout: self.limits.timeout,
            })?
            .map_err(|source| ReviewError::Failed { kind, resource, source })
    }

    async fn token_review(&self, token: &str) -> Result<Option<UserInfo>, ReviewError> {
        const KIND: &str = "TokenReview";
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let done = self.create(KIND, "tokenreviews.authentication.k8s.io", &review).await?;
        let status = done.status.unwrap_or_default();
        if let Some(e) = status.error.as_deref().filter(|e| !e.is_empty()) {
            tracing::debug!(error = %e, "api: a token the API server did not authenticate");
        }
        Ok(match (status.authenticated, status.user) {
            (Some(true), Some(user)) if user.username.as_deref().is_some_and(|u| !u.is_empty()) => Some(user),
            _ => None,
        })
    }

    async fn access_review(&self, user: &UserInfo, verb: &str, path: &str) -> Result<bool, ReviewError> {
        const KIND: &str = "SubjectAccessReview";
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username.clone(),
                uid: user.uid.clone(),
                groups: user.groups.clone(),
                extra: user.extra.clone(),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(path.to_string()),
                    verb: Some(verb.to_string()),
                }),
                resource_attributes: None,
            },
            ..SubjectAccessReview::default()
        };
        let done = self
            .create(KIND, "subjectaccessreviews.authorization.k8s.io", &review)
            .await?;
        let status = done.status.unwrap_or_default();
        if let Some(e) = status.evaluation_error.as_deref().filter(|e| !e.is_empty()) {
            tracing::debug!(error = %e, "api: the API server's authoriser reported an error");
        }
        Ok(status.allowed && status.denied != Some(true))
    }
}

fn decision(user: &UserInfo, allowed: bool) -> Decision {
    let user = user.username.clone().unwrap_or_default();
    if allowed {
        Decision::Allowed { user }
    } else {
        Decision::Denied { user }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::Full;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// An API server that answers every TokenReview "not authenticated"
    /// once `release` is true, and counts the reviews it was asked.
    fn held_api_server() -> (kube::Client, Arc<AtomicUsize>, tokio::sync::watch::Sender<bool>) {
        let (service, mut handle) =
            tower_test::mock::pair::<http::Request<kube::client::Body>, http::Response<Full<Bytes>>>();
        let asked = Arc::new(AtomicUsize::new(0));
        let (release, released) = tokio::sync::watch::channel(false);
        let counter = asked.clone();
        tokio::spawn(async move {
            while let Some((req, send)) = handle.next_request().await {
                assert_eq!(req.uri().path(), "/apis/authentication.k8s.io/v1/tokenreviews");
                counter.fetch_add(1, Ordering::SeqCst);
                let mut released = released.clone();
                tokio::spawn(async move {
                    let _ = released.wait_for(|r| *r).await;
                    let body = serde_json::json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                        "metadata": {}, "spec": {}, "status": {"authenticated": false, "error": "invalid bearer token"}});
                    send.send_response(
                        http::Response::builder()
                            .status(201)
                            .header("content-type", "application/json")
                            .body(Full::new(Bytes::from(body.to_string())))
                            .unwrap(),
                    );
                });
            }
        });
        (kube::Client::new(service, "default"), asked, release)
    }

    #[tokio::test]
    async fn past_max_in_flight_a_review_is_refused_at_once_and_a_bad_token_is_asked_once() {
        let (client, asked, release) = held_api_server();
        let limits = ReviewLimits {
            max_in_flight: 2,
            timeout: Duration::from_secs(600),
            ..ReviewLimits::default()
        };
        let reviewer = Arc::new(Reviewer::new(client, limits));
        let held: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|t| {
                let r = reviewer.clone();
                tokio::spawn(async move { r.review(t, "get", "/metrics").await })
            })
            .collect();
        while asked.load(Ordering::SeqCst) < 2 {
            tokio::task::yield_now().await;
        }
        // Both slots are held: a third caller is answered now, not queued.
        let third = tokio::time::timeout(Duration::from_secs(5), reviewer.review("c", "get", "/metrics"))
            .await
            .expect("answered at once");
        assert!(matches!(third, Err(ReviewError::Busy { max: 2 })), "{third:?}");
        assert_eq!(asked.load(Ordering::SeqCst), 2);
        release.send(true).unwrap();
        for h in held {
            assert_eq!(h.await.unwrap().unwrap(), Decision::Unauthenticated);
        }
        // The bad token is remembered: asked again, the API server is not.
        for _ in 0..5 {
            assert_eq!(
                reviewer.review("a", "get", "/v1/probes").await.unwrap(),
                Decision::Unauthenticated
            );
        }
        assert_eq!(asked.load(Ordering::SeqCst), 2);
        assert_eq!(reviewer.cached(), (2, 0));
    }

    #[test]
    fn the_caches_are_bounded_and_forget_what_expired() {
        let t0 = Instant::now();
        let mut c: Expiring<u32, bool> = Expiring::new(3);
        for k in 0..3 {
            c.insert(k, true, t0 + Duration::from_secs(10 + k as u64), t0);
        }
        // Full: the one closest to expiring goes.
        c.insert(3, true, t0 + Duration::from_secs(60), t0);
        assert_eq!(c.len(), 3);
        assert_eq!(c.get(&0, t0), None);
        assert_eq!(c.get(&1, t0), Some(true));
        // Expired entries are not answered, and are dropped first.
        let later = t0 + Duration::from_millis(11_500);
        assert_eq!(c.get(&1, later), None);
        c.insert(4, false, later + Duration::from_secs(1), later);
        assert_eq!(c.len(), 3);
        assert_eq!(c.get(&3, later), Some(true));
        assert_eq!(c.get(&4, later), Some(false));
        assert_eq!(c.get(&2, later), Some(true));
    }
}
