//! The on-disk cache of compiled components, keyed by (wasm digest, engine
//! configuration), so a second start does not recompile.
//!
//! Loading a compiled artifact runs native code from the file, so the cache
//! directory must be private: it is created mode 0700, and a directory that
//! another user owns or can write is not used.

use std::hash::{Hash, Hasher};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use wasmtime::component::Component;

/// Whether a load found its component in the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Loaded from the cache.
    Hit,
    /// Compiled (and stored, if the cache is on).
    Miss,
}

pub(crate) struct CompileCache {
    dir: Option<PathBuf>,
    engine_key: u64,
    pub(crate) hits: AtomicU64,
    pub(crate) misses: AtomicU64,
}

/// The default cache directory: `$SONDE_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/sonde`, else `$HOME/.cache/sonde`.
pub fn default_dir() -> Option<PathBuf> {
    let env = |k| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    env("SONDE_CACHE_DIR")
        .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("sonde")))
        .or_else(|| env("HOME").map(|d| d.join(".cache").join("sonde")))
}

/// Why the compile cache's directory is not used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CacheDirError {
    /// It could not be created.
    #[error("cannot create {}: {source}", .dir.display())]
    Create { dir: PathBuf, source: std::io::Error },
    /// Its metadata could not be read.
    #[error("cannot read {}: {source}", .dir.display())]
    Read { dir: PathBuf, source: std::io::Error },
    /// Nothing could be written in it.
    #[error("cannot write in {}: {source}", .dir.display())]
    Write { dir: PathBuf, source: std::io::Error },
    /// Another user owns it.
    #[error("{} belongs to another user", .dir.display())]
    NotOwned { dir: PathBuf },
    /// Others may write in it.
    #[error("{} is writable by others", .dir.display())]
    WritableByOthers { dir: PathBuf },
}

/// Creates `dir` (mode 0700) unless it exists, and checks that it is this
/// user's alone.
fn private_dir(dir: &Path) -> Result<(), CacheDirError> {
    let dir_buf = || dir.to_path_buf();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| CacheDirError::Create { dir: dir_buf(), source })?;
    let meta = std::fs::metadata(dir).map_err(|source| CacheDirError::Read { dir: dir_buf(), source })?;
    // std has no geteuid: a file we create carries our uid, so compare the
    // directory's owner with that.
    let probe = dir.join(format!(".owner-{}", std::process::id()));
    let uid = std::fs::File::create(&probe)
        .and_then(|f| f.metadata())
        .map(|m| m.uid())
        .map_err(|source| CacheDirError::Write { dir: dir_buf(), source })?;
    let _ = std::fs::remove_file(&probe);
    if meta.uid() != uid {
        return Err(CacheDirError::NotOwned { dir: dir_buf() });
    }
    if meta.permissions().mode() & 0o022 != 0 {
        return Err(CacheDirError::WritableByOthers { dir: dir_buf() });
    }
    Ok(())
}

impl CompileCache {
    pub(crate) fn new(engine: &wasmtime::Engine, dir: Option<PathBuf>) -> Self {
        let dir = dir.and_then(|d| match private_dir(&d) {
            Ok(()) => Some(d),
            Err(why) => {
                tracing::warn!(%why, "compile cache disabled");
                None
            }
        });
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        env!("CARGO_PKG_VERSION").hash(&mut hasher);
        Self {
            dir,
            engine_key: hasher.finish(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// The cache's directory, when the cache is on (private to this user).
    pub(crate) fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    fn path(&self, digest_hex: &str) -> Option<PathBuf> {
        let dir = self.dir.as_ref()?;
        Some(dir.join(format!("{digest_hex}-{:016x}.cwasm", self.engine_key)))
    }

    /// The cached component of `digest_hex`, if there is a usable one.
    pub(crate) fn lookup(&self, engine: &wasmtime::Engine, digest_hex: &str) -> Option<Component> {
        let path = self.path(digest_hex)?;
        if !path.exists() {
            return None;
        }
        // SAFETY: the file was written by this engine's compiler (here or
        // in its child) into a directory only this user can write (checked
        // by `private_dir`), under a name that binds it to the wasm digest
        // and engine config.
        #[allow(
            unsafe_code,
            reason = "deserializing a compiled component from the agent's private cache"
        )]
        match unsafe { Component::deserialize_file(engine, &path) } {
            Ok(component) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                Some(component)
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "unusable compile cache entry; recompiling");
                None
            }
        }
    }

    /// Loads the component for `wasm` from the cache, or compiles and stores it.
    pub(crate) fn load(
        &self,
        engine: &wasmtime::Engine,
        wasm: &[u8],
        digest_hex: &str,
    ) -> wasmtime::Result<(Component, CacheOutcome)> {
        if let Some(component) = self.lookup(engine, digest_hex) {
            return Ok((component, CacheOutcome::Hit));
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let component = Component::new(engine, wasm)?;
        if let Some(path) = self.path(digest_hex) {
            let written = match component.serialize() {
                Ok(bytes) => write_atomically(&path, &bytes).map_err(wasmtime::Error::from),
                Err(e) => Err(e),
            };
            if let Err(e) = written {
                tracing::warn!(path = %path.display(), error = %e, "cannot write compile cache entry");
            }
        }
        Ok((component, CacheOutcome::Miss))
    }

    /// Where a compile in a child writes its artifact: the cache entry of
    /// `digest_hex`, if the cache is on.
    pub(crate) fn entry(&self, digest_hex: &str) -> Option<PathBuf> {
        self.path(digest_hex)
    }

    /// Counts a compile done elsewhere (in a child).
    pub(crate) fn note_miss(&self) {
        self.misses.fetch_add(1, Ordering::Relaxed);
    }
}

impl CompileCache {
    /// Removes the cached artifact of `digest_hex`; whether there was one.
    pub(crate) fn remove(&self, digest_hex: &str) -> bool {
        self.path(digest_hex).is_some_and(|p| std::fs::remove_file(p).is_ok())
    }
}

/// Writes atomically: a reader sees the old file, no file, or the whole new one.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let result = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
