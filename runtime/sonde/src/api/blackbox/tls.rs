//! The TLS series of a session, as blackbox_exporter's http, tcp and grpc
//! probers answer them.

use super::Answer;
use super::cert::{Cert, parse};
use sonde_sandbox::verdict::observed::TlsSeen;

/// What Go's zero time is in Unix seconds: blackbox's
/// `probe_ssl_last_chain_expiry_timestamp_seconds` when no chain was
/// verified (`insecure_skip_verify`).
const GO_ZERO_TIME: f64 = -62_135_596_800.0;

/// The prober whose TLS series are answered: each answers a few of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Prober {
    /// The chain's expiry and the cipher suite too.
    Http,
    /// The chain's expiry too.
    Tcp,
    /// Neither.
    Grpc,
}

/// The cipher suites rustls negotiates, by IANA number, as Go's
/// `tls.CipherSuiteName` names them (which blackbox's `cipher` label
/// carries).
const CIPHER_NAMES: [(u16, &str); 9] = [
    (0x1301, "TLS_AES_128_GCM_SHA256"),
    (0x1302, "TLS_AES_256_GCM_SHA384"),
    (0x1303, "TLS_CHACHA20_POLY1305_SHA256"),
    (0xc02b, "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"),
    (0xc02c, "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"),
    (0xc02f, "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"),
    (0xc030, "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384"),
    (0xcca8, "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256"),
    (0xcca9, "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"),
];

/// The suite's name as Go writes it: its IANA name, or `0x` and its
/// number in four upper-case hex digits when it has none here.
fn cipher_name(suite: u16) -> String {
    CIPHER_NAMES
        .iter()
        .find(|(n, _)| *n == suite)
        .map_or_else(|| format!("0x{suite:04X}"), |(_, name)| (*name).to_string())
}

/// The TLS series of a session: the earliest expiry served, the expiry of
/// the verified chain (http and tcp answer it, gRPC does not), the leaf's
/// facts, the version, and the cipher suite (http only, as blackbox's).
pub(super) fn tls_series(a: &mut Answer, tls: &TlsSeen, prober: Prober) {
    let certs: Vec<Cert> = tls.chain.iter().filter_map(|d| parse(d)).collect();
    let Some(leaf) = certs.first() else {
        return;
    };
    let earliest = certs.iter().map(|c| c.not_after).min().unwrap_or(leaf.not_after);
    a.gauge(
        "probe_ssl_earliest_cert_expiry",
        "The earliest notAfter of the certificates served, in Unix seconds",
        earliest as f64,
    );
    if prober != Prober::Grpc {
        let value = if tls.verified {
            // The chain as it links up from the leaf, issuer to subject,
            // among the certificates served.
            let mut at = leaf;
            let mut expiry = leaf.not_after;
            for _ in 1..certs.len() {
                if at.issuer_raw == at.subject_raw {
                    break;
                }
                let Some(next) = certs.iter().skip(1).find(|c| c.subject_raw == at.issuer_raw) else {
                    break;
                };
                expiry = expiry.min(next.not_after);
                at = next;
            }
            expiry as f64
        } else {
            GO_ZERO_TIME
        };
        a.gauge(
            "probe_ssl_last_chain_expiry_timestamp_seconds",
            "The earliest notAfter of the verified chain, in Unix seconds; Go's zero time when nothing was verified",
            value,
        );
    }
    let fingerprint: String = {
        use sha2::Digest;
        sha2::Sha256::digest(&tls.chain[0])
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let sans = leaf.dns_names.join(",");
    a.add(
        "probe_ssl_last_chain_info",
        "The leaf certificate served: its SHA-256, subject, issuer, DNS names and serial number",
        &[
            ("fingerprint_sha256", &fingerprint),
            ("issuer", &leaf.issuer),
            ("subject", &leaf.subject),
            ("subjectalternative", &sans),
            ("serialnumber", &leaf.serial),
        ],
        1.0,
    );
    a.add(
        "probe_tls_version_info",
        "The TLS version negotiated",
        &[("version", tls.version)],
        1.0,
    );
    if prober == Prober::Http {
        a.add(
            "probe_tls_cipher_info",
            "The TLS cipher suite negotiated",
            &[("cipher", &cipher_name(tls.cipher))],
            1.0,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suites_are_named_as_go_names_them() {
        assert_eq!(cipher_name(0x1301), "TLS_AES_128_GCM_SHA256");
        assert_eq!(cipher_name(0xcca8), "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256");
        assert_eq!(cipher_name(0x00ff), "0x00FF");
    }
}
