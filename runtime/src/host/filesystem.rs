//! `wasi:filesystem`, filtered: a plugin sees only its read-only `files`
//! grants, each mounted at its own path.
//!
//! A plugin with no `files` grant sees one empty, read-only directory at `/`,
//! and every path operation on it (open, stat, list, create, remove…) is
//! refused with `access` and recorded as a denial. Without that directory
//! wasi-libc would fail such calls inside the guest, and the host would
//! never learn that the plugin tried.

use super::grants::{CallGrants, Use};
use std::path::{Path, PathBuf};
use wasmtime::component::{HasData, Linker, Resource, ResourceTable, Val};
use wasmtime_wasi::filesystem::{Descriptor, Dir};
use wasmtime_wasi::p2::bindings::filesystem::preopens;
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
pub(crate) fn configure(builder: &mut WasiCtxBuilder, files: &[PathBuf]) -> Result<(), String> {
    for path in files {
        let guest = path
            .to_str()
            .ok_or_else(|| format!("files grant {}: the path is not UTF-8", path.display()))?;
        builder
            .preopened_dir(path, guest, FsPerms::ReadOnly)
            .map_err(|e| format!("files grant {}: {e}", path.display()))?;
    }
    Ok(())
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
        types.func_new(
            &format!("[method]descriptor.{method}"),
            move |mut store, _ty, params, results| {
                let path = params.iter().find_map(|v| match v {
                    Val::String(s) => Some(s.as_str()),
                    _ => None,
                });
                // Always refused: this linker serves calls with no `files`.
                let _ = get(store.data_mut()).grants.authorize(Use::File { method, path });
                if let Some(slot) = results.first_mut() {
                    *slot = Val::Result(Err(Some(Box::new(Val::Enum("access".into())))));
                }
                Ok(())
            },
        )?;
    }
    linker.allow_shadowing(false);
    Ok(())
}
