//! `wasi:filesystem`, filtered: a plugin sees only its read-only `files`
//! grants, each mounted at its own path.
//!
//! A plugin with no `files` grant sees one empty, read-only directory at `/`,
//! and every path operation on it (open, stat, list, create, remove…) is
//! refused with `access` and recorded as a denial. Without that directory
//! wasi-libc would fail such calls inside the guest, and the host would
//! never learn that the plugin tried.

use super::HostState;
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

/// The preopens of a call without a `files` grant: the shared empty directory.
struct EmptyPreopen<'a> {
    table: &'a mut ResourceTable,
    empty: &'a Dir,
}

struct EmptyPreopenData;

impl HasData for EmptyPreopenData {
    type Data<'a> = EmptyPreopen<'a>;
}

impl preopens::Host for EmptyPreopen<'_> {
    fn get_directories(&mut self) -> wasmtime::Result<Vec<(Resource<Descriptor>, String)>> {
        let fd = self.table.push(Descriptor::Dir(self.empty.clone()))?;
        Ok(vec![(fd, "/".to_string())])
    }
}

/// Replaces every path operation with a denial, for the linker used by
/// calls without a `files` grant.
pub(crate) fn deny_all_in_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    preopens::add_to_linker::<HostState, EmptyPreopenData>(linker, |s| EmptyPreopen {
        table: &mut s.sandbox.table,
        empty: &s.empty_dir,
    })?;
    let mut types = linker.instance(FILESYSTEM_TYPES)?;
    for method in PATH_METHODS {
        types.func_new(
            &format!("[method]descriptor.{method}"),
            move |store, _ty, params, results| {
                let path = params.iter().find_map(|v| match v {
                    Val::String(s) => Some(s.as_str()),
                    _ => None,
                });
                let what = match path {
                    Some(p) => format!("filesystem {method} /{}: no `files` granted", p.trim_start_matches('/')),
                    None => format!("filesystem {method} /: no `files` granted"),
                };
                store.data().grants.deny(what);
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
