//! The content-addressed cache of registry blobs.
//!
//! Layout under the cache directory:
//! - `blobs/sha256/HEX`: manifests, components and signatures, each named
//!   by the digest of its bytes; checked against it on write and on read.
//! - `tags/HEX.json`: the digest a tag last resolved to (HEX is the SHA-256
//!   of the tagged reference), so a restart without the registry can run it.
//! - `signatures/HEX`: the digest of the signature blob of manifest HEX.
//!
//! Every write goes to a temp file in `tmp/`, is fsynced and renamed into
//! place, so a crash leaves either the old state or the new, never half a
//! blob. Reads refresh a blob's mtime, which orders the LRU eviction.

use super::{OciError, Reference};
use serde::{Deserialize, Serialize};
use sonde_policy::identity::Digest;
use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// A content-addressed blob store on disk, bounded in size.
#[derive(Debug)]
pub struct Cache {
    dir: PathBuf,
    max_bytes: u64,
}

/// What a tag resolved to the last time the registry was asked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TagMemo {
    /// The tagged reference, as text.
    pub reference: String,
    /// The manifest digest it resolved to.
    pub digest: String,
    /// When, in RFC 3339.
    pub resolved_at: String,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> OciError + '_ {
    move |source| OciError::Cache {
        path: path.display().to_string(),
        source,
    }
}

impl Cache {
    /// Opens (creating if needed) a cache in `dir` that evicts unused blobs
    /// beyond `max_bytes`.
    pub fn open(dir: &Path, max_bytes: u64) -> Result<Self, OciError> {
        for sub in ["blobs/sha256", "tags", "signatures", "tmp"] {
            let p = dir.join(sub);
            std::fs::create_dir_all(&p).map_err(io(&p))?;
        }
        // Temp files a crash left behind; an hour old, so that no write in
        // progress in another process is touched.
        if let Ok(entries) = std::fs::read_dir(dir.join("tmp")) {
            let stale = SystemTime::now() - std::time::Duration::from_secs(3600);
            for e in entries.flatten() {
                if e.metadata().and_then(|m| m.modified()).is_ok_and(|t| t < stale) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            max_bytes,
        })
    }

    /// The cache directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the blob `digest` lives (whether or not it is there).
    pub(crate) fn blob_path(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
        self.dir.join("blobs/sha256").join(hex)
    }

    /// The blob named `digest`, if cached and intact. A blob whose bytes no
    /// longer match its name (disk corruption, a hand edit) is deleted and
    /// reported as absent, so it is fetched again rather than run.
    pub fn get(&self, digest: &str) -> Result<Option<Vec<u8>>, OciError> {
        if Digest::parse(digest).is_err() {
            return Ok(None);
        }
        let path = self.blob_path(digest);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(&path)(e)),
        };
        let actual = Digest::of(&bytes).to_string();
        if actual != digest {
            tracing::warn!(path = %path.display(), expected = %digest, %actual, "cached blob is corrupt; removing it");
            let _ = std::fs::remove_file(&path);
            return Ok(None);
        }
        // Recency for the LRU; failing to record it is harmless.
        if let Ok(f) = std::fs::File::options().write(true).open(&path) {
            let _ = f.set_modified(SystemTime::now());
        }
        Ok(Some(bytes))
    }

    /// Stores `bytes` as blob `digest`, refusing bytes that do not hash to it.
    pub fn put(&self, digest: &str, bytes: &[u8]) -> Result<(), OciError> {
        let actual = Digest::of(bytes).to_string();
        if actual != digest {
            return Err(OciError::DigestMismatch {
                reference: self.blob_path(digest).display().to_string(),
                expected: digest.to_string(),
                actual,
            });
        }
        self.write_atomic(&self.blob_path(digest), bytes)
    }

    fn write_atomic(&self, path: &Path, bytes: &[u8]) -> Result<(), OciError> {
        let tmp_dir = self.dir.join("tmp");
        let mut tmp = tempfile::NamedTempFile::new_in(&tmp_dir).map_err(io(&tmp_dir))?;
        tmp.write_all(bytes).map_err(io(tmp.path()))?;
        tmp.as_file().sync_all().map_err(io(tmp.path()))?;
        tmp.persist(path).map_err(|e| io(path)(e.error))?;
        if let Some(parent) = path.parent()
            && let Ok(d) = std::fs::File::open(parent)
        {
            let _ = d.sync_all();
        }
        Ok(())
    }

    fn tag_path(&self, reference: &Reference) -> PathBuf {
        let key = format!(
            "{}/{}:{}",
            reference.registry(),
            reference.repository(),
            reference.tag().unwrap_or("")
        );
        self.dir
            .join("tags")
            .join(format!("{}.json", Digest::of(key.as_bytes()).hex()))
    }

    /// Records that the tag of `reference` resolved to `digest` just now.
    pub(crate) fn remember_tag(&self, reference: &Reference, digest: &str) -> Result<(), OciError> {
        let memo = TagMemo {
            reference: reference.with_tag(reference.tag().unwrap_or_default()).to_string(),
            digest: digest.to_string(),
            resolved_at: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
        };
        let text = serde_json::to_vec_pretty(&memo).unwrap_or_default();
        self.write_atomic(&self.tag_path(reference), &text)
    }

    /// What the tag of `reference` last resolved to, if it ever did here.
    pub(crate) fn recall_tag(&self, reference: &Reference) -> Result<Option<TagMemo>, OciError> {
        let path = self.tag_path(reference);
        match std::fs::read(&path) {
            Ok(b) => Ok(serde_json::from_slice::<TagMemo>(&b)
                .ok()
                .filter(|m| Digest::parse(&m.digest).is_ok())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(&path)(e)),
        }
    }

    /// Records that the signature of manifest `manifest` is blob `signature`.
    pub(crate) fn remember_signature(&self, manifest: &str, signature: &str) -> Result<(), OciError> {
        let path = self.signature_path(manifest);
        self.write_atomic(&path, signature.as_bytes())
    }

    /// The digest of the signature blob recorded for manifest `manifest`.
    pub(crate) fn recall_signature(&self, manifest: &str) -> Result<Option<String>, OciError> {
        let path = self.signature_path(manifest);
        match std::fs::read_to_string(&path) {
            Ok(s) => Ok(Some(s.trim().to_string()).filter(|d| Digest::parse(d).is_ok())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(&path)(e)),
        }
    }

    fn signature_path(&self, manifest: &str) -> PathBuf {
        self.dir
            .join("signatures")
            .join(manifest.strip_prefix("sha256:").unwrap_or(manifest))
    }

    fn blobs(&self) -> Result<Vec<(PathBuf, String, u64, SystemTime)>, OciError> {
        let dir = self.dir.join("blobs/sha256");
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(io(&dir))? {
            let entry = entry.map_err(io(&dir))?;
            let Ok(meta) = entry.metadata() else { continue };
            let digest = format!("sha256:{}", entry.file_name().to_string_lossy());
            out.push((
                entry.path(),
                digest,
                meta.len(),
                meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            ));
        }
        Ok(out)
    }

    /// The bytes the blobs take.
    pub fn size(&self) -> Result<u64, OciError> {
        Ok(self.blobs()?.iter().map(|b| b.2).sum())
    }

    /// Evicts the least recently used blobs not in `in_use` until the cache
    /// is within its limit. Returns the bytes freed. Blobs in use are never
    /// evicted, even when they alone exceed the limit.
    pub(crate) fn prune(&self, in_use: &HashSet<String>) -> Result<u64, OciError> {
        let mut blobs = self.blobs()?;
        let mut total: u64 = blobs.iter().map(|b| b.2).sum();
        if total <= self.max_bytes {
            return Ok(0);
        }
        blobs.sort_by_key(|b| b.3);
        let mut freed = 0;
        for (path, digest, size, _) in blobs {
            if total <= self.max_bytes {
                break;
            }
            if in_use.contains(&digest) {
                continue;
            }
            if std::fs::remove_file(&path).is_ok() {
                tracing::debug!(%digest, size, "evicted from the OCI cache");
                total -= size;
                freed += size;
            }
        }
        Ok(freed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_are_checked_on_write_and_on_read() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path(), 1 << 20).unwrap();
        let d = Digest::of(b"hello").to_string();
        assert!(matches!(cache.put(&d, b"hellO"), Err(OciError::DigestMismatch { .. })));
        assert_eq!(cache.get(&d).unwrap(), None);
        cache.put(&d, b"hello").unwrap();
        assert_eq!(cache.get(&d).unwrap().as_deref(), Some(&b"hello"[..]));
        std::fs::write(cache.blob_path(&d), b"hellO").unwrap();
        assert_eq!(cache.get(&d).unwrap(), None, "a corrupt blob is not served");
        assert!(!cache.blob_path(&d).exists(), "and is removed");
        assert!(std::fs::read_dir(dir.path().join("tmp")).unwrap().next().is_none());
    }

    #[test]
    fn prune_evicts_the_least_recently_used_blobs_not_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path(), 250).unwrap();
        let blobs: Vec<Vec<u8>> = (0..4u8).map(|i| vec![i; 100]).collect();
        let digests: Vec<String> = blobs.iter().map(|b| Digest::of(b).to_string()).collect();
        for (i, (d, b)) in digests.iter().zip(&blobs).enumerate() {
            cache.put(d, b).unwrap();
            let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1000 + i as u64);
            std::fs::File::options()
                .write(true)
                .open(cache.blob_path(d))
                .unwrap()
                .set_modified(t)
                .unwrap();
        }
        // 0 is the oldest but in use; 1 and 2 go, newest 3 stays.
        let in_use = HashSet::from([digests[0].clone()]);
        assert_eq!(cache.prune(&in_use).unwrap(), 200);
        let left: Vec<bool> = digests.iter().map(|d| cache.blob_path(d).exists()).collect();
        assert_eq!(left, [true, false, false, true]);
        assert_eq!(cache.size().unwrap(), 200);
    }

    #[test]
    fn tags_and_signatures_are_remembered() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path(), 1 << 20).unwrap();
        let r = Reference::parse("oci://localhost:5000/acme/pg:1.4").unwrap();
        assert_eq!(cache.recall_tag(&r).unwrap(), None);
        let d = Digest::of(b"m").to_string();
        cache.remember_tag(&r, &d).unwrap();
        let memo = Cache::open(dir.path(), 1 << 20)
            .unwrap()
            .recall_tag(&r)
            .unwrap()
            .unwrap();
        assert_eq!(
            (memo.digest.as_str(), memo.reference.as_str()),
            (d.as_str(), "oci://localhost:5000/acme/pg:1.4")
        );
        assert_eq!(cache.recall_tag(&r.with_tag("1.5")).unwrap(), None);
        let s = Digest::of(b"s").to_string();
        cache.remember_signature(&d, &s).unwrap();
        assert_eq!(cache.recall_signature(&d).unwrap(), Some(s));
    }
}
