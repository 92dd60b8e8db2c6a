//! A real plugin signed with a fresh key pair: what the signing tests of
//! sonde-oci and of the sonde command start from.

use sonde_oci::signing::{self, PublicKey, SigningKey};
use sonde_tests::guests;
use std::path::{Path, PathBuf};

/// A temp dir with a real plugin (the always_up guest) and a key pair.
pub(crate) struct Setup {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) wasm: PathBuf,
    pub(crate) key: PathBuf,
}

impl Setup {
    pub(crate) fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let wasm = dir.path().join("plugin.wasm");
        std::fs::copy(guests::ALWAYS_UP, &wasm).unwrap();
        let key = dir.path().join("acme.key");
        signing::keygen(&key, "acme").unwrap();
        Self { dir, wasm, key }
    }

    pub(crate) fn public(&self) -> PublicKey {
        PublicKey::read(&signing::public_key_path(&self.key)).unwrap()
    }

    pub(crate) fn sign(&self) {
        sign_with(&self.key, &self.wasm);
    }
}

/// Signs `wasm` with the private key file `key`: `FILE.wasm.sigstore.json`.
pub(crate) fn sign_with(key: &Path, wasm: &Path) {
    signing::sign_file(&SigningKey::read(key).unwrap(), wasm, &std::fs::read(wasm).unwrap()).unwrap();
}

/// Flips one bit in the middle of the file at `path`.
pub(crate) fn flip_one_byte(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let i = bytes.len() / 2;
    bytes[i] ^= 0x01;
    std::fs::write(path, bytes).unwrap();
}
