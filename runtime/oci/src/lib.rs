//! Plugins from OCI registries: references, a client that pushes and pulls
//! the CNCF wasm artifact layout, a content-addressed cache, and sonde
//! signatures attached to the artifact.
//!
//! A plugin in a registry is named `oci://HOST[:PORT]/REPO:TAG` or
//! `oci://HOST[:PORT]/REPO@sha256:HEX` ([`Reference`]). [`Client::resolve`]
//! turns a reference into the component's bytes: a tag is resolved to its
//! manifest digest, the digest is what runs. Every blob is checked against its
//! digest when it arrives and again when it is read from the [`Cache`], so an
//! agent that restarts while the registry is down still loads every plugin it
//! pulled before, and nothing altered on the way or on disk ever loads.
//!
//! The artifact is the CNCF TAG Runtime "wasm OCI artifact": an OCI image
//! manifest whose config has media type [`WASM_CONFIG_MEDIA_TYPE`] and whose
//! one layer is the component ([`WASM_LAYER_MEDIA_TYPE`]); tools such as
//! `wkg` and Spin push and pull the same layout. A sonde signature
//! ([`crate::signing`]) travels as an OCI 1.1 referrer of that manifest, or,
//! on a registry without the referrers API, under the tag
//! `sha256-HEX.sonde-sig` (cosign's own signatures use `sha256-HEX.sig`; the
//! two never replace each other).
//!
//! This module does not decide trust: [`Resolved::verify`] hands the bytes and
//! the signature to [`crate::signing::verify`], which does.
//!
//! # Examples
//!
//! ```no_run
//! use sonde_oci::{Client, Reference, ClientSettings};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::new(ClientSettings::new("/var/lib/sonde/oci".into()))?;
//! let reference = Reference::parse("oci://registry.example.com/acme/pg-check:1.4")?;
//! let resolved = client.resolve(&reference).await?;
//! println!("{} is {} ({} bytes)", reference, resolved.digest, resolved.bytes.len());
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

mod cache;
mod client;
mod error;
mod guard;
mod reference;
mod remote;
pub mod signing;

pub use cache::{Cache, TagMemo};
pub use client::{
    Client, ClientSettings, ComponentInfo, Progress, Pushed, RegistryAccess, Resolved, SignatureLocation,
    SignaturePushed, Source, cosign_tag, signature_tag,
};
pub use error::{BadSettings, NotWasm, OciError};
pub use guard::{Refusal, Why};
pub use reference::{Reference, RegistryScope};
pub use remote::{Limits, MAX_MANIFEST_BYTES, MAX_REDIRECTS, MAX_TOKEN_BYTES};

/// What sonde calls itself to a registry.
pub(crate) const USER_AGENT: &str = concat!("sonde/", env!("CARGO_PKG_VERSION"));
/// The media type of the wasm artifact's config (CNCF wasm OCI artifact layout).
pub const WASM_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
/// The media type of the artifact's one layer: the component.
pub const WASM_LAYER_MEDIA_TYPE: &str = "application/wasm";
/// The media type of an OCI image index (a referrer list).
pub(crate) const OCI_INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";
/// The media type of an OCI image manifest.
pub(crate) const OCI_MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// The artifact type of a sonde signature manifest, and the media type of its
/// one layer (the `FILE.wasm.sig` JSON).
pub(crate) const SIGNATURE_MEDIA_TYPE: &str = "application/vnd.sonde.signature.v1+json";
/// The largest signature (the `FILE.wasm.sig` blob) accepted.
pub(crate) const MAX_METADATA_BYTES: u64 = 64 * 1024;
