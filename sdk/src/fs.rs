//! Files, the same with or without `std`: their metadata and contents.
//!
//! A plugin sees the host's files only through the probe's read-only
//! `files` grants, each mounted at its own path. With `std` this is
//! `std::fs`; without it the SDK asks the directory the host opened for
//! the grant that covers the path. Either way a path no grant covers does
//! not exist for the plugin, and a call without any `files` grant is
//! refused by the host (the run is reported `denied`).

use alloc::string::String;
#[cfg(any(feature = "std", not(target_arch = "wasm32")))]
use alloc::string::ToString;
use core::fmt;
use core::time::Duration;

/// What kind of file a path names (symlinks followed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// Anything else: a device, FIFO or socket.
    Other,
}

/// What [`metadata`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Metadata {
    /// The kind of file.
    pub kind: FileKind,
    /// Its size in bytes.
    pub size: u64,
    /// When its data was last modified, since the Unix epoch, where the
    /// filesystem keeps it.
    pub modified: Option<Duration>,
}

/// Why [`metadata`] or [`read_to_string`] failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsErrorKind {
    /// No such file, or no `files` grant covers the path.
    NotFound,
    /// The host refused: the probe has no `files` grant, or the file is
    /// not readable.
    Denied,
    /// Anything else.
    Other,
}

/// A failed file operation: its kind, and the system's words for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FsError {
    /// What went wrong.
    pub kind: FsErrorKind,
    /// The system's description (`No such file or directory`).
    pub message: String,
}

impl fmt::Display for FsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// The metadata of the file at absolute `path`, symlinks followed.
pub fn metadata(path: &str) -> Result<Metadata, FsError> {
    #[cfg(all(not(feature = "std"), target_arch = "wasm32"))]
    {
        use wasip2::filesystem::types::DescriptorType;
        let stat = grant_dirs::stat(path)?;
        Ok(Metadata {
            kind: match stat.type_ {
                DescriptorType::RegularFile => FileKind::File,
                DescriptorType::Directory => FileKind::Directory,
                _ => FileKind::Other,
            },
            size: stat.size,
            modified: stat
                .data_modification_timestamp
                .map(|t| Duration::new(t.seconds, t.nanoseconds)),
        })
    }
    #[cfg(any(feature = "std", not(target_arch = "wasm32")))]
    {
        let meta = std::fs::metadata(path).map_err(from_io)?;
        let kind = if meta.is_file() {
            FileKind::File
        } else if meta.is_dir() {
            FileKind::Directory
        } else {
            FileKind::Other
        };
        Ok(Metadata {
            kind,
            size: meta.len(),
            modified: meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()),
        })
    }
}

/// The contents of the file at absolute `path`, as UTF-8 text.
pub fn read_to_string(path: &str) -> Result<String, FsError> {
    #[cfg(all(not(feature = "std"), target_arch = "wasm32"))]
    let bytes = grant_dirs::read(path)?;
    #[cfg(any(feature = "std", not(target_arch = "wasm32")))]
    let bytes = std::fs::read(path).map_err(from_io)?;
    String::from_utf8(bytes).map_err(|_| FsError {
        kind: FsErrorKind::Other,
        message: String::from("stream did not contain valid UTF-8"),
    })
}

#[cfg(any(feature = "std", not(target_arch = "wasm32")))]
fn from_io(e: std::io::Error) -> FsError {
    use std::io::ErrorKind;
    FsError {
        kind: match e.kind() {
            ErrorKind::NotFound => FsErrorKind::NotFound,
            ErrorKind::PermissionDenied => FsErrorKind::Denied,
            _ => FsErrorKind::Other,
        },
        message: e.to_string(),
    }
}

/// `path` below `root`, relative, when `root` is `path` or one of its
/// ancestors: how a path is matched to the `files` grant covering it.
#[cfg(any(test, all(not(feature = "std"), target_arch = "wasm32")))]
fn within<'a>(path: &'a str, root: &str) -> Option<&'a str> {
    let root = root.trim_end_matches('/');
    let rest = path.strip_prefix(root)?;
    if rest.is_empty() {
        return Some(rest);
    }
    let rest = rest.strip_prefix('/')?;
    Some(rest.trim_start_matches('/'))
}

/// The files of the `files` grants without std: through the directories
/// the host opened for them (wasi-libc's preopens), in std's words.
#[cfg(all(not(feature = "std"), target_arch = "wasm32"))]
mod grant_dirs {
    use super::{FsError, FsErrorKind, within};
    use alloc::string::String;
    use alloc::vec::Vec;
    use wasip2::filesystem::preopens::get_directories;
    use wasip2::filesystem::types::{Descriptor, DescriptorFlags, DescriptorStat, ErrorCode, OpenFlags, PathFlags};

    /// A failed file operation without std, in the words std would use: no
    /// covering grant (`None`) reads as no such file, as with wasi-libc.
    fn fs_error(code: Option<ErrorCode>) -> FsError {
        let (kind, message) = match code {
            None | Some(ErrorCode::NoEntry) => (FsErrorKind::NotFound, "No such file or directory"),
            Some(ErrorCode::Access | ErrorCode::NotPermitted) => (FsErrorKind::Denied, "Permission denied"),
            Some(ErrorCode::IsDirectory) => (FsErrorKind::Other, "Is a directory"),
            Some(ErrorCode::NotDirectory) => (FsErrorKind::Other, "Not a directory"),
            Some(e) => (FsErrorKind::Other, e.name()),
        };
        FsError {
            kind,
            message: String::from(message),
        }
    }

    /// The directory the host opened for the `files` grant that covers
    /// absolute `path` (the deepest), and `path` relative to it (`.` for the
    /// directory itself).
    fn covering(path: &str) -> Result<(Descriptor, &str), FsError> {
        let (dir, rest) = get_directories()
            .into_iter()
            .filter_map(|(dir, root)| within(path, &root).map(|rest| (dir, rest)))
            .min_by_key(|(_, rest)| rest.len())
            .ok_or_else(|| fs_error(None))?;
        Ok((dir, if rest.is_empty() { "." } else { rest }))
    }

    /// The status of the file at absolute `path`, symlinks followed, through
    /// the directory of the `files` grant that covers it.
    pub(super) fn stat(path: &str) -> Result<DescriptorStat, FsError> {
        let (dir, rel) = covering(path)?;
        dir.stat_at(PathFlags::SYMLINK_FOLLOW, rel)
            .map_err(|e| fs_error(Some(e)))
    }

    /// Reads the file at absolute `path`, through the directory of the `files`
    /// grant that covers it.
    pub(super) fn read(path: &str) -> Result<Vec<u8>, FsError> {
        let failed = |e: ErrorCode| fs_error(Some(e));
        let (dir, rel) = covering(path)?;
        let file = dir
            .open_at(
                PathFlags::SYMLINK_FOLLOW,
                rel,
                OpenFlags::empty(),
                DescriptorFlags::READ,
            )
            .map_err(failed)?;
        let mut bytes = Vec::new();
        loop {
            let (chunk, end) = file.read(64 * 1024, bytes.len() as u64).map_err(failed)?;
            bytes.extend_from_slice(&chunk);
            if end || chunk.is_empty() {
                return Ok(bytes);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::format;

    #[test]
    fn reads_a_file_a_directory_and_a_missing_path() {
        let dir = std::env::temp_dir();
        let path = dir.join(format!("sonde-sdk-fs-{}", std::process::id()));
        std::fs::write(&path, "12345").unwrap();
        let meta = metadata(path.to_str().unwrap()).unwrap();
        assert_eq!((meta.kind, meta.size), (FileKind::File, 5));
        let age = crate::time::since_unix_epoch().saturating_sub(meta.modified.unwrap());
        assert!(age < Duration::from_secs(60), "{age:?}");
        std::fs::remove_file(&path).unwrap();

        assert_eq!(metadata(dir.to_str().unwrap()).unwrap().kind, FileKind::Directory);
        let err = metadata(path.to_str().unwrap()).unwrap_err();
        assert_eq!(err.kind, FsErrorKind::NotFound, "{err}");
        let err = read_to_string(path.to_str().unwrap()).unwrap_err();
        assert_eq!(err.kind, FsErrorKind::NotFound, "{err}");
    }

    #[test]
    fn reads_text_and_refuses_what_is_not_utf8() {
        let path = std::env::temp_dir().join(format!("sonde-sdk-read-{}", std::process::id()));
        std::fs::write(&path, "pem").unwrap();
        assert_eq!(read_to_string(path.to_str().unwrap()).unwrap(), "pem");
        std::fs::write(&path, [0xff, 0xfe]).unwrap();
        let err = read_to_string(path.to_str().unwrap()).unwrap_err();
        assert_eq!(err.kind, FsErrorKind::Other, "{err}");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_grant_covers_its_directory_and_what_is_below_only() {
        assert_eq!(within("/etc/app/ca.pem", "/etc/app"), Some("ca.pem"));
        assert_eq!(within("/etc/app/ca.pem", "/etc/app/"), Some("ca.pem"));
        assert_eq!(within("/etc/app//x/y", "/etc/app"), Some("x/y"));
        assert_eq!(within("/etc/app", "/etc/app"), Some(""));
        assert_eq!(within("/anything", "/"), Some("anything"));
        // A sibling that shares the prefix is not below it.
        assert_eq!(within("/etc/apparmor/x", "/etc/app"), None);
        assert_eq!(within("/etc", "/etc/app"), None);
        // `..` is left for the host, which resolves beneath the grant.
        assert_eq!(within("/etc/app/../shadow", "/etc/app"), Some("../shadow"));
    }
}
