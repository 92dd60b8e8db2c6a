//! The registry client against hostile registries (the server is
//! `support::hostile_registry`): silence, endless bodies, wrong sizes and
//! digests, redirects and token realms pointing at places the agent must
//! not go, a trickle. Each ends in a typed error within a bound of time
//! and bytes.

use crate::support::hostile_registry::{Hostile, Server, digest, layer};
use sonde_oci::{Client, ClientSettings, Limits, OciError, RegistryAccess};
use std::time::{Duration, Instant};

/// A client of `server` with its own cache, plain HTTP, a 1 s idle timeout
/// and a whole-pull deadline of `deadline`.
fn client(server: &Server, cache: &std::path::Path, deadline: Duration) -> Client {
    let mut settings = ClientSettings::new(cache.to_path_buf());
    settings.timeout = deadline;
    settings.limits = Limits {
        connect: Duration::from_secs(1),
        idle: Duration::from_secs(1),
    };
    settings.registries.insert(
        server.addr.to_string(),
        RegistryAccess {
            insecure: true,
            ..RegistryAccess::default()
        },
    );
    Client::new(settings).unwrap()
}

/// Resolves `server`'s reference; the error, how long it took, and the
/// bytes the server had sent by then.
async fn pull(how: Hostile) -> (OciError, Duration, u64) {
    let server = Server::start(how).await;
    let cache = tempfile::tempdir().unwrap();
    let client = client(&server, cache.path(), Duration::from_secs(30));
    let started = Instant::now();
    let e = client
        .resolve(&server.reference())
        .await
        .expect_err("a hostile registry's artifact is refused");
    let (took, sent) = (started.elapsed(), server.sent());
    eprintln!("{how:?}: {e} ({} ms, {sent} bytes sent)", took.as_millis());
    (e, took, sent)
}

/// What the client may have read, at most, besides a cap: the kernel's
/// socket buffers on loopback and one chunk.
const SLACK: u64 = 16 << 20;

/// A pull from `how` is refused as a `what` over `cap`, within 5 s and
/// having been sent no more than the cap and [`SLACK`].
async fn refused_at_cap(how: Hostile, what: &str, cap: u64) {
    let (e, took, sent) = pull(how).await;
    assert!(
        matches!(e, OciError::TooLarge { what: w, limit, .. } if w == what && limit == cap),
        "{e}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(sent < cap + SLACK, "{sent} bytes sent");
}

#[tokio::test]
async fn a_silent_registry_is_given_up_on_after_the_idle_timeout_not_the_pull_deadline() {
    let (e, took, _) = pull(Hostile::Silent).await;
    assert!(
        matches!(e, OciError::NotCached { ref source, .. } if matches!(**source, OciError::Stalled { .. })),
        "{e}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}: the idle timeout is 1 s");
}

#[tokio::test]
async fn an_endless_manifest_is_refused_at_its_cap() {
    for how in [Hostile::EndlessManifest, Hostile::HugeManifest] {
        refused_at_cap(how, "manifest", sonde_oci::MAX_MANIFEST_BYTES).await;
    }
}

#[tokio::test]
async fn a_blob_is_read_at_its_declared_size_and_no_further() {
    let (e, took, sent) = pull(Hostile::EndlessBlob).await;
    assert!(
        matches!(
            e,
            OciError::SizeMismatch {
                declared: 1000,
                early: true,
                ..
            }
        ),
        "an endless blob stops at its declared size: {e}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(sent < SLACK, "{sent} bytes sent for a 1,000-byte blob");
    let (e, ..) = pull(Hostile::LongAnnouncedBlob).await;
    assert!(
        matches!(
            e,
            OciError::SizeMismatch {
                declared: 1000,
                got: 2000,
                early: true,
                ..
            }
        ),
        "a blob that announces more than declared is refused before it is read: {e}"
    );
    let (e, ..) = pull(Hostile::ShortBlob).await;
    assert!(
        matches!(
            e,
            OciError::SizeMismatch {
                declared: 1000,
                got: 500,
                early: false,
                ..
            }
        ),
        "a short blob: {e}"
    );
    assert!(e.to_string().contains("ended after 500"), "{e}");
}

#[tokio::test]
async fn a_blob_that_does_not_hash_to_its_digest_is_refused_and_not_cached() {
    let server = Server::start(Hostile::WrongDigest).await;
    let cache = tempfile::tempdir().unwrap();
    let e = client(&server, cache.path(), Duration::from_secs(30))
        .resolve(&server.reference())
        .await
        .unwrap_err();
    assert!(
        matches!(e, OciError::DigestMismatch { ref expected, .. } if *expected == digest(&layer())),
        "{e}"
    );
    let cached = cache
        .path()
        .join("blobs/sha256")
        .join(&digest(&layer())["sha256:".len()..]);
    assert!(!cached.exists(), "a refused blob is not cached");
}

#[tokio::test]
async fn redirects_to_places_the_agent_does_not_go_are_refused() {
    for to in [
        "http://169.254.169.254/latest/meta-data/",
        "http://[::ffff:169.254.169.254]/x",
        "http://[fe80::1]/x",
        "http://0.0.0.0:1/x",
        "http://224.0.0.1/x",
        "file:///etc/passwd",
    ] {
        let (e, took, _) = pull(Hostile::Redirect(to)).await;
        assert!(matches!(e, OciError::Refused { .. }), "{to}: {e}");
        assert!(e.to_string().contains("is refused"), "{to}: {e}");
        assert!(
            took < Duration::from_secs(3),
            "{to}: refused before any connection ({took:?})"
        );
    }
    let (e, ..) = pull(Hostile::RedirectLoop).await;
    assert!(
        matches!(e, OciError::Refused { .. }) && e.to_string().contains("redirects in a row"),
        "{e}"
    );
}

/// A pull from `hostile` under a whole-pull `deadline`: it must end in a
/// timeout (the cache has nothing to stand in) within `deadline` and 2 s.
async fn ends_at_the_deadline(hostile: Hostile, deadline: Duration) {
    let server = Server::start(hostile).await;
    let cache = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let e = client(&server, cache.path(), deadline)
        .resolve(&server.reference())
        .await
        .expect_err("the pull takes longer than its deadline");
    let took = started.elapsed();
    eprintln!("{e} ({} ms)", took.as_millis());
    assert!(
        matches!(e, OciError::NotCached { ref source, .. } if matches!(**source, OciError::Timeout { .. })),
        "{e}"
    );
    assert!(
        (deadline..deadline + Duration::from_secs(2)).contains(&took),
        "{took:?}"
    );
}

/// A byte every 300 ms never trips the 1 s idle timeout; the deadline does.
#[tokio::test]
async fn a_trickle_is_cut_off_by_the_whole_pulls_deadline() {
    ends_at_the_deadline(Hostile::Trickle, Duration::from_secs(2)).await;
}

/// Answers that each come within any per-answer timeout still end at the
/// whole pull's deadline: 2 s per answer, a 3 s deadline for all of them.
#[tokio::test]
async fn slow_answers_end_at_the_whole_pulls_deadline_not_one_timeout_per_answer() {
    ends_at_the_deadline(Hostile::SlowAnswers, Duration::from_secs(3)).await;
}

#[tokio::test]
async fn token_endpoints_are_bounded_and_checked_like_redirects() {
    refused_at_cap(Hostile::EndlessToken, "token answer", sonde_oci::MAX_TOKEN_BYTES).await;
    let (e, ..) = pull(Hostile::Realm("http://169.254.169.254/token")).await;
    assert!(
        matches!(e, OciError::Refused { .. }) && e.to_string().contains("token realm"),
        "{e}"
    );
}

#[tokio::test]
async fn an_endless_response_head_and_an_endless_referrer_list_are_bounded() {
    let (e, took, sent) = pull(Hostile::EndlessHeaders).await;
    assert!(took < Duration::from_secs(5) && sent < SLACK, "{e}: {took:?} {sent}");
    refused_at_cap(
        Hostile::EndlessReferrers,
        "referrer list",
        sonde_oci::MAX_MANIFEST_BYTES,
    )
    .await;
}

/// A `.sig` tag with 200 signatures: at most [`sonde_oci::signing::MAX_ITEMS`]
/// are read, none verifies, and the plugin is refused as untrusted (its
/// bytes still resolve: the flood is the signature's problem only).
#[tokio::test]
async fn a_flood_of_signatures_is_read_up_to_its_bound_and_refused() {
    let server = Server::start(Hostile::SignatureFlood).await;
    let cache = tempfile::tempdir().unwrap();
    let resolved = client(&server, cache.path(), Duration::from_secs(10))
        .resolve(&server.reference())
        .await
        .unwrap();
    let (doc, _) = resolved.signature.clone().expect("the flood is found");
    let gathered: sonde_oci::signing::Gathered = serde_json::from_slice(&doc).unwrap();
    assert_eq!(gathered.items.len(), sonde_oci::signing::MAX_ITEMS);
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("acme.key");
    let trusted = sonde_oci::signing::keygen(&key, "acme").unwrap();
    let e = resolved.verify(&[trusted]).unwrap_err();
    assert!(
        matches!(
            e,
            sonde_oci::signing::SignatureError::NoTrustedSignature { found: 16, .. }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("untrusted: 16 signature(s)"), "{e}");
}
