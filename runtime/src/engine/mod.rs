//! The executor: runs one plugin call in a fresh sandbox under a deadline, a
//! fuel budget and a memory cap, and turns whatever happened into a
//! [`RunResult`].
//!
//! Lifecycle, as the types encode it:
//! - [`Engine::new`] — once per engine (one per agent; a process may hold
//!   several, each with its own [`EngineConfig`] and host bounds): the
//!   wasmtime engine (pooling allocator, fuel, epoch interruption driven by
//!   a ticker thread that sleeps while no call runs), the linker with every
//!   host capability, and the compile cache.
//! - [`Engine::load`] — once per plugin digest: compile (or load from the
//!   cache), check the plugin's world and imports, pre-instantiate, and call
//!   `describe`.
//! - [`Engine::run`] — once per call: a new `Store` with its limits, a fresh
//!   instance, `check`, and the store dropped.

pub mod cache;
pub mod compile;
pub mod limits;
mod store;

pub use cache::CacheOutcome;
pub use compile::{CompileBudget, Compiler};
pub use limits::Limits;

use crate::bindings::{self, sonde::probe::types as wit};
use crate::host::grants::CallGrants;
use crate::host::{self, Grants, NetPattern};
use crate::verdict::{Metric, Reason, RunResult, Status, plugin_text, truncate};
use limits::{MAX_DETAIL_BYTES, MAX_MESSAGE_BYTES, MAX_METRIC_NAME_BYTES, MAX_METRICS};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use store::CallState;
use tokio::sync::Semaphore;
use wasmtime::component::{Component, Linker};
use wasmtime::{Store, Trap, UpdateDeadline};
use wasmtime_wasi::filesystem::Dir;

/// How often the epoch ticks. A running plugin yields to the async executor
/// at every tick, so a spinning plugin holds a worker thread for at most
/// this long at a time.
pub const EPOCH_TICK: Duration = Duration::from_millis(1);

/// An engine's settings, fixed when it is built but for its host bounds
/// ([`Engine::set_host_limits`]).
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Where compiled components are cached; `None` disables the cache.
    pub cache_dir: Option<PathBuf>,
    /// How many calls may run at once; the pooling allocator reserves this
    /// many instance slots. Further calls wait for a slot.
    pub max_concurrent_calls: u32,
    /// Where components are compiled: in this process, or in a child
    /// under a time and memory budget (what the `sonde` binary uses).
    pub compiler: Compiler,
    /// Bytes of each linear memory the pooling allocator keeps resident
    /// between calls, reset with `memset` (the dirty pages found with
    /// `PAGEMAP_SCAN` where the kernel has it) rather than `madvise`.
    pub memory_keep_resident: usize,
    /// What a plugin's call may make the host hold (the config's
    /// `sandbox:` block): this engine's own, handed to each call's store;
    /// [`Engine::set_host_limits`] changes them for later calls.
    pub host_limits: host::bounds::HostLimits,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            cache_dir: cache::default_dir(),
            max_concurrent_calls: 256,
            compiler: Compiler::InProcess,
            memory_keep_resident: KEEP_RESIDENT,
            host_limits: host::bounds::HostLimits::default(),
        }
    }
}

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
        "{plugin}: not a sonde plugin: it must export `describe` and `check` of world sonde:probe/plugin@0.1.0 ({detail})"
    )]
    WrongWorld {
        /// The plugin's file or built-in name.
        plugin: String,
        /// What did not match.
        detail: String,
    },
    /// The component imports something the host does not provide.
    #[error("{plugin}: imports something sonde does not provide: {detail}")]
    UnknownImport {
        /// The plugin's file or built-in name.
        plugin: String,
        /// What wasmtime said.
        detail: String,
    },
    /// `describe` failed.
    #[error("{plugin}: describe() failed: {detail}")]
    Describe {
        /// The plugin's file or built-in name.
        plugin: String,
        /// The run's message.
        detail: String,
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
        /// [`MAX_PLUGIN_FILE_BYTES`].
        limit: u64,
    },
}

/// The largest plugin file sonde reads (from the config, the command line
/// or an upload): far above any real component (the built-ins are a few
/// hundred KiB), far below what would hurt the agent to hold.
pub const MAX_PLUGIN_FILE_BYTES: u64 = 32 * 1024 * 1024;

/// Reads the regular file at `path`, at most `limit` bytes: opened without
/// blocking (a FIFO would wait for a writer), refused unless it is a
/// regular file, and refused when larger than `limit` (checked before
/// reading, and again while reading, should it grow).
pub fn read_regular(path: &std::path::Path, limit: u64) -> Result<Vec<u8>, ReadError> {
    use rustix::fs::{FileType, Mode, OFlags};
    use std::io::Read;
    let fd = rustix::fs::open(path, OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| ReadError::Io(e.into()))?;
    let stat = rustix::fs::fstat(&fd).map_err(|e| ReadError::Io(e.into()))?;
    let kind = match FileType::from_raw_mode(stat.st_mode) {
        FileType::RegularFile => None,
        FileType::Directory => Some("a directory"),
        FileType::Fifo => Some("a FIFO"),
        FileType::Socket => Some("a socket"),
        FileType::CharacterDevice => Some("a character device"),
        FileType::BlockDevice => Some("a block device"),
        _ => Some("not a file"),
    };
    if let Some(kind) = kind {
        return Err(ReadError::NotAFile(kind));
    }
    let size = u64::try_from(stat.st_size).unwrap_or(0);
    if size > limit {
        return Err(ReadError::TooLarge(size));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    std::fs::File::from(fd)
        .take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(ReadError::Io)?;
    if bytes.len() as u64 > limit {
        return Err(ReadError::TooLarge(bytes.len() as u64));
    }
    Ok(bytes)
}

/// Why [`read_regular`] refused a file.
#[derive(Debug)]
pub enum ReadError {
    /// It could not be opened or read.
    Io(std::io::Error),
    /// It is not a regular file: what it is.
    NotAFile(&'static str),
    /// It is larger than the limit: its size.
    TooLarge(u64),
}

/// Reads a plugin file ([`read_regular`] under [`MAX_PLUGIN_FILE_BYTES`]),
/// the error naming it.
pub fn read_plugin_file(path: &std::path::Path) -> Result<Vec<u8>, LoadError> {
    let plugin = path.display().to_string();
    read_regular(path, MAX_PLUGIN_FILE_BYTES).map_err(|e| match e {
        ReadError::Io(source) => LoadError::Read { plugin, source },
        ReadError::NotAFile(kind) => LoadError::NotAFile { plugin, kind },
        ReadError::TooLarge(size) => LoadError::TooLarge {
            plugin,
            size,
            limit: MAX_PLUGIN_FILE_BYTES,
        },
    })
}

/// What the engine could not set up.
#[derive(Debug, thiserror::Error)]
#[error("cannot set up the wasm engine: {0:#}")]
pub struct EngineError(wasmtime::Error);

/// The kinds of capability a plugin may ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CapabilityKind {
    /// Connections beyond the target.
    Net,
    /// Programs the host runs for the plugin.
    Exec,
    /// Read-only paths.
    Files,
}

impl CapabilityKind {
    /// The lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Net => "net",
            Self::Exec => "exec",
            Self::Files => "files",
        }
    }
}

/// A capability a plugin asks for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Capability {
    /// Its kind.
    pub kind: CapabilityKind,
    /// The pattern it needs.
    pub value: String,
    /// Why.
    pub why: String,
}

/// What a plugin's `describe` said.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PluginInfo {
    /// Its name.
    pub name: String,
    /// Its version.
    pub version: String,
    /// Who ships it.
    pub vendor: String,
    /// What it checks.
    pub description: String,
    /// JSON Schema for its config.
    pub config_schema: Option<String>,
    /// What it asks to be granted.
    pub capabilities: Vec<Capability>,
}

impl From<wit::PluginInfo> for PluginInfo {
    fn from(i: wit::PluginInfo) -> Self {
        Self {
            name: plugin_text(i.name, 128),
            version: plugin_text(i.version, 64),
            vendor: plugin_text(i.vendor, 128),
            description: plugin_text(i.description, 4096),
            config_schema: i.config_schema.map(|s| truncate(s, 64 * 1024)),
            capabilities: i
                .capabilities
                .into_iter()
                .take(64)
                .map(|c| Capability {
                    kind: match c.kind {
                        wit::CapabilityKind::Net => CapabilityKind::Net,
                        wit::CapabilityKind::Exec => CapabilityKind::Exec,
                        wit::CapabilityKind::Files => CapabilityKind::Files,
                    },
                    value: plugin_text(c.value, 256),
                    why: plugin_text(c.why, 1024),
                })
                .collect(),
        }
    }
}

/// What the engine's instance pool holds at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Linear memories calls use now.
    pub memories_in_use: u64,
    /// Memory slots calls have used that are idle now, keeping pages
    /// resident for the next call.
    pub idle_memories: u64,
    /// The bytes those idle slots keep resident.
    pub idle_bytes_resident: u64,
}

/// A loaded plugin: compiled, checked and pre-instantiated. Cheap to share.
pub struct Plugin {
    label: String,
    digest: String,
    info: PluginInfo,
    imports: Vec<String>,
    /// Pre-instantiated against the linker for calls without a `files` grant.
    pre_closed: bindings::PluginPre<CallState>,
    /// Pre-instantiated against the linker for calls with a `files` grant.
    pre_files: bindings::PluginPre<CallState>,
    cache: CacheOutcome,
    /// Its compile-cache file, removed when the plugin is dropped if it
    /// was forgotten ([`Engine::forget`]) while still in use.
    cache_file: Option<PathBuf>,
    forgotten: AtomicBool,
}

impl Drop for Plugin {
    fn drop(&mut self) {
        if self.forgotten.load(Ordering::Relaxed)
            && let Some(file) = &self.cache_file
        {
            let _ = std::fs::remove_file(file);
        }
    }
}

impl Plugin {
    /// The file path or built-in name it was loaded from.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The SHA-256 of its bytes, in hex.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// What its `describe` said.
    pub fn info(&self) -> &PluginInfo {
        &self.info
    }

    /// The names of the interfaces and functions it imports.
    pub fn imports(&self) -> &[String] {
        &self.imports
    }

    /// Whether it came from the compile cache.
    pub fn cache_outcome(&self) -> CacheOutcome {
        self.cache
    }
}

/// One call of a plugin's `check`.
#[derive(Clone, Debug)]
pub struct Call<'a> {
    /// The probe's name (for logs, and passed to the plugin).
    pub probe: &'a str,
    /// The target passed to the plugin and granted to it; empty for none.
    pub target: &'a str,
    /// The plugin config as JSON text.
    pub config: &'a str,
    /// Deadline, fuel and memory.
    pub limits: Limits,
    /// What the plugin may reach besides its target; shared, not copied,
    /// by each call.
    pub grants: &'a Arc<Grants>,
    /// 1 for the first attempt in a period.
    pub attempt: u32,
}

struct Inner {
    engine: wasmtime::Engine,
    /// For calls without a `files` grant: path operations are denials.
    linker_closed: Linker<CallState>,
    /// For calls with a `files` grant: the granted paths, read-only.
    linker_files: Linker<CallState>,
    /// The empty directory a plugin without `files` grant sees at `/`.
    empty_dir: Dir,
    cache: cache::CompileCache,
    compiler: Compiler,
    /// Plugins by digest: being loaded (a cell filled once even when
    /// several loads of one digest race), or loaded and held by someone
    /// (the registry, a call). The engine itself holds a loaded plugin
    /// weakly, so its compiled code is freed once nothing uses it.
    plugins: Mutex<HashMap<String, Loaded>>,
    slots: Semaphore,
    /// The TLS client and keep-alive pool every call shares.
    host: Arc<host::Shared>,
    ticker: Arc<Ticker>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.ticker.stop();
    }
}

/// A plugin in the engine's map: being loaded, or loaded.
enum Loaded {
    Loading(Arc<tokio::sync::OnceCell<Arc<Plugin>>>),
    Ready(std::sync::Weak<Plugin>),
}

/// What drives the epoch: a thread that ticks every [`EPOCH_TICK`] while
/// wasm may be running, and once no call has run for
/// [`TICKS_BEFORE_SLEEP`] ticks sleeps on a condition variable until one
/// starts, so an idle agent does not wake a thousand times a second.
#[derive(Default)]
struct Ticker {
    /// Calls (and describes) in flight.
    active: std::sync::atomic::AtomicUsize,
    /// The thread waits (or is about to) on `wake`.
    sleeping: AtomicBool,
    stopped: AtomicBool,
    lock: Mutex<()>,
    wake: std::sync::Condvar,
}

impl Ticker {
    fn run(&self, engine: &wasmtime::Engine) {
        let mut idle_ticks = 0;
        while !self.stopped.load(Ordering::Relaxed) {
            if self.active.load(Ordering::SeqCst) > 0 {
                idle_ticks = 0;
            } else if idle_ticks < TICKS_BEFORE_SLEEP {
                idle_ticks += 1;
            } else {
                // Idle for a while: sleep until a call starts. Under load
                // calls follow each other closely and this never happens,
                // so starting a call rarely has to wake the thread.
                idle_ticks = 0;
                let guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
                // Set before `active` is checked again: a call that starts
                // after the check sees it and wakes the thread.
                self.sleeping.store(true, Ordering::SeqCst);
                let _guard = self
                    .wake
                    .wait_while(guard, |_| {
                        self.active.load(Ordering::SeqCst) == 0 && !self.stopped.load(Ordering::SeqCst)
                    })
                    .unwrap_or_else(|e| e.into_inner());
                self.sleeping.store(false, Ordering::SeqCst);
                continue;
            }
            std::thread::sleep(EPOCH_TICK);
            engine.increment_epoch();
        }
    }

    /// Marks a call in flight until the guard is dropped, waking the
    /// thread if it was idle.
    fn busy(self: &Arc<Self>) -> TickerGuard {
        self.active.fetch_add(1, Ordering::SeqCst);
        // Only a sleeping thread needs the (system-call) wake-up; the lock
        // makes sure it is waiting, not between its check and its wait.
        if self.sleeping.load(Ordering::SeqCst) {
            let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.wake.notify_one();
        }
        TickerGuard(self.clone())
    }

    fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.wake.notify_one();
    }
}

/// Ticks with no call in flight before the ticker sleeps.
const TICKS_BEFORE_SLEEP: u32 = 50;

/// A call in flight, for the [`Ticker`].
struct TickerGuard(Arc<Ticker>);

impl Drop for TickerGuard {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The sandboxed executor; clones share it. Engines in one process share
/// nothing of their configuration: each enforces its own bounds.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

fn wasmtime_config(max_calls: u32, keep_resident: usize) -> wasmtime::Config {
    let mut pool = wasmtime::PoolingAllocationConfig::new();
    // A Rust wasip2 component has a few core instances (the program and
    // wit-component's shims), one memory and a few tables.
    pool.total_component_instances(max_calls)
        .total_core_instances(max_calls * 8)
        .max_core_instances_per_component(16)
        .total_memories(max_calls * 2)
        .max_memories_per_component(2)
        .total_tables(max_calls * 8)
        .max_tables_per_component(8)
        .total_stacks(max_calls)
        .max_memory_size(limits::MAX_MEMORY as usize)
        // A call touches few pages; resetting just those with memset (found
        // with PAGEMAP_SCAN where the kernel has it) is cheaper than
        // madvise plus a page fault per page on the next call.
        .pagemap_scan(wasmtime::Enabled::Auto)
        .linear_memory_keep_resident(keep_resident)
        .table_keep_resident(64 * 1024)
        .max_unused_warm_slots(UNUSED_WARM_SLOTS);
    let mut config = base_config();
    config.allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(pool));
    config
}

/// Bytes of a linear memory kept resident between calls: the pages a call
/// wrote (found with PAGEMAP_SCAN), up to this many, are zeroed and stay
/// mapped for the next call; the rest is given back. A page kept this way
/// stays resident in its slot for good, so this bounds what every slot a
/// call has ever used holds: at most `2 × max_concurrent_calls` slots
/// (512 by default) × this.
///
/// Measured in the 10-minute soak (`scripts/soak.sh`): the built-in and
/// well-behaved plugins leave 0–4 KiB written outside their data segments,
/// but a plugin that fills its memory (`alloc_forever`) left a whole 2 MiB
/// (the former value) in each slot it ran in, and as calls of other plugins
/// took its idle slots it moved on to fresh ones: the slots' resident
/// memory grew by ~0.4 MiB/s for the whole run (148 MiB after 4 minutes,
/// 368 MiB after 10: the soak's RSS +27.6 % where 5 % is allowed), towards
/// 1 GiB.
/// 32 KiB keeps the well-behaved plugins' pages resident as before and
/// bounds the pool's idle memory at 16 MiB.
pub const KEEP_RESIDENT: usize = 32 * 1024;

/// Idle memory slots the pool may prefer over a never-used one. With
/// wasmtime's default (100) a call whose plugin has no idle slot of its
/// own took a fresh slot while fewer than 100 were idle, so plugins
/// replaced through the API (each a new module) walked through fresh
/// slots. With 0, a fresh slot is taken only when every used one is busy:
/// the slots ever used are the most calls run at once (counted per
/// allocator shard: wasmtime gives each core's threads one), and a plugin
/// without an idle slot of its own takes the least recently used one.
const UNUSED_WARM_SLOTS: u32 = 0;

fn base_config() -> wasmtime::Config {
    let mut config = wasmtime::Config::new();
    config
        .wasm_component_model(true)
        .consume_fuel(true)
        .epoch_interruption(true);
    config
}

/// The pooling engine, or, where the address space for its pool cannot be
/// reserved (a low `ulimit -v`, valgrind), an engine that allocates per call.
fn new_wasmtime_engine(max_calls: u32, keep_resident: usize) -> Result<wasmtime::Engine, EngineError> {
    match wasmtime::Engine::new(&wasmtime_config(max_calls, keep_resident)) {
        Ok(engine) => Ok(engine),
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "cannot reserve the instance pool; allocating per call instead");
            wasmtime::Engine::new(&base_config()).map_err(EngineError)
        }
    }
}

impl Engine {
    /// Sets up the engine (the once-per-process phase) and starts the epoch
    /// ticker thread, which stops when the last clone is dropped.
    pub fn new(config: EngineConfig) -> Result<Self, EngineError> {
        let max_calls = config.max_concurrent_calls.max(1);
        // wasmtime captures a Rust backtrace for every `wasmtime::Error`
        // when RUST_BACKTRACE is set, and WASI makes one for each
        // `would-block` of a socket: with RUST_BACKTRACE=1 that was a third
        // of a tcp probe's CPU. sonde reports errors by message only.
        wasmtime::error::disable_backtrace();
        // Sockets held for plugins are bounded out of the fd limit; the
        // soft default (1024) would make that bound needlessly small.
        host::bounds::raise_fd_limit();
        let engine = new_wasmtime_engine(max_calls, config.memory_keep_resident)?;
        let mut linker_closed = Linker::new(&engine);
        store::add_to_linker(&mut linker_closed, false).map_err(EngineError)?;
        let mut linker_files = Linker::new(&engine);
        store::add_to_linker(&mut linker_files, true).map_err(EngineError)?;
        // Opened, then removed: the handle stays valid and can never gain
        // an entry, and nothing is left behind.
        let empty_dir = tempfile::Builder::new()
            .prefix("sonde-empty-")
            .tempdir()
            .and_then(|tmp| {
                let dir = host::filesystem::open_empty_dir(tmp.path());
                tmp.close()?;
                dir
            })
            .map_err(|e| EngineError(e.into()))?;
        let ticker = Arc::new(Ticker::default());
        {
            let engine = engine.clone();
            let ticker = ticker.clone();
            std::thread::Builder::new()
                .name("sonde-epoch".into())
                .spawn(move || ticker.run(&engine))
                .map_err(|e| EngineError(e.into()))?;
        }
        Ok(Self {
            inner: Arc::new(Inner {
                cache: cache::CompileCache::new(&engine, config.cache_dir),
                compiler: config.compiler,
                engine,
                linker_closed,
                linker_files,
                empty_dir,
                plugins: Mutex::new(HashMap::new()),
                slots: Semaphore::new(max_calls as usize),
                host: Arc::new(host::Shared::new(host::bounds::agent_sockets(), config.host_limits)),
                ticker,
            }),
        })
    }

    /// The bounds this engine's calls run under now (`sandbox:`).
    pub fn host_limits(&self) -> host::bounds::HostLimits {
        self.inner.host.bounds.limits()
    }

    /// Puts `limits` in force: every call that starts from now runs under
    /// them, and the agent-wide bounds take their new sizes (the pool's
    /// idle bounds at its next check-in; a narrower gate of lookups or
    /// blocking threads as the work in flight gives its permits back).
    /// Calls in flight finish under the per-call bounds they started with.
    /// `limits` are expected to have passed [`HostLimits::validate`]
    /// (a gate is never narrower than 1).
    ///
    /// [`HostLimits::validate`]: host::bounds::HostLimits::validate
    pub fn set_host_limits(&self, limits: host::bounds::HostLimits) {
        self.inner.host.set_limits(limits);
    }

    /// How long the engine's gate of name lookups and of blocking threads
    /// for plugins have each been full (`None` while one is free):
    /// `/livez` fails when either passes the health timeout.
    pub fn gates_exhausted_for(&self) -> (Option<Duration>, Option<Duration>) {
        let gates = self.inner.host.bounds.gates();
        (gates.lookups().exhausted_for(), gates.threads().exhausted_for())
    }

    /// Compile cache hits and misses since start.
    pub fn cache_stats(&self) -> (u64, u64) {
        let c = &self.inner.cache;
        (c.hits.load(Ordering::Relaxed), c.misses.load(Ordering::Relaxed))
    }

    /// What the instance pool holds now; `None` when the engine allocates
    /// per call (no pool could be reserved).
    pub fn pool_stats(&self) -> Option<PoolStats> {
        let m = self.inner.engine.pooling_allocator_metrics()?;
        Some(PoolStats {
            memories_in_use: m.memories() as u64,
            idle_memories: u64::from(m.unused_warm_memories()),
            idle_bytes_resident: m.unused_memory_bytes_resident() as u64,
        })
    }

    /// Loads a plugin from a file (the once-per-digest phase).
    pub async fn load_file(&self, path: &std::path::Path) -> Result<Arc<Plugin>, LoadError> {
        let label = path.display().to_string();
        let bytes = read_plugin_file(path)?;
        self.load(&label, &bytes).await
    }

    /// Loads a plugin from its bytes (the once-per-digest phase): a plugin
    /// already loaded with the same digest is shared, label included, and
    /// concurrent loads of one digest compile it once.
    pub async fn load(&self, label: &str, wasm: &[u8]) -> Result<Arc<Plugin>, LoadError> {
        let plugin = label.to_string();
        match wasm.get(..8) {
            Some([0, b'a', b's', b'm', 1, 0, 0, 0]) => return Err(LoadError::CoreModule { plugin }),
            Some([0, b'a', b's', b'm', _, _, 1, 0]) => {}
            _ => return Err(LoadError::NotWasm { plugin }),
        }
        let digest = hex(&Sha256::digest(wasm));
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
                plugins.insert(digest.clone(), Loaded::Loading(cell.clone()));
                cell
            })
        };
        let loaded = cell
            .get_or_try_init(|| self.load_new(plugin, wasm, digest.clone()))
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

    /// Removes the compile-cache file of the plugin with `digest` (hex),
    /// now, or when the last holder of the loaded plugin drops it (a run
    /// in flight): called when a stored plugin is replaced or deleted, so
    /// the cache does not keep what no one runs. A plugin of the same
    /// digest loaded again before then keeps it.
    pub fn forget(&self, digest: &str) {
        let live = match self.inner.plugins.lock().unwrap_or_else(|e| e.into_inner()).get(digest) {
            Some(Loaded::Loading(_)) => return,
            Some(Loaded::Ready(p)) => p.upgrade(),
            None => None,
        };
        match live {
            Some(plugin) => plugin.forgotten.store(true, Ordering::Relaxed),
            None => {
                self.inner.cache.remove(digest);
            }
        }
    }

    /// Compiles (or loads from the cache), checks, pre-instantiates and
    /// describes a plugin not loaded before.
    async fn load_new(&self, plugin: String, wasm: &[u8], digest: String) -> Result<Arc<Plugin>, LoadError> {
        let (component, cache) = if let Compiler::Child { program, budget } = &self.inner.compiler {
            self.compile_in_child(&plugin, program, *budget, wasm, &digest).await?
        } else {
            // Compiling takes long enough that it must not hold an async worker.
            let inner = self.inner.clone();
            let (wasm, digest) = (wasm.to_vec(), digest.clone());
            tokio::task::spawn_blocking(move || inner.cache.load(&inner.engine, &wasm, &digest))
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
                .map_err(|e| LoadError::UnknownImport {
                    plugin: plugin.clone(),
                    detail: format!("{e:#}"),
                })?;
            bindings::PluginPre::new(instance_pre).map_err(|e| LoadError::WrongWorld {
                plugin: plugin.clone(),
                detail: format!("{e:#}"),
            })
        };
        let pre_closed = prepare(&self.inner.linker_closed)?;
        let pre_files = prepare(&self.inner.linker_files)?;
        let info = self.describe(&pre_closed).await.map_err(|detail| LoadError::Describe {
            plugin: plugin.clone(),
            detail,
        })?;
        Ok(Arc::new(Plugin {
            cache_file: self.inner.cache.entry(&digest),
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
        // directory, removed once loaded.
        let scratch;
        let out = match cache.entry(digest) {
            Some(path) => path,
            None => {
                scratch = tempfile::Builder::new()
                    .prefix("sonde-compiled-")
                    .tempdir()
                    .map_err(|e| LoadError::Compile {
                        plugin: plugin.to_string(),
                        source: e.into(),
                    })?;
                scratch.path().join("component.cwasm")
            }
        };
        compile::in_child(plugin, program, budget, wasm, &out).await?;
        // SAFETY: the file was just written by this binary's compiler, in
        // the private cache directory or a private temporary one.
        #[allow(unsafe_code)]
        let component = unsafe { Component::deserialize_file(engine, &out) }.map_err(|source| LoadError::Compile {
            plugin: plugin.to_string(),
            source,
        })?;
        Ok((component, CacheOutcome::Miss))
    }

    /// The store of one call of `probe` for `tenant`: its state (the
    /// grants, the memory cap, the deadline `limits.timeout` from now) and
    /// its fuel, hostcall fuel and epoch deadline. Fails when a `files`
    /// grant cannot be opened.
    fn call_store(
        &self,
        probe: &str,
        tenant: &Arc<str>,
        grants: Arc<CallGrants>,
        limits: &Limits,
    ) -> Result<Store<CallState>, String> {
        let state = CallState::new(
            probe.into(),
            tenant.clone(),
            grants,
            self.inner.host.clone(),
            &self.inner.empty_dir,
            limits.memory,
            Instant::now() + limits.timeout,
        )?;
        let mut store = Store::new(&self.inner.engine, state);
        store.limiter(|s| &mut s.memory);
        // Fuel is on for every store of this engine, so setting it cannot fail.
        let _ = store.set_fuel(limits.fuel);
        // What one host call may copy out of the guest (host::bounds).
        store.set_hostcall_fuel(store.data().bounds.limits().argument_bytes);
        store.epoch_deadline_callback(|_| Ok(UpdateDeadline::Yield(1)));
        store.set_epoch_deadline(1);
        Ok(store)
    }

    async fn describe(&self, pre: &bindings::PluginPre<CallState>) -> Result<PluginInfo, String> {
        let limits = Limits::default();
        let grants = Arc::new(CallGrants::new(None, Arc::default(), self.own_listeners().clone()));
        let mut store = self.call_store("describe", &no_tenant(), grants.clone(), &limits)?;
        let _slot = self.inner.slots.acquire().await.map_err(|e| e.to_string())?;
        let _ticking = self.inner.ticker.busy();
        let call = async {
            let instance = pre.instantiate_async(&mut store).await?;
            instance.call_describe(&mut store).await
        };
        match tokio::time::timeout(limits.timeout, call).await {
            Err(_) => Err(format!(
                "no answer within {}",
                humantime::format_duration(limits.timeout)
            )),
            Ok(Err(e)) => Err(trap_message(&e, &store)),
            Ok(Ok(_)) if grants.denial_message().is_some() => Err(grants.denial_message().unwrap_or_default()),
            Ok(Ok(info)) => Ok(info.into()),
        }
    }

    /// The addresses the agent running this engine listens on, which no
    /// plugin's connection may reach ([`crate::host::reach`]); the agent
    /// adds its API's once it is bound.
    pub fn own_listeners(&self) -> &Arc<host::reach::OwnListeners> {
        &self.inner.host.listeners
    }

    /// Runs one call of `plugin`'s `check` in a fresh sandbox (the per-call
    /// phase), for no tenant in particular (`sonde check`, benchmarks):
    /// as [`Engine::run_for`].
    pub async fn run(&self, plugin: &Plugin, call: &Call<'_>) -> RunResult {
        self.run_for(&no_tenant(), plugin, call).await
    }

    /// Runs one call of `plugin`'s `check` for `tenant` in a fresh sandbox
    /// (the per-call phase); what outlives the call (pooled connections)
    /// is the tenant's own. Never fails and never panics: whatever the
    /// plugin does ends up in the [`RunResult`].
    pub async fn run_for(&self, tenant: &Arc<str>, plugin: &Plugin, call: &Call<'_>) -> RunResult {
        let target = match call.target {
            "" => None,
            t => match NetPattern::for_target(t) {
                Ok(p) => Some(p),
                Err(e) => return RunResult::error(Reason::InvalidConfig, e.to_string()),
            },
        };
        let grants = Arc::new(CallGrants::new(
            target,
            call.grants.clone(),
            self.own_listeners().clone(),
        ));
        let Ok(_slot) = self.inner.slots.acquire().await else {
            return RunResult::error(Reason::Internal, "the engine is shutting down");
        };
        let mut store = match self.call_store(call.probe, tenant, grants.clone(), &call.limits) {
            Ok(s) => s,
            Err(e) => return RunResult::error(Reason::Internal, e),
        };
        let _ticking = self.inner.ticker.busy();
        let req = wit::Request {
            probe: call.probe.to_string(),
            target: call.target.to_string(),
            config: call.config.to_string(),
            timeout_ms: u64::try_from(call.limits.timeout.as_millis()).unwrap_or(u64::MAX),
            attempt: call.attempt,
        };
        let start = Instant::now();
        let pre = if call.grants.files.is_empty() {
            &plugin.pre_closed
        } else {
            &plugin.pre_files
        };
        let outcome = tokio::time::timeout(call.limits.timeout, async {
            let instance = pre.instantiate_async(&mut store).await?;
            instance.call_check(&mut store, &req).await
        })
        .await;
        let duration = start.elapsed();
        let mut result = match outcome {
            Err(_) => RunResult::error(
                Reason::Timeout,
                format!(
                    "no answer within the {} timeout",
                    humantime::format_duration(call.limits.timeout)
                ),
            ),
            Ok(Err(e)) => classify_trap(&e, &store, &call.limits),
            Ok(Ok(Err(e))) => probe_error(e),
            Ok(Ok(Ok(o))) => from_outcome(o),
        };
        // A denial, or a host bound the plugin ran into, is surfaced
        // whatever the plugin made of it.
        if let Some(message) = grants.denial_message() {
            result = RunResult::error(Reason::Denied, message);
        } else if let Some(why) = store.data().bounds.breach() {
            result = RunResult::error(Reason::HostLimit, why.to_string());
        }
        result.duration = duration;
        result.fuel_consumed = call.limits.fuel.saturating_sub(store.get_fuel().unwrap_or(0));
        result
    }
}

/// The tenant of calls run without one (see [`Engine::run`]).
fn no_tenant() -> Arc<str> {
    static NONE: std::sync::OnceLock<Arc<str>> = std::sync::OnceLock::new();
    NONE.get_or_init(|| Arc::from("")).clone()
}

/// The digest a plugin's bytes are known by (SHA-256, hex), as
/// [`Plugin::digest`] says it.
pub fn digest_of(wasm: &[u8]) -> String {
    hex(&Sha256::digest(wasm))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn component_imports(engine: &wasmtime::Engine, component: &Component) -> Vec<String> {
    component
        .component_type()
        .imports(engine)
        .map(|(name, _)| name.to_string())
        .collect()
}

/// What went wrong, without wasmtime's backtrace: the trap's description
/// (`wasm \`unreachable\` instruction executed`) or the root cause.
fn describe_error(e: &wasmtime::Error) -> String {
    if let Some(trap) = e.downcast_ref::<Trap>() {
        return trap.to_string();
    }
    let root = e.root_cause().to_string();
    root.lines().next().unwrap_or_default().to_string()
}

fn trap_message(e: &wasmtime::Error, store: &Store<CallState>) -> String {
    let mut msg = describe_error(e);
    if let Some(tail) = store.data().stderr_tail() {
        msg = format!("{msg}: {tail}");
    } else if let Some(panic) = store.data().logged_panic() {
        msg = format!("{msg}: {panic}");
    }
    msg
}

/// The host bound `e` ran into, described, if it is one:
/// - the call's resource table refusing one more entry, or
///   wasmtime-wasi-http refusing to grow a `fields` past its size limit;
/// - wasmtime refusing to copy more than the store's hostcall fuel
///   (`sandbox.argument_bytes`) out of the guest in one host call;
/// - wasmtime-wasi refusing a `wasi:random` call past
///   [`host::bounds::RANDOM_BYTES`].
///
/// All but the first are private error types or plain messages, so they
/// are matched by their text; the tests of `bounds` pin each one.
fn host_limit(e: &wasmtime::Error, limits: &host::bounds::HostLimits) -> Option<String> {
    let random_refused = format!("exceeds limit {}", host::bounds::RANDOM_BYTES);
    e.chain().find_map(|c| {
        let text = c.to_string();
        if matches!(
            c.downcast_ref::<wasmtime::component::ResourceTableError>(),
            Some(wasmtime::component::ResourceTableError::Full)
        ) || text.contains("total size of fields exceeds limit")
        {
            Some(format!(
                "the plugin held more than {} host resources at once, or more than {} bytes in one fields",
                limits.table_entries_per_call, limits.fields_bytes
            ))
        } else if text.contains("fuel allocated for hostcalls has been exhausted") {
            Some(format!(
                "the plugin passed more than {} to one host call, or returned more (sandbox.argument_bytes)",
                bytesize::ByteSize(limits.argument_bytes as u64)
            ))
        } else if text.starts_with("requested len") && text.ends_with(&random_refused) {
            Some(format!(
                "the plugin asked for more than {} of random bytes at once",
                bytesize::ByteSize(host::bounds::RANDOM_BYTES)
            ))
        } else {
            None
        }
    })
}

fn classify_trap(e: &wasmtime::Error, store: &Store<CallState>, limits: &Limits) -> RunResult {
    let (reason, message) = if e.downcast_ref::<Trap>() == Some(&Trap::OutOfFuel) {
        (Reason::Fuel, format!("fuel budget of {} exhausted", limits.fuel))
    } else if let Some(breach) = host_limit(e, store.data().bounds.limits()) {
        (Reason::HostLimit, breach)
    } else if store.data().memory.exceeded {
        (
            Reason::Memory,
            format!("memory cap of {} exceeded", bytesize::ByteSize(limits.memory)),
        )
    } else {
        (Reason::Trap, format!("plugin trapped: {}", trap_message(e, store)))
    };
    RunResult::error(reason, plugin_text(message, MAX_MESSAGE_BYTES))
}

fn probe_error(e: wit::ProbeError) -> RunResult {
    let (reason, message) = match e {
        wit::ProbeError::InvalidConfig(m) => (Reason::InvalidConfig, m),
        wit::ProbeError::Denied(m) => (Reason::Denied, m),
        wit::ProbeError::Io(m) => (Reason::Io, m),
        wit::ProbeError::Internal(m) => (Reason::Internal, m),
    };
    RunResult::error(reason, plugin_text(message, MAX_MESSAGE_BYTES))
}

/// A metric name the host accepts: `[a-zA-Z_][a-zA-Z0-9_]*`.
fn valid_metric_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn from_outcome(o: wit::Outcome) -> RunResult {
    let status = match o.status {
        wit::Status::Success => Status::Success,
        wit::Status::Warning => Status::Warning,
        wit::Status::Failure => Status::Failure,
        wit::Status::Unknown => Status::Unknown,
    };
    let metrics = o
        .metrics
        .into_iter()
        .filter(|m| m.name.len() <= MAX_METRIC_NAME_BYTES && valid_metric_name(&m.name) && m.value.is_finite())
        .take(MAX_METRICS)
        .map(|m| Metric {
            name: m.name,
            value: m.value,
            unit: plugin_text(m.unit, MAX_METRIC_NAME_BYTES),
        })
        .collect();
    RunResult {
        status,
        reason: None,
        message: plugin_text(o.message, MAX_MESSAGE_BYTES),
        metrics,
        detail: o.detail.map(|d| plugin_text(d, MAX_DETAIL_BYTES)),
        duration: Duration::ZERO,
        fuel_consumed: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_is_capped() {
        let o = wit::Outcome {
            status: wit::Status::Warning,
            message: "x".repeat(100_000),
            metrics: (0..1000)
                .map(|i| wit::Metric {
                    name: format!("m{i}"),
                    value: i as f64,
                    unit: String::new(),
                })
                .chain([wit::Metric {
                    name: "bad name".into(),
                    value: 1.0,
                    unit: String::new(),
                }])
                .collect(),
            detail: Some("d".repeat(100_000)),
        };
        let r = from_outcome(o);
        assert_eq!(r.status, Status::Warning);
        assert!(r.message.len() <= MAX_MESSAGE_BYTES);
        assert!(r.detail.unwrap().len() <= MAX_DETAIL_BYTES);
        assert_eq!(r.metrics.len(), MAX_METRICS);
    }

    /// Once idle the epoch thread sleeps; a call that then spins must
    /// still be interrupted at its deadline, so starting it must wake the
    /// thread.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_sleeping_ticker_wakes_for_a_spinning_plugin() {
        let engine = uncached_engine();
        let spin = engine
            .load_file(sonde_tests::guests::SPIN_FOREVER.as_ref())
            .await
            .unwrap();
        // Loading ran `describe`; wait until the ticker has gone to sleep.
        let waited = Instant::now();
        while !engine.inner.ticker.sleeping.load(Ordering::SeqCst) {
            assert!(waited.elapsed() < Duration::from_secs(10), "the ticker never slept");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let task = tokio::spawn(async move {
            let grants = Arc::new(Grants::default());
            let call = Call {
                probe: "spin",
                target: "",
                config: "{}",
                limits: Limits {
                    timeout: Duration::from_millis(200),
                    ..Limits::default()
                },
                grants: &grants,
                attempt: 1,
            };
            engine.run(&spin, &call).await
        });
        let result = tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the spinning call must end")
            .unwrap();
        assert_eq!(result.reason, Some(Reason::Timeout), "{result:?}");
    }

    /// An engine with the default config that keeps no compiled code on disk.
    fn uncached_engine() -> Engine {
        Engine::new(EngineConfig {
            cache_dir: None,
            ..EngineConfig::default()
        })
        .unwrap()
    }

    /// One call of `plugin` as [`Engine::run_for`] makes it, returning the
    /// store, and whether `check` returned (rather than trapped).
    async fn call_keeping_store(engine: &Engine, plugin: &Plugin, target: &str) -> (bool, Store<CallState>) {
        let limits = Limits::default();
        let grants = Arc::new(CallGrants::new(
            Some(NetPattern::for_target(target).unwrap()),
            Arc::default(),
            engine.own_listeners().clone(),
        ));
        let mut store = engine.call_store("p", &no_tenant(), grants, &limits).unwrap();
        let _ticking = engine.inner.ticker.busy();
        let req = wit::Request {
            probe: "p".into(),
            target: target.into(),
            config: "{}".into(),
            timeout_ms: 1_000,
            attempt: 1,
        };
        let instance = plugin.pre_closed.instantiate_async(&mut store).await.unwrap();
        let returned = instance.call_check(&mut store, &req).await.is_ok();
        (returned, store)
    }

    /// The WASI context is built by a call that uses it, and only then:
    /// the tcp plugin reads the clocks (linked to the call's own parts)
    /// and builds none; a std plugin's panic goes to stderr, which builds
    /// it, and the message is kept.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_a_call_that_uses_wasi_builds_its_context() {
        let engine = uncached_engine();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let target = listener.local_addr().unwrap().to_string();

        let tcp = engine.load("tcp", crate::builtins::get("tcp").unwrap()).await.unwrap();
        let (returned, store) = call_keeping_store(&engine, &tcp, &target).await;
        assert!(returned);
        assert!(!store.data().wasi_built(), "the tcp plugin built a WASI context");

        let panics = engine
            .load_file(sonde_tests::guests::PANIC_IN_CHECK.as_ref())
            .await
            .unwrap();
        let (returned, store) = call_keeping_store(&engine, &panics, &target).await;
        assert!(!returned);
        assert!(store.data().wasi_built());
        let tail = store.data().stderr_tail().unwrap_or_default();
        assert!(tail.contains("panicked at"), "{tail}");
    }

    /// The engine holds compiled code only while something uses it: a
    /// replaced or deleted plugin's code is freed with the old registry.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_plugin_no_one_holds_is_freed() {
        let engine = Engine::new(EngineConfig {
            cache_dir: None,
            max_concurrent_calls: 4,
            ..EngineConfig::default()
        })
        .unwrap();
        let path: &std::path::Path = sonde_tests::guests::ALWAYS_UP.as_ref();
        let one = engine.load_file(path).await.unwrap();
        let two = engine.load_file(path).await.unwrap();
        assert!(Arc::ptr_eq(&one, &two), "one digest is loaded once");
        assert_eq!(engine.plugins_loaded(), 1);
        drop((one, two));
        assert_eq!(engine.plugins_loaded(), 0);
        let three = engine.load_file(path).await.unwrap();
        assert_eq!(three.cache_outcome(), CacheOutcome::Miss, "compiled again");
        assert_eq!(engine.plugins_loaded(), 1);
    }

    #[test]
    fn metric_names() {
        assert!(valid_metric_name("connect_seconds"));
        assert!(valid_metric_name("_x1"));
        assert!(!valid_metric_name("1x"));
        assert!(!valid_metric_name("a-b"));
        assert!(!valid_metric_name(""));
    }
}
