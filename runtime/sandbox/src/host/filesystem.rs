//! `wasi:filesystem`, filtered: a plugin sees only its read-only `files`
//! grants, each mounted at its own path.
//!
//! A plugin with no `files` grant sees one empty, read-only directory at `/`,
//! and every path operation on it (open, stat, list, create, remove…) is
//! refused with `access` and recorded as a denial. Without that directory
//! wasi-libc would fail such calls inside the guest, and the host would
//! never learn that the plugin tried.
//!
//! With a grant, every `open-at` is checked before wasmtime-wasi opens
//! anything ([`add_to_linker_guarded`]): the path is resolved beneath the
//! granted directory without following it outside (`openat2` with
//! `RESOLVE_BENEATH`) and opened `O_PATH`, which never blocks, to learn
//! its type. A path that leads outside (`..`, an absolute symlink) and a
//! FIFO, socket or device — whose opening or reading can block a host
//! thread forever — are refused with `access` and recorded as denials.
//! The open itself (on one of tokio's blocking threads) first takes a
//! pass through the engine's gate of blocking threads for plugins
//! ([`CallBounds::pass`]), so opens count with lookups against it.

use super::bounds::CallBounds;
use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};
use sonde_policy::grants::{CallGrants, Use};
use std::path::{Path, PathBuf};
use wasmtime::component::{HasData, Linker, Resource, ResourceTable, Val};
use wasmtime_wasi::filesystem::{Descriptor, Dir, WasiFilesystemView};
use wasmtime_wasi::p2::bindings::filesystem::preopens;
use wasmtime_wasi::p2::bindings::filesystem::types::{
    self as wasi_fs, DescriptorFlags, ErrorCode, HostDescriptor, OpenFlags, PathFlags,
};
use wasmtime_wasi::{FsPerms, OpenMode, WasiCtxBuilder};

/// The `wasi:filesystem/types` instance the host provides; guests built
/// against any earlier 0.2 release link to it too.
const FILESYSTEM_TYPES: &str = "wasi:filesystem/types@0.2.12";

/// The descriptor methods that take a path, plus listing a directory.
const PATH_METHODS: &[&str] = &[
    "open-at",
    "stat-at",
    "set-times-at",
    "link-at",
    "readlink-at",
    "create-directory-at",
    "remove-directory-at",
    "rename-at",
    "symlink-at",
    "unlink-file-at",
    "metadata-hash-at",
    "read-directory",
];

/// Opens the empty directory shown at `/` to plugins without a `files`
/// grant (once per process; each call shares the handle).
pub(crate) fn open_empty_dir(path: &Path) -> std::io::Result<Dir> {
    let file = std::fs::File::open(path)?;
    Ok(Dir::new(file, FsPerms::ReadOnly, OpenMode::READ, false))
}

/// Mounts each granted path read-only at the same path.
pub(crate) fn configure(builder: &mut WasiCtxBuilder, files: &[PathBuf]) -> Result<(), FilesGrantError> {
    for path in files {
        let guest = path.to_str().ok_or_else(|| FilesGrantError::NotUtf8(path.clone()))?;
        builder
            .preopened_dir(path, guest, FsPerms::ReadOnly)
            .map_err(|source| FilesGrantError::Open {
                path: path.clone(),
                source,
            })?;
    }
    Ok(())
}

/// A `files` grant that cannot be mounted for a call.
#[derive(Debug, thiserror::Error)]
pub enum FilesGrantError {
    /// WASI names paths in UTF-8.
    #[error("files grant {}: the path is not UTF-8", .0.display())]
    NotUtf8(PathBuf),
    /// Opening the directory failed.
    #[error("files grant {}: {source}", path.display())]
    Open {
        /// The granted directory.
        path: PathBuf,
        /// Why it could not be opened.
        source: wasmtime::Error,
    },
}

/// What the filesystem of a call without a `files` grant sees: the call's
/// resource table (for the empty directory's descriptor), the shared empty
/// directory, and the grants its refusals are recorded in.
pub(crate) struct EmptyView<'a> {
    /// The call's resource table.
    pub(crate) table: &'a mut ResourceTable,
    /// The empty directory shown at `/`.
    pub(crate) empty: &'a Dir,
    /// The call's grants.
    pub(crate) grants: &'a CallGrants,
}

struct Empty;

impl HasData for Empty {
    type Data<'a> = EmptyView<'a>;
}

impl preopens::Host for EmptyView<'_> {
    fn get_directories(&mut self) -> wasmtime::Result<Vec<(Resource<Descriptor>, String)>> {
        let fd = self.table.push(Descriptor::Dir(self.empty.clone()))?;
        Ok(vec![(fd, "/".to_string())])
    }
}

/// Replaces every path operation in `linker` with a denial, for the linker
/// used by calls without a `files` grant (the once-per-process phase);
/// `get` gives the view of the call in the store's data.
pub(crate) fn add_to_linker_denying<T: Send + 'static>(
    linker: &mut Linker<T>,
    get: fn(&mut T) -> EmptyView<'_>,
) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    preopens::add_to_linker::<T, Empty>(linker, get)?;
    let mut types = linker.instance(FILESYSTEM_TYPES)?;
    for method in PATH_METHODS {
        types.func_new_async(
            &format!("[method]descriptor.{method}"),
            move |mut store, _ty, params, results| {
                Box::new(async move {
                    let path = params.iter().find_map(|v| match v {
                        Val::String(s) => Some(s.as_str()),
                        _ => None,
                    });
                    // Always refused: this linker serves calls with no `files`.
                    let _ = get(store.data_mut()).grants.authorize(Use::File { method, path });
                    // The descriptor is lent for the call: the lending ends
                    // here, or the guest traps when the call returns.
                    for v in params {
                        if let Val::Resource(r) = v {
                            r.resource_drop_async(&mut store).await?;
                        }
                    }
                    if let Some(slot) = results.first_mut() {
                        *slot = Val::Result(Err(Some(Box::new(Val::Enum("access".into())))));
                    }
                    Ok(())
                })
            },
        )?;
    }
    linker.allow_shadowing(false);
    Ok(())
}

/// Why an `open-at` inside a grant is refused before anything is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The path leads outside the granted directory.
    Outside,
    /// The path names a FIFO, socket or device.
    NotAFile(&'static str),
}

impl Refusal {
    fn why(self) -> &'static str {
        match self {
            Self::Outside => "leads outside the files grant",
            Self::NotAFile(kind) => kind,
        }
    }
}

/// Checks `path` beneath the directory `dir` without blocking and without
/// leaving it: `Some` when the open must be refused. Errors other than an
/// escape (a missing file…) are left for the open itself to report.
pub(crate) fn check_open(dir: &std::fs::File, path: &str, follow: bool) -> Option<Refusal> {
    let mut flags = OFlags::PATH | OFlags::CLOEXEC;
    if !follow {
        flags |= OFlags::NOFOLLOW;
    }
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
    let fd = match rustix::fs::openat2(dir, path, flags, Mode::empty(), resolve) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::XDEV) => return Some(Refusal::Outside),
        Err(_) => return None,
    };
    let kind = match rustix::fs::fstat(&fd).map(|st| FileType::from_raw_mode(st.st_mode)) {
        Ok(FileType::Fifo) => "a FIFO",
        Ok(FileType::Socket) => "a socket",
        Ok(FileType::CharacterDevice) => "a character device",
        Ok(FileType::BlockDevice) => "a block device",
        _ => return None,
    };
    Some(Refusal::NotAFile(kind))
}

/// Puts the check of [`check_open`] in front of wasmtime-wasi's `open-at`,
/// for the linker used by calls with a `files` grant (the once-per-process
/// phase); `grants` and `bounds` find the call's grants and bounds in the
/// store's data.
pub(crate) fn add_to_linker_guarded<T: WasiFilesystemView + 'static>(
    linker: &mut Linker<T>,
    grants: fn(&T) -> &CallGrants,
    bounds: fn(&T) -> &CallBounds,
) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut types = linker.instance(FILESYSTEM_TYPES)?;
    types.func_wrap_async(
        "[method]descriptor.open-at",
        move |mut store,
              (fd, path_flags, path, oflags, flags): (
            Resource<Descriptor>,
            PathFlags,
            String,
            OpenFlags,
            DescriptorFlags,
        )| {
            Box::new(async move {
                let data = store.data_mut();
                let dir = match data.filesystem().table.get(&fd) {
                    Ok(Descriptor::Dir(d)) => Some(d.dir.clone()),
                    _ => None,
                };
                let follow = path_flags.contains(PathFlags::SYMLINK_FOLLOW);
                if let Some(refusal) = dir.and_then(|d| check_open(&d, &path, follow)) {
                    let _ = grants(data).authorize(Use::FileRefused {
                        method: "open-at",
                        path: &path,
                        why: refusal.why(),
                    });
                    return Ok((Err(ErrorCode::Access),));
                }
                let call_bounds = bounds(data).clone();
                let _thread = call_bounds.pass(call_bounds.gates().threads()).await;
                let mut view = data.filesystem();
                match HostDescriptor::open_at(&mut view, fd, path_flags, path, oflags, flags).await {
                    Ok(fd) => Ok((Ok(fd),)),
                    Err(e) => Ok((Err(wasi_fs::Host::convert_error_code(&mut view, e)?),)),
                }
            })
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_special_files_are_refused_without_blocking() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("grant");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join("file"), "x").unwrap();
        std::fs::write(tmp.path().join("secret"), "s").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("abs")).unwrap();
        std::os::unix::fs::symlink("../secret", root.join("up")).unwrap();
        std::os::unix::fs::symlink("file", root.join("inside")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            root.join("fifo"),
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let dir = std::fs::File::open(&root).unwrap();
        for ok in ["file", "inside", "missing", ".", "sub/../file"] {
            assert_eq!(check_open(&dir, ok, true), None, "{ok}");
        }
        for out in ["../secret", "up", "abs", "/etc/passwd", "../grant/../../secret"] {
            assert_eq!(check_open(&dir, out, true), Some(Refusal::Outside), "{out}");
        }
        // Not followed: the link itself is inside.
        assert_eq!(check_open(&dir, "up", false), None);
        // Opening a FIFO for reading would block until a writer comes.
        assert_eq!(check_open(&dir, "fifo", true), Some(Refusal::NotAFile("a FIFO")));
    }
}
