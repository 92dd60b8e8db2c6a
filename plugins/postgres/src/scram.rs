//! SCRAM-SHA-256 (RFC 5802, RFC 7677) as PostgreSQL uses it: the client
//! side, without channel binding (the connection has no TLS).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

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

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

impl Scram {
    /// Starts an exchange with a random nonce.
    pub(crate) fn new(password: &str) -> Result<Self, String> {
        let mut raw = [0u8; 18];
        getrandom::fill(&mut raw).map_err(|e| format!("no randomness for the SCRAM nonce: {e}"))?;
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
    pub(crate) fn client_final(&self, server_first: &str) -> Result<ClientFinal, String> {
        let (mut nonce, mut salt, mut iterations) = (None, None, None);
        for attr in server_first.split(',') {
            match attr.split_once('=') {
                Some(("r", v)) => nonce = Some(v),
                Some(("s", v)) => salt = Some(v),
                Some(("i", v)) => iterations = Some(v),
                Some(("m", _)) => return Err("the server requires a SCRAM extension".into()),
                _ => {}
            }
        }
        let nonce = nonce.ok_or("no nonce in the server's SCRAM message")?;
        if !nonce.starts_with(&self.client_nonce) || nonce.len() == self.client_nonce.len() {
            return Err("the server's SCRAM nonce does not extend ours".into());
        }
        let salt = BASE64
            .decode(salt.ok_or("no salt in the server's SCRAM message")?)
            .map_err(|_| "the server's SCRAM salt is not base64")?;
        let iterations: u32 = iterations
            .ok_or("no iteration count in the server's SCRAM message")?
            .parse()
            .map_err(|_| "the server's SCRAM iteration count is not a number")?;
        if iterations == 0 || iterations > MAX_ITERATIONS {
            return Err(format!(
                "the server asks for {iterations} SCRAM iterations (at most {MAX_ITERATIONS})"
            ));
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
    pub(crate) fn verify_server(&self, server_final: &str) -> Result<(), String> {
        if let Some(e) = server_final.strip_prefix("e=") {
            return Err(format!("the server refused the SCRAM proof: {e}"));
        }
        let v = server_final
            .split(',')
            .find_map(|a| a.strip_prefix("v="))
            .ok_or("no server signature in the SCRAM final message")?;
        let v = BASE64
            .decode(v)
            .map_err(|_| "the server's SCRAM signature is not base64")?;
        if v != self.server_signature {
            return Err("the server's SCRAM signature is wrong: it does not know the password".into());
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
        assert!(fin.verify_server("v=AAAA").is_err());
        assert!(fin.verify_server("e=invalid-proof").is_err());
    }

    #[test]
    fn hostile_server_messages_are_refused() {
        let scram = Scram::with_nonce("pw", "abc");
        for (msg, expected) in [
            ("r=xyz,s=AAAA,i=4096", "does not extend"),
            ("r=abc,s=AAAA,i=4096", "does not extend"),
            ("r=abcd,s=AAAA,i=999999999", "iterations"),
            ("r=abcd,s=!!,i=4096", "not base64"),
            ("r=abcd,i=4096", "no salt"),
        ] {
            let err = scram.client_final(msg).err().unwrap();
            assert!(err.contains(expected), "{msg}: {err}");
        }
    }
}
