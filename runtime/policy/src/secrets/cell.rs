//! One secret's value and where it comes from ([`SecretCell`]), and the
//! secrets one probe is granted ([`SecretGrants`]).

use std::fmt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use zeroize::Zeroizing;

/// The shortest secret sonde accepts. A shorter one could not be scrubbed
/// from what peers answer without scrubbing ordinary text, and would be
/// cheap to guess.
pub const MIN_SECRET_BYTES: usize = 8;

/// The longest secret sonde accepts (a certificate chain and key fit).
pub(super) const MAX_SECRET_BYTES: usize = 64 * 1024;

/// A secret's bytes, held in memory only: zeroed when dropped, never
/// printed (`Debug` and `Display` show `<secret>`), never serialized.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(Zeroizing<Vec<u8>>);

impl SecretValue {
    /// The value `bytes`, checked: at least [`MIN_SECRET_BYTES`] and at most
    /// [`MAX_SECRET_BYTES`]. A trailing newline (as `echo` writes one) is
    /// not part of it.
    pub fn new(mut bytes: Vec<u8>) -> Result<Self, SecretError> {
        while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
            bytes.pop();
        }
        let bytes = Zeroizing::new(bytes);
        match bytes.len() {
            0 => Err(SecretError::Empty),
            n if n < MIN_SECRET_BYTES => Err(SecretError::TooShort(n)),
            n if n > MAX_SECRET_BYTES => Err(SecretError::TooLong(n)),
            _ => Ok(Self(bytes)),
        }
    }

    /// The bytes, for the host to put on the wire.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<secret>")
    }
}

impl fmt::Display for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<secret>")
    }
}

/// Why a secret has no usable value. The messages name files and
/// variables, never a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// The value is empty.
    #[error("the value is empty")]
    Empty,
    /// The value is shorter than [`MIN_SECRET_BYTES`].
    #[error("the value is {0} bytes; a secret must have at least {MIN_SECRET_BYTES}")]
    TooShort(usize),
    /// The value is longer than [`MAX_SECRET_BYTES`].
    #[error("the value is {0} bytes; a secret may have at most {MAX_SECRET_BYTES}")]
    TooLong(usize),
    /// The file cannot be read.
    #[error("file {path}: {why}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why (the I/O error's words).
        why: String,
    },
    /// The file may be read or written by every user.
    #[error(
        "file {path}: readable or writable by every user (mode {mode:o}); make it readable by sonde alone (chmod 600 or 640)"
    )]
    WorldAccessible {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A source outside sonde has not provided the value (yet): an
    /// environment variable not set, a Kubernetes Secret or key missing.
    #[error("{0}")]
    Unavailable(String),
}

/// Where a cell's value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    /// A file, read again when it changes.
    File(PathBuf),
    /// Given by whoever built the cell (an environment variable read at
    /// load, a Kubernetes Secret), and replaced with [`SecretCell::set`].
    Given(String),
}

/// What identifies a version of a file: a replaced or rewritten file
/// differs in one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    /// Changed by a `chmod` too, which must be seen.
    ctime: (i64, i64),
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Self {
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }
}

struct State {
    value: Result<Arc<SecretValue>, SecretError>,
    stamp: Option<Stamp>,
}

/// One named secret of one owner (a tenant, or the operator), and its
/// current value. Cells are shared: every probe granted the secret holds
/// the same cell, so a file's new content or a Secret's new key reaches
/// them all at their next run.
pub struct SecretCell {
    name: String,
    owner: Arc<str>,
    source: Source,
    state: Mutex<State>,
}

impl fmt::Debug for SecretCell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretCell")
            .field("name", &self.name)
            .field("owner", &self.owner)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl SecretCell {
    /// The secret `name` of `owner`, read from `path` now and again
    /// whenever the file changes. A file readable by every user is refused
    /// (now and at every later read).
    pub fn file(name: &str, owner: Arc<str>, path: &Path) -> Self {
        let cell = Self {
            name: name.to_string(),
            owner,
            source: Source::File(path.to_path_buf()),
            state: Mutex::new(State {
                value: Err(SecretError::Unavailable("not read yet".into())),
                stamp: None,
            }),
        };
        let _ = cell.current();
        cell
    }

    /// The secret `name` of `owner` whose value is `value`, from `source`
    /// (`env API_TOKEN`, `Secret ns/name key password`), which
    /// [`SecretCell::set`] replaces.
    pub fn given(name: &str, owner: Arc<str>, source: &str, value: Result<SecretValue, SecretError>) -> Self {
        Self {
            name: name.to_string(),
            owner,
            source: Source::Given(source.to_string()),
            state: Mutex::new(State {
                value: value.map(Arc::new),
                stamp: None,
            }),
        }
    }

    /// The secret's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Who owns it: a tenant's id, or empty for the operator.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Where it comes from, as a message names it (`file /run/x`,
    /// `env API_TOKEN`).
    pub fn source(&self) -> String {
        match &self.source {
            Source::File(p) => format!("file {}", p.display()),
            Source::Given(s) => s.clone(),
        }
    }

    /// The file it is read from, if it is a file's.
    pub fn path(&self) -> Option<&Path> {
        match &self.source {
            Source::File(p) => Some(p),
            Source::Given(_) => None,
        }
    }

    /// Replaces a given value (a Kubernetes Secret changed or went away).
    pub fn set(&self, value: Result<SecretValue, SecretError>) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.value = value.map(Arc::new);
    }

    /// The current value. A file is checked (one `stat`) and read again
    /// when it changed since the last read.
    pub fn current(&self) -> Result<Arc<SecretValue>, SecretError> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Source::File(path) = &self.source {
            let read_err = |e: std::io::Error| SecretError::Read {
                path: path.clone(),
                why: e.to_string(),
            };
            match std::fs::metadata(path) {
                Err(e) => {
                    state.value = Err(read_err(e));
                    state.stamp = None;
                }
                Ok(meta) => {
                    let stamp = Stamp::of(&meta);
                    if state.stamp != Some(stamp) {
                        state.value = read_file(path, &meta).map(Arc::new);
                        state.stamp = Some(stamp);
                    }
                }
            }
        }
        state.value.clone()
    }
}

/// Reads a secret file whose metadata is `meta`, refusing one every user
/// may read or write.
fn read_file(path: &Path, meta: &std::fs::Metadata) -> Result<SecretValue, SecretError> {
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o006 != 0 {
        return Err(SecretError::WorldAccessible {
            path: path.to_path_buf(),
            mode,
        });
    }
    let read_err = |e: std::io::Error| SecretError::Read {
        path: path.to_path_buf(),
        why: e.to_string(),
    };
    // At most one byte more than a value may have (and a newline): a file
    // that grows between the `stat` and the read is still read to a bound.
    let limit = MAX_SECRET_BYTES as u64 + 3;
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(std::fs::File::open(path).map_err(read_err)?, limit),
        &mut bytes,
    )
    .map_err(read_err)?;
    SecretValue::new(bytes)
}

/// Whether `name` may name a secret: 1 to 63 of `a-z`, `0-9`, `-`, `_`
/// and `.`, starting with a letter or digit.
pub fn valid_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.'))
}

/// The secrets a probe is granted (`grants.secrets`), each its owner's
/// cell, and the scrubber of their current values, built once and shared
/// by every call of the probe until a value changes. Two grants are equal
/// when they name the same cells.
#[derive(Clone, Debug, Default)]
pub struct SecretGrants(Vec<Arc<SecretCell>>, Arc<Mutex<ScrubberCache>>);

/// The scrubber of the values it was built from, and the values burned
/// ([`SecretGrants::burn`]).
#[derive(Default)]
struct ScrubberCache(
    Option<(Vec<Arc<SecretValue>>, Arc<crate::secrets::scrub::Scrubber>)>,
    Vec<Arc<SecretValue>>,
);

impl fmt::Debug for ScrubberCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ScrubberCache")
    }
}

impl SecretGrants {
    /// The grants of `cells`.
    pub fn new(cells: Vec<Arc<SecretCell>>) -> Self {
        Self(cells, Arc::default())
    }

    /// The scrubber of the granted secrets' current values (those that
    /// have one), rebuilt only when a value changed.
    pub fn scrubber(&self) -> Arc<crate::secrets::scrub::Scrubber> {
        let values = self.values();
        let mut cache = self.1.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((built_from, scrubber)) = &cache.0
            && built_from.len() == values.len()
            && built_from.iter().zip(&values).all(|(a, b)| Arc::ptr_eq(a, b))
        {
            return scrubber.clone();
        }
        let scrubber = Arc::new(crate::secrets::scrub::Scrubber::new(values.iter().map(|v| v.expose())));
        cache.0 = Some((values, scrubber.clone()));
        scrubber
    }

    /// Refuses the granted secrets' current values to the probe from now
    /// on, until each changes: part of a reflection of one reached its
    /// plugin (a peer paused in the middle of it;
    /// [`crate::secrets::scrub::Passed::spilled`]).
    pub fn burn(&self) {
        let values = self.values();
        let mut cache = self.1.lock().unwrap_or_else(|e| e.into_inner());
        cache.1 = values;
    }

    /// Whether `value` was burned ([`SecretGrants::burn`]).
    pub fn is_burned(&self, value: &Arc<SecretValue>) -> bool {
        let cache = self.1.lock().unwrap_or_else(|e| e.into_inner());
        cache.1.iter().any(|b| Arc::ptr_eq(b, value))
    }

    /// The current values of the granted secrets that have one.
    pub fn values(&self) -> Vec<Arc<SecretValue>> {
        self.0.iter().filter_map(|c| c.current().ok()).collect()
    }

    /// Whether no secret is granted.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The granted cell named `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<SecretCell>> {
        self.0.iter().find(|c| c.name == name)
    }

    /// Every granted cell.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<SecretCell>> {
        self.0.iter()
    }

    /// The names granted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|c| c.name.as_str())
    }
}

impl PartialEq for SecretGrants {
    fn eq(&self, o: &Self) -> bool {
        self.0.len() == o.0.len() && self.0.iter().zip(&o.0).all(|(a, b)| Arc::ptr_eq(a, b))
    }
}

impl Eq for SecretGrants {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_never_prints_and_is_checked() {
        let v = SecretValue::new(b"hunter2-hunter2\n".to_vec()).unwrap();
        assert_eq!(v.expose(), b"hunter2-hunter2");
        assert_eq!(format!("{v:?} {v}"), "<secret> <secret>");
        assert_eq!(SecretValue::new(b"\n".to_vec()), Err(SecretError::Empty));
        assert_eq!(SecretValue::new(b"short".to_vec()), Err(SecretError::TooShort(5)));
        assert!(SecretValue::new(vec![b'x'; MAX_SECRET_BYTES + 1]).is_err());
    }

    #[test]
    fn a_file_is_read_again_when_it_changes_and_refused_when_every_user_may_read_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        std::fs::write(&path, "first-secret").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let cell = SecretCell::file("pw", Arc::from("a"), &path);
        assert_eq!(cell.current().unwrap().expose(), b"first-secret");
        std::fs::write(&path, "second-secret-longer").unwrap();
        assert_eq!(cell.current().unwrap().expose(), b"second-secret-longer");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = cell.current().unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "file {}: readable or writable by every user (mode 644); make it readable by sonde alone (chmod 600 or 640)",
                path.display()
            )
        );
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(cell.current(), Err(SecretError::Read { .. })));
        assert_eq!(cell.source(), format!("file {}", path.display()));
    }

    #[test]
    fn names_are_plain() {
        assert!(valid_name("db-password"));
        assert!(valid_name("a.b_c-1"));
        assert!(!valid_name(""));
        assert!(!valid_name("-x"));
        assert!(!valid_name("DB"));
        assert!(!valid_name("a)b"));
        assert!(!valid_name(&"a".repeat(64)));
    }
}
