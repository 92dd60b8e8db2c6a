//! SCRAM-SHA-256 (RFC 5802, RFC 7677) as PostgreSQL uses it: the client
//! side, without channel binding (the connection has no TLS).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};
use std::fmt;

type HmacSha256 = Hmac<Sha256>;

/// The GS2 header for "no channel binding", and its base64 (`c=` value).
const GS2_HEADER: &str = "n,,";
const GS2_HEADER_B64: &str = "biws";

/// More iterations than this are refused: a hostile server could otherwise
/// spend the plugin's whole budget (PostgreSQL's default is 4096).
pub(crate) const MAX_ITERATIONS: u32 = 100_000;

/// A SCRAM exchange in progress.
pub(crate) struct Scram {
    password: Vec<u8>,
    client_nonce: String,
    client_first_bare: String,
}

/// What the client sends after the server's first message, and what it
/// expects in the server's final message.
pub(crate) struct ClientFinal {
    pub message: String,
    server_signature: Vec<u8>,
}

/// Why a SCRAM exchange stopped.
#[derive(Debug, PartialEq)]
pub(crate) enum ScramError {
    /// The system gave no randomness for the client nonce.
    NoRandomness(getrandom::Error),
    /// The server asks for an extension (`m=`) this client does not speak.
    Extension,
    /// A field the message must carry is missing.
    Missing(&'static str),
    /// The server's nonce does not start with and extend the client's.
    NonceNotExtended,
    /// A field that must be base64 is not.
    NotBase64(&'static str),
    /// The iteration count is not a number.
    IterationsNotNumber,
    /// The iteration count is zero or past [`MAX_ITERATIONS`].
    Iterations(u32),
    /// The server said no to the proof (its `e=` text).
    Refused(String),
    /// The server's signature is not the one its knowing the password makes.
    WrongSignature,
}

impl fmt::Display for ScramError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoRandomness(e) => write!(f, "no randomness for the SCRAM nonce: {e}"),
            Self::Extension => f.write_str("the server requires a SCRAM extension"),
            Self::Missing(what) => write!(f, "no {what} in the server's SCRAM message"),
            Self::NonceNotExtended => f.write_str("the server's SCRAM nonce does not extend ours"),
            Self::NotBase64(what) => write!(f, "the server's SCRAM {what} is not base64"),
            Self::IterationsNotNumber => f.write_str("the server's SCRAM iteration count is not a number"),
            Self::Iterations(n) => write!(f, "the server asks for {n} SCRAM iterations (at most {MAX_ITERATIONS})"),
            Self::Refused(e) => write!(f, "the server refused the SCRAM proof: {e}"),
            Self::WrongSignature => f.write_str("the server's SCRAM signature is wrong: it does not know the password"),
        }
    }
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

impl Scram {
    /// Starts an exchange with a random nonce.
    pub(crate) fn new(password: &str) -> Result<Self, ScramError> {
        let mut raw = [0u8; 18];
        getrandom::fill(&mut raw).map_err(ScramError::NoRandomness)?;
        Ok(Self::with_nonce(password, &BASE64.encode(raw)))
    }

    /// Starts an exchange with a given nonce (for tests against RFC vectors).
    pub(crate) fn with_nonce(password: &str, nonce: &str) -> Self {
        // PostgreSQL takes the user from the startup message; `n=` stays empty.
        Self {
            password: password.as_bytes().to_vec(),
            client_nonce: nonce.to_string(),
            client_first_bare: format!("n=,r={nonce}"),
        }
    }

    /// The client-first-message.
    pub(crate) fn client_first(&self) -> String {
        format!("{GS2_HEADER}{}", self.client_first_bare)
    }

    /// Answers the server-first-message.
    pub(crate) fn client_final(&self, server_first: &str) -> Result<ClientFinal, ScramError> {
        let (mut nonce, mut salt, mut iterations) = (None, None, None);
        for attr in server_first.split(',') {
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
            return Err(ScramError::NonceNotExtended);
        }
        let salt = BASE64
            .decode(salt.ok_or(ScramError::Missing("salt"))?)
            .map_err(|_| ScramError::NotBase64("salt"))?;
        let iterations: u32 = iterations
            .ok_or(ScramError::Missing("iteration count"))?
            .parse()
            .map_err(|_| ScramError::IterationsNotNumber)?;
        if iterations == 0 || iterations > MAX_ITERATIONS {
            return Err(ScramError::Iterations(iterations));
        }

        let mut salted = [0u8; 32];
        pbkdf2::pbkdf2_hmac::<Sha256>(&self.password, &salt, iterations, &mut salted);
        let client_key = hmac(&salted, b"Client Key");
        let stored_key = Sha256::digest(&client_key);
        let without_proof = format!("c={GS2_HEADER_B64},r={nonce}");
        let auth_message = format!("{},{server_first},{without_proof}", self.client_first_bare);
        let client_signature = hmac(&stored_key, auth_message.as_bytes());
        let proof: Vec<u8> = client_key.iter().zip(&client_signature).map(|(k, s)| k ^ s).collect();
        let server_key = hmac(&salted, b"Server Key");
        Ok(ClientFinal {
            message: format!("{without_proof},p={}", BASE64.encode(proof)),
            server_signature: hmac(&server_key, auth_message.as_bytes()),
        })
    }
}

impl ClientFinal {
    /// Checks the server-final-message: a server that does not know the
    /// password cannot produce it.
    pub(crate) fn verify_server(&self, server_final: &str) -> Result<(), ScramError> {
        if let Some(e) = server_final.strip_prefix("e=") {
            return Err(ScramError::Refused(e.to_string()));
        }
        let v = server_final
            .split(',')
            .find_map(|a| a.strip_prefix("v="))
            .ok_or(ScramError::Missing("server signature"))?;
        let v = BASE64.decode(v).map_err(|_| ScramError::NotBase64("signature"))?;
        if v != self.server_signature {
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
        let mut scram = Scram::with_nonce("pencil", "rOprNGfwEbeRWgbNEkqO");
        // The RFC's client-first names the user; PostgreSQL's does not.
        scram.client_first_bare = "n=user,r=rOprNGfwEbeRWgbNEkqO".into();
        let server_first = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        let fin = scram.client_final(server_first).unwrap();
        assert_eq!(
            fin.message,
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        fin.verify_server("v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
            .unwrap();
        assert_eq!(fin.verify_server("v=AAAA"), Err(ScramError::WrongSignature));
        assert_eq!(
            fin.verify_server("e=invalid-proof"),
            Err(ScramError::Refused("invalid-proof".into()))
        );
        assert_eq!(fin.verify_server("x=1"), Err(ScramError::Missing("server signature")));
    }

    #[test]
    fn hostile_server_messages_are_refused() {
        let scram = Scram::with_nonce("pw", "abc");
        for (msg, expected, says) in [
            ("r=xyz,s=AAAA,i=4096", ScramError::NonceNotExtended, "does not extend"),
            ("r=abc,s=AAAA,i=4096", ScramError::NonceNotExtended, "does not extend"),
            (
                "r=abcd,s=AAAA,i=999999999",
                ScramError::Iterations(999_999_999),
                "iterations",
            ),
            ("r=abcd,s=AAAA,i=0", ScramError::Iterations(0), "iterations"),
            ("r=abcd,s=AAAA,i=many", ScramError::IterationsNotNumber, "not a number"),
            ("r=abcd,s=!!,i=4096", ScramError::NotBase64("salt"), "not base64"),
            ("r=abcd,i=4096", ScramError::Missing("salt"), "no salt"),
            ("s=AAAA,i=4096", ScramError::Missing("nonce"), "no nonce"),
            ("r=abcd,s=AAAA,i=4096,m=ext", ScramError::Extension, "extension"),
        ] {
            let err = scram.client_final(msg).err().unwrap();
            assert_eq!(err, expected, "{msg}");
            assert!(err.to_string().contains(says), "{msg}: {err}");
        }
    }
}
