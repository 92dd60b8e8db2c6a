//! One registry's client: its credentials, its bounded transport, and how
//! its errors become [`OciError`]s (secrets scrubbed).

use super::RegistryAccess;
use crate::error::BadSettings;
use crate::remote::{Limits, Remote, Secret};
use crate::{OciError, Reference};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::secrets::RegistryAuth;
use std::path::PathBuf;

/// One registry's client and credentials.
pub(super) struct RegistryClient {
    pub(super) name: String,
    /// For pushes.
    pub(super) client: oci_client::Client,
    /// For everything read: bounded in size, time and place.
    pub(super) remote: Remote,
    username: Option<String>,
    password: Option<Secret>,
}

impl RegistryClient {
    pub(super) fn auth(&self) -> RegistryAuth {
        match (&self.username, &self.password) {
            (Some(u), Some(p)) => RegistryAuth::Basic(u.clone(), p.0.clone()),
            _ => RegistryAuth::Anonymous,
        }
    }

    /// Text from the registry or the HTTP stack, with the password removed
    /// should anything ever echo it.
    fn scrub(&self, text: String) -> String {
        match &self.password {
            Some(p) if !p.0.is_empty() => text.replace(&p.0, "<redacted>"),
            _ => text,
        }
    }

    /// Turns an oci-client error into one that names the registry or the
    /// reference and carries no secret.
    pub(super) fn error(&self, reference: &Reference, e: OciDistributionError) -> OciError {
        let has_code = |codes: &[OciErrorCode]| match &e {
            OciDistributionError::RegistryError { envelope, .. } => {
                envelope.errors.iter().any(|x| codes.contains(&x.code))
            }
            _ => false,
        };
        let status = match &e {
            OciDistributionError::ServerError { code, .. } => Some(*code),
            _ => None,
        };
        let auth_failed = matches!(
            e,
            OciDistributionError::UnauthorizedError { .. } | OciDistributionError::AuthenticationFailure(_)
        ) || matches!(status, Some(401 | 403))
            || has_code(&[OciErrorCode::Unauthorized, OciErrorCode::Denied]);
        if auth_failed {
            let detail = match &self.username {
                Some(u) if self.password.is_some() => {
                    format!("the registry refused the credentials of user {u:?}")
                }
                _ => "the registry wants credentials and none are configured for it".into(),
            };
            return OciError::Auth {
                registry: self.name.clone(),
                detail,
            };
        }
        let not_found = matches!(e, OciDistributionError::ImageManifestNotFoundError(_))
            || status == Some(404)
            || has_code(&[
                OciErrorCode::ManifestUnknown,
                OciErrorCode::NameUnknown,
                OciErrorCode::BlobUnknown,
            ]);
        if not_found {
            return OciError::NotFound {
                reference: reference.to_string(),
            };
        }
        if let OciDistributionError::RequestError(r) = &e {
            let mut detail = r.to_string();
            let mut source = std::error::Error::source(r);
            while let Some(s) = source {
                detail.push_str(": ");
                detail.push_str(&s.to_string());
                source = s.source();
            }
            let detail = self.scrub(detail);
            if r.is_connect() || r.is_timeout() || r.is_request() {
                return OciError::Unreachable {
                    registry: self.name.clone(),
                    detail,
                };
            }
            return OciError::Registry {
                registry: self.name.clone(),
                detail,
            };
        }
        OciError::Registry {
            registry: self.name.clone(),
            detail: self.scrub(e.to_string()),
        }
    }
}

pub(super) fn build_registry(name: &str, s: &RegistryAccess, limits: Limits) -> Result<RegistryClient, OciError> {
    // reqwest is built without a default crypto provider; sonde uses ring
    // everywhere. Installing fails only when one is already installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let settings_error = |why: BadSettings| OciError::Settings {
        registry: name.to_string(),
        why,
    };
    let read_error = |path: &PathBuf, source| {
        settings_error(BadSettings::Read {
            path: path.clone(),
            source,
        })
    };
    let password = match &s.password_file {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| read_error(p, e))?;
            let line = text.lines().next().unwrap_or_default().to_string();
            if line.is_empty() {
                return Err(settings_error(BadSettings::EmptyPassword(p.clone())));
            }
            Some(Secret(line))
        }
        None => None,
    };
    if password.is_some() != s.username.is_some() {
        return Err(settings_error(BadSettings::HalfBasicAuth));
    }
    let mut extra_roots = Vec::new();
    let mut roots = Vec::new();
    if let Some(ca) = &s.ca_file {
        let pem = std::fs::read(ca).map_err(|e| read_error(ca, e))?;
        if !pem.windows(11).any(|w| w == b"-----BEGIN ") {
            return Err(settings_error(BadSettings::NotPem(ca.clone())));
        }
        roots = reqwest::Certificate::from_pem_bundle(&pem).map_err(|source| {
            settings_error(BadSettings::Certificates {
                path: ca.clone(),
                source,
            })
        })?;
        extra_roots.push(oci_client::client::Certificate {
            encoding: oci_client::client::CertificateEncoding::Pem,
            data: pem,
        });
    }
    if s.insecure {
        let host = name.rsplit_once(':').map_or(name, |(h, _)| h);
        let loopback = host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
        if !loopback {
            tracing::warn!(registry = %name, "plain HTTP to a registry that is not on loopback: anyone on the path can read and alter pulls");
        }
    }
    let config = oci_client::client::ClientConfig {
        protocol: if s.insecure {
            oci_client::client::ClientProtocol::Http
        } else {
            oci_client::client::ClientProtocol::Https
        },
        extra_root_certificates: extra_roots,
        // An image index is not a wasm artifact; sonde refuses it rather
        // than picking a platform.
        platform_resolver: None,
        connect_timeout: Some(limits.connect),
        read_timeout: Some(limits.idle),
        user_agent: crate::USER_AGENT,
        ..Default::default()
    };
    let client = oci_client::Client::try_from(config).map_err(|e| OciError::Registry {
        registry: name.to_string(),
        detail: format!("cannot build the HTTP client: {e}"),
    })?;
    let remote = Remote::new(name, s.insecure, roots, s.username.clone(), password.clone(), limits)?;
    Ok(RegistryClient {
        name: name.to_string(),
        client,
        remote,
        username: s.username.clone(),
        password,
    })
}
