//! SCRAM-SHA-256 (RFC 5802, RFC 7677) as PostgreSQL uses it, the client
//! side, for the host's PostgreSQL login: no channel binding (`n,,`), the
//! user left empty (the server takes it from the StartupMessage), and the
//! server's signature verified, so a server that does not know the
//! password cannot pass for one that accepted it.
//!
//! The password, the salted password and the keys derived from it are
//! zeroed when dropped.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

type HmacSha256 = Hmac<Sha256>;

/// The GS2 header for "no channel binding", and its base64 (`c=` value).
const GS2_HEADER: &str = "n,,";
const GS2_HEADER_B64: &str = "biws";

/// Fewer iterations than this are refused: a server asking for fewer
/// would get a proof that is cheap to attack (PostgreSQL's default, and
/// RFC 7677's minimum, is 4096).
pub(super) const MIN_ITERATIONS: u32 = 4096;
/// More iterations than this are refused: a hostile server could
/// otherwise spend the host's time.
pub(super) const MAX_ITERATIONS: u32 = 1_000_000;

/// The longest salt accepted, in bytes (PostgreSQL's is 16).
const MAX_SALT: usize = 1024;

/// A SCRAM exchange after the client-first-message.
pub(super) struct Scram {
    client_nonce: String,
    client_first_bare: String,
}

/// What the server's first message asks for: the salt and the iteration
/// count to derive the salted password with (the costly step, which the
/// caller runs off the async threads), and the combined nonce.
pub(super) struct ServerFirst {
    message: String,
    nonce: String,
    pub(super) salt: Vec<u8>,
    pub(super) iterations: u32,
}

/// The client-final-message, and the signature the server must answer
/// with.
pub(super) struct ClientFinal {
    pub(super) message: String,
    server_signature: Zeroizing<Vec<u8>>,
}

fn hmac(key: &[u8], data: &[u8]) -> Zeroizing<Vec<u8>> {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(data);
    Zeroizing::new(mac.finalize().into_bytes().to_vec())
}

/// Why a SCRAM exchange stopped. The messages quote nothing the server
/// sent but its own refusal.
#[derive(Debug, thiserror::Error)]
pub(super) enum ScramError {
    /// The host had no randomness for its nonce.
    #[error("no randomness for the SCRAM nonce")]
    Randomness(#[source] getrandom::Error),
    /// The server asked for an extension (`m=`).
    #[error("the server requires a SCRAM extension")]
    Extension,
    /// A field the server's message must hold is missing.
    #[error("no {0} in the server's SCRAM message")]
    Missing(&'static str),
    /// The server's nonce does not extend the client's.
    #[error("the server's SCRAM nonce does not extend ours")]
    Nonce,
    /// The salt or the signature is not base64.
    #[error("the server's SCRAM {0} is not base64")]
    NotBase64(&'static str),
    /// A salt empty or longer than the host takes.
    #[error("a SCRAM salt of {0} bytes")]
    SaltLength(usize),
    /// The iteration count is not a number.
    #[error("the server's SCRAM iteration count is not a number")]
    IterationsNotANumber,
    /// An iteration count outside the bounds the host takes.
    #[error("the server asks for {0} SCRAM iterations (from {MIN_ITERATIONS} to {MAX_ITERATIONS} accepted)")]
    Iterations(u32),
    /// The server refused the proof (`e=`): its words.
    #[error("the server refused the SCRAM proof: {0}")]
    Refused(String),
    /// The final message holds no signature.
    #[error("no server signature in the SCRAM final message")]
    NoSignature,
    /// The server's signature is not the one the password makes.
    #[error("the server's SCRAM signature is wrong: it does not know the password")]
    WrongSignature,
}

/// The salted password: PBKDF2-HMAC-SHA256 of `password`.
pub(super) fn salted_password(password: &[u8], salt: &[u8], iterations: u32) -> Zeroizing<[u8; 32]> {
    let mut salted = Zeroizing::new([0u8; 32]);
    pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, salted.as_mut());
    salted
}

impl Scram {
    /// Starts an exchange with a random nonce.
    pub(super) fn new() -> Result<Self, ScramError> {
        let mut raw = [0u8; 18];
        getrandom::fill(&mut raw).map_err(ScramError::Randomness)?;
        Ok(Self::with_nonce(&BASE64.encode(raw)))
    }

    /// Starts an exchange with a given nonce (for the RFC's vectors).
    fn with_nonce(nonce: &str) -> Self {
        Self {
            client_nonce: nonce.to_string(),
            client_first_bare: format!("n=,r={nonce}"),
        }
    }

    /// The client-first-message.
    pub(super) fn client_first(&self) -> String {
        format!("{GS2_HEADER}{}", self.client_first_bare)
    }

    /// Reads the server-first-message, refusing one that does not extend
    /// our nonce, has no usable salt, or asks for too few or too many
    /// iterations. The messages quote nothing the server sent.
    pub(super) fn server_first(&self, message: &str) -> Result<ServerFirst, ScramError> {
        let (mut nonce, mut salt, mut iterations) = (None, None, None);
        for attr in message.split(',') {
            match attr.split_once('=') {
                Some(("r", v)) => nonce = Some(v),
                Some(("s", v)) => salt = Some(v),
                Some(("i", v)) => iterations = Some(v),
                Some(("m", _)) => return Err(ScramError::Extension),
                _ => {}
            }
        }
        let nonce = nonce.ok_or(ScramError::Missing("nonce"))?;
        if !nonce.starts_with(&self.client_nonce) || nonce.len() == self.client_nonce.len() {
            return Err(ScramError::Nonce);
        }
        let salt = BASE64
            .decode(salt.ok_or(ScramError::Missing("salt"))?)
            .map_err(|_| ScramError::NotBase64("salt"))?;
        if salt.is_empty() || salt.len() > MAX_SALT {
            return Err(ScramError::SaltLength(salt.len()));
        }
        let iterations: u32 = iterations
            .ok_or(ScramError::Missing("iteration count"))?
            .parse()
            .map_err(|_| ScramError::IterationsNotANumber)?;
        if !(MIN_ITERATIONS..=MAX_ITERATIONS).contains(&iterations) {
            return Err(ScramError::Iterations(iterations));
        }
        Ok(ServerFirst {
            message: message.to_string(),
            nonce: nonce.to_string(),
            salt,
            iterations,
        })
    }

    /// The client-final-message, with the proof made from `salted` (the
    /// salted password for `first`'s salt and iterations).
    pub(super) fn client_final(&self, first: &ServerFirst, salted: &[u8]) -> ClientFinal {
        let client_key = hmac(salted, b"Client Key");
        let stored_key = Zeroizing::new(Sha256::digest(&*client_key).to_vec());
        let without_proof = format!("c={GS2_HEADER_B64},r={}", first.nonce);
        let auth_message = format!("{},{},{without_proof}", self.client_first_bare, first.message);
        let client_signature = hmac(&stored_key, auth_message.as_bytes());
        let proof: Zeroizing<Vec<u8>> = Zeroizing::new(
            client_key
                .iter()
                .zip(client_signature.iter())
                .map(|(k, s)| k ^ s)
                .collect(),
        );
        let server_key = hmac(salted, b"Server Key");
        ClientFinal {
            message: format!("{without_proof},p={}", BASE64.encode(&*proof)),
            server_signature: hmac(&server_key, auth_message.as_bytes()),
        }
    }
}

impl ClientFinal {
    /// Checks the server-final-message: a server that does not know the
    /// password cannot produce it.
    pub(super) fn verify_server(&self, server_final: &str) -> Result<(), ScramError> {
        if let Some(e) = server_final.strip_prefix("e=") {
            return Err(ScramError::Refused(e.to_string()));
        }
        let v = server_final
            .split(',')
            .find_map(|a| a.strip_prefix("v="))
            .ok_or(ScramError::NoSignature)?;
        let v = BASE64.decode(v).map_err(|_| ScramError::NotBase64("signature"))?;
        if v != *self.server_signature {
            return Err(ScramError::WrongSignature);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677, section 3: user "user", password "pencil".
    #[test]
    fn rfc_7677_test_vector() {
        let mut scram = Scram::with_nonce("rOprNGfwEbeRWgbNEkqO");
        // The RFC's client-first names the user; PostgreSQL's does not.
        scram.client_first_bare = "n=user,r=rOprNGfwEbeRWgbNEkqO".into();
        let first = scram
            .server_first("r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
            .unwrap();
        assert_eq!(first.iterations, 4096);
        let salted = salted_password(b"pencil", &first.salt, first.iterations);
        let fin = scram.client_final(&first, salted.as_ref());
        assert_eq!(
            fin.message,
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        fin.verify_server("v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
            .unwrap();
        assert!(matches!(fin.verify_server("v=AAAA"), Err(ScramError::WrongSignature)));
        assert!(matches!(
            fin.verify_server("v=!!"),
            Err(ScramError::NotBase64("signature"))
        ));
        assert!(matches!(fin.verify_server("x=1"), Err(ScramError::NoSignature)));
        let e = fin.verify_server("e=invalid-proof").unwrap_err();
        assert!(matches!(&e, ScramError::Refused(why) if why == "invalid-proof"), "{e}");
    }

    #[test]
    fn the_client_first_message_names_no_user_and_a_fresh_nonce() {
        let (a, b) = (Scram::new().unwrap(), Scram::new().unwrap());
        assert!(a.client_first().starts_with("n,,n=,r="), "{}", a.client_first());
        assert_ne!(a.client_first(), b.client_first());
    }

    #[test]
    fn hostile_server_first_messages_are_refused() {
        let scram = Scram::with_nonce("abc");
        for (msg, expected) in [
            ("r=xyz,s=AAAA,i=4096", "does not extend"),
            ("r=abc,s=AAAA,i=4096", "does not extend"),
            ("s=AAAA,i=4096", "no nonce"),
            ("r=abcd,s=AAAA,i=4095", "4095 SCRAM iterations"),
            ("r=abcd,s=AAAA,i=1", "1 SCRAM iterations"),
            ("r=abcd,s=AAAA,i=1000001", "1000001 SCRAM iterations"),
            ("r=abcd,s=AAAA,i=-4", "not a number"),
            ("r=abcd,s=AAAA", "no iteration count"),
            ("r=abcd,s=!!,i=4096", "not base64"),
            ("r=abcd,s=,i=4096", "salt of 0 bytes"),
            ("r=abcd,i=4096", "no salt"),
            ("m=ext,r=abcd,s=AAAA,i=4096", "extension"),
        ] {
            let Err(err) = scram.server_first(msg) else {
                panic!("{msg}: accepted");
            };
            assert!(err.to_string().contains(expected), "{msg}: {err}");
        }
        assert!(scram.server_first("r=abcd,s=AAAA,i=1000000").is_ok());
    }
}
