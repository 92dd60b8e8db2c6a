//! Loading a plugin: reading its file, compiling it (or taking it from the
//! compile cache), checking its world and imports, and pre-instantiating it.

use super::compile::{self, CompileBudget, Compiler};
use super::run::DescribeError;
use super::store::CallState;
use super::{CacheOutcome, Engine, Plugin};
use crate::bindings;
use sonde_policy::identity::{self, Digest, ReadError, WasmKind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use wasmtime::component::{Component, Linker};

/// Why a plugin could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The bytes are not WebAssembly at all.
    #[error("{plugin}: not a WebAssembly file")]
    NotWasm {
        /// The plugin's file or built-in name.
        plugin: String,
    },
    /// A core module, not a component.
    #[error(
        "{plugin}: a core WebAssembly module, not a component: build the plugin for wasm32-wasip2 (`cargo build --target wasm32-wasip2`)"
    )]
    CoreModule {
        /// The plugin's file or built-in name.
        plugin: String,
    },
    /// The component does not compile.
    #[error("{plugin}: cannot compile: {source:#}")]
    Compile {
        /// The plugin's file or built-in name.
        plugin: String,
        /// What wasmtime said.
        source: wasmtime::Error,
    },
    /// Compiling it needs more time or memory than the budget allows.
    #[error("{plugin}: refused: {what}")]
    OverBudget {
        /// The plugin's file or built-in name.
        plugin: String,
        /// Which budget it exceeded.
        what: String,
    },
    /// The component does not export `sonde:probe/plugin@0.1.0`.
    #[error(
        "{plugin}: not a sonde plugin: it must export `describe` and `check` of world sonde:probe/plugin@0.1.0 ({source:#})"
    )]
    WrongWorld {
        /// The plugin's file or built-in name.
        plugin: String,
        /// What did not match, as wasmtime said it.
        source: wasmtime::Error,
    },
    /// The component imports something the host does not provide.
    #[error("{plugin}: imports something sonde does not provide: {source:#}")]
    UnknownImport {
        /// The plugin's file or built-in name.
        plugin: String,
        /// What wasmtime said.
        source: wasmtime::Error,
    },
    /// `describe` failed.
    #[error("{plugin}: describe() failed: {source}")]
    Describe {
        /// The plugin's file or built-in name.
        plugin: String,
        /// What happened instead of an answer.
        source: DescribeError,
    },
    /// The file could not be read.
    #[error("{plugin}: {source}")]
    Read {
        /// The plugin's file.
        plugin: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The path names no regular file (`/dev/zero`, a FIFO, a directory).
    #[error("{plugin}: not a regular file ({kind}); a plugin is a .wasm file")]
    NotAFile {
        /// The plugin's path.
        plugin: String,
        /// What it names instead.
        kind: &'static str,
    },
    /// The file is larger than a plugin may be.
    #[error("{plugin}: {size} bytes, more than the {limit} bytes a plugin file may have")]
    TooLarge {
        /// The plugin's path.
        plugin: String,
        /// Its size.
        size: u64,
        /// [`identity::MAX_PLUGIN_BYTES`].
        limit: u64,
    },
}

/// Reads a plugin file ([`identity::read_plugin`]: a regular file of at
/// most [`identity::MAX_PLUGIN_BYTES`], read off the async runtime), the
/// error naming it.
pub async fn read_plugin_file(path: &std::path::Path) -> Result<Vec<u8>, LoadError> {
    let plugin = path.display().to_string();
    identity::read_plugin(path).await.map_err(|e| match e {
        ReadError::Io(source) => LoadError::Read { plugin, source },
        ReadError::NotAFile(kind) => LoadError::NotAFile { plugin, kind },
        ReadError::TooLarge { size, limit } => LoadError::TooLarge { plugin, size, limit },
    })
}

/// A plugin in the engine's map: being loaded, or loaded.
pub(super) enum Loaded {
    Loading(Arc<tokio::sync::OnceCell<Arc<Plugin>>>),
    Ready(std::sync::Weak<Plugin>),
}

impl Engine {
    /// Loads a plugin from a file (the once-per-digest phase).
    pub async fn load_file(&self, path: &std::path::Path) -> Result<Arc<Plugin>, LoadError> {
        let label = path.display().to_string();
        let bytes = read_plugin_file(path).await?;
        self.load(&label, &bytes).await
    }

    /// Loads a plugin from its bytes (the once-per-digest phase): a plugin
    /// already loaded with the same digest is shared, label included, and
    /// concurrent loads of one digest compile it once.
    pub async fn load(&self, label: &str, wasm: &[u8]) -> Result<Arc<Plugin>, LoadError> {
        let plugin = label.to_string();
        match identity::sniff(wasm) {
            WasmKind::CoreModule => return Err(LoadError::CoreModule { plugin }),
            WasmKind::Component => {}
            WasmKind::Other => return Err(LoadError::NotWasm { plugin }),
        }
        let digest = Digest::of(wasm);
        let cell = {
            let mut plugins = self.inner.plugins.lock().unwrap_or_else(|e| e.into_inner());
            // Forget the plugins nobody holds any more.
            plugins.retain(|_, l| match l {
                Loaded::Loading(_) => true,
                Loaded::Ready(p) => p.strong_count() > 0,
            });
            match plugins.get(&digest) {
                Some(Loaded::Ready(p)) => {
                    if let Some(p) = p.upgrade() {
                        // Wanted again: its cache file stays.
                        p.forgotten.store(false, Ordering::Relaxed);
                        return Ok(p);
                    }
                    None
                }
                Some(Loaded::Loading(cell)) => Some(cell.clone()),
                None => None,
            }
            .unwrap_or_else(|| {
                let cell = Arc::new(tokio::sync::OnceCell::new());
                plugins.insert(digest, Loaded::Loading(cell.clone()));
                cell
            })
        };
        let loaded = cell
            .get_or_try_init(|| self.load_new(plugin, wasm, digest))
            .await
            .cloned();
        let mut plugins = self.inner.plugins.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(Loaded::Loading(c)) = plugins.get(&digest)
            && Arc::ptr_eq(c, &cell)
        {
            match &loaded {
                Ok(p) => plugins.insert(digest, Loaded::Ready(Arc::downgrade(p))),
                Err(_) => plugins.remove(&digest),
            };
        }
        loaded
    }

    /// How many plugins the engine holds compiled code for (loaded and
    /// still used, or being loaded).
    pub fn plugins_loaded(&self) -> usize {
        let plugins = self.inner.plugins.lock().unwrap_or_else(|e| e.into_inner());
        plugins
            .values()
            .filter(|l| match l {
                Loaded::Loading(_) => true,
                Loaded::Ready(p) => p.strong_count() > 0,
            })
            .count()
    }

    /// Removes the compile-cache file of the plugin with `digest`,
    /// now, or when the last holder of the loaded plugin drops it (a run
    /// in flight): called when a stored plugin is replaced or deleted, so
    /// the cache does not keep what no one runs. A plugin of the same
    /// digest loaded again before then keeps it.
    pub fn forget(&self, digest: &Digest) {
        let live = match self.inner.plugins.lock().unwrap_or_else(|e| e.into_inner()).get(digest) {
            Some(Loaded::Loading(_)) => return,
            Some(Loaded::Ready(p)) => p.upgrade(),
            None => None,
        };
        match live {
            Some(plugin) => plugin.forgotten.store(true, Ordering::Relaxed),
            None => {
                self.inner.cache.remove(&digest.hex());
            }
        }
    }

    /// Compiles (or loads from the cache), checks, pre-instantiates and
    /// describes a plugin not loaded before.
    async fn load_new(&self, plugin: String, wasm: &[u8], digest: Digest) -> Result<Arc<Plugin>, LoadError> {
        let (component, cache) = if let Compiler::Child { program, budget } = &self.inner.compiler {
            self.compile_in_child(&plugin, program, *budget, wasm, &digest.hex())
                .await?
        } else {
            // Compiling takes long enough that it must not hold an async worker.
            let inner = self.inner.clone();
            let (wasm, digest_hex) = (wasm.to_vec(), digest.hex());
            tokio::task::spawn_blocking(move || inner.cache.load(&inner.engine, &wasm, &digest_hex))
                .await
                .map_err(|e| LoadError::Compile {
                    plugin: plugin.clone(),
                    source: wasmtime::Error::msg(e.to_string()),
                })?
                .map_err(|source| LoadError::Compile {
                    plugin: plugin.clone(),
                    source,
                })?
        };
        let engine = &self.inner.engine;
        let imports = component_imports(engine, &component);
        let prepare = |linker: &Linker<CallState>| {
            let instance_pre = linker
                .instantiate_pre(&component)
                .map_err(|source| LoadError::UnknownImport {
                    plugin: plugin.clone(),
                    source,
                })?;
            bindings::PluginPre::new(instance_pre).map_err(|source| LoadError::WrongWorld {
                plugin: plugin.clone(),
                source,
            })
        };
        let pre_closed = prepare(&self.inner.linker_closed)?;
        let pre_files = prepare(&self.inner.linker_files)?;
        let info = self.describe(&pre_closed).await.map_err(|source| LoadError::Describe {
            plugin: plugin.clone(),
            source,
        })?;
        Ok(Arc::new(Plugin {
            cache_file: self.inner.cache.entry(&digest.hex()),
            label: plugin,
            digest,
            info,
            imports,
            pre_closed,
            pre_files,
            cache,
            forgotten: AtomicBool::new(false),
        }))
    }

    /// Loads `wasm` from the cache, or compiles it in a child process
    /// under `budget` and loads what the child wrote.
    async fn compile_in_child(
        &self,
        plugin: &str,
        program: &std::path::Path,
        budget: CompileBudget,
        wasm: &[u8],
        digest: &str,
    ) -> Result<(Component, CacheOutcome), LoadError> {
        let engine = &self.inner.engine;
        let cache = &self.inner.cache;
        if let Some(component) = cache.lookup(engine, digest) {
            return Ok((component, CacheOutcome::Hit));
        }
        cache.note_miss();
        // Without a cache, the artifact goes to a private temporary
        // directory in the engine's scratch directory, removed once loaded.
        let scratch;
        let out = match cache.entry(digest) {
            Some(path) => path,
            None => {
                scratch = tempfile::Builder::new()
                    .prefix("sonde-compiled-")
                    .tempdir_in(&self.inner.scratch)
                    .map_err(|e| LoadError::Compile {
                        plugin: plugin.to_string(),
                        source: e.into(),
                    })?;
                scratch.path().join("component.cwasm")
            }
        };
        compile::in_child(plugin, program, budget, wasm, &out, &self.inner.scratch).await?;
        // SAFETY: the file was just written by this binary's compiler, in
        // the private cache directory or a private temporary one.
        #[allow(
            unsafe_code,
            reason = "deserializing the component this binary's compiler just wrote"
        )]
        let component = unsafe { Component::deserialize_file(engine, &out) }.map_err(|source| LoadError::Compile {
            plugin: plugin.to_string(),
            source,
        })?;
        Ok((component, CacheOutcome::Miss))
    }
}

fn component_imports(engine: &wasmtime::Engine, component: &Component) -> Vec<String> {
    component
        .component_type()
        .imports(engine)
        .map(|(name, _)| name.to_string())
        .collect()
}
