//! The engine: runs one plugin call in a fresh sandbox under a deadline, a
//! fuel budget and a memory cap, and turns whatever happened into a
//! [`RunResult`](crate::verdict::RunResult).
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
mod epoch;
pub mod limits;
mod load;
mod plugin;
mod pool;
mod run;
mod store;

pub use cache::CacheOutcome;
pub use compile::{CompileBudget, Compiler};
pub use epoch::EPOCH_TICK;
pub use limits::Limits;
pub use load::{LoadError, read_plugin_file};
pub use plugin::{Capability, CapabilityKind, Plugin, PluginInfo};
pub use pool::{KEEP_RESIDENT, PoolStats};
pub use run::{Call, DescribeError};
pub use store::CallSetupError;

use crate::host;
use epoch::Ticker;
use load::Loaded;
use pool::new_wasmtime_engine;
use sonde_policy::identity::Digest;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use store::CallState;
use tokio::sync::Semaphore;
use wasmtime::component::Linker;
use wasmtime_wasi::filesystem::Dir;

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

/// What the engine could not set up.
#[derive(Debug, thiserror::Error)]
#[error("cannot set up the wasm engine: {0:#}")]
pub struct EngineError(wasmtime::Error);

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
    plugins: Mutex<HashMap<Digest, Loaded>>,
    /// Where the engine's temporary files go (see [`scratch_dir`]).
    scratch: PathBuf,
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

/// Where the engine writes its temporary files (the empty directory shown
/// to plugins, a component handed to the compiler child, an uncached
/// compiled artifact): the compile cache's directory when the cache is on
/// (private to this user, and in a container on a volume), else `$TMPDIR`.
/// Nothing else is written outside the configured directories, so the
/// agent starts on a read-only root filesystem with no `/tmp`.
fn scratch_dir(cache: &cache::CompileCache) -> PathBuf {
    cache
        .dir()
        .map_or_else(std::env::temp_dir, std::path::Path::to_path_buf)
}

/// Makes a directory in `scratch`, opens it and removes it: the handle
/// stays valid and can never gain an entry, and nothing is left behind.
fn open_removed_empty_dir(scratch: &std::path::Path) -> std::io::Result<Dir> {
    let tmp = tempfile::Builder::new().prefix("sonde-empty-").tempdir_in(scratch)?;
    let dir = host::filesystem::open_empty_dir(tmp.path());
    tmp.close()?;
    dir
}

/// The sandbox engine; clones share it. Engines in one process share
/// nothing of their configuration: each enforces its own bounds.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
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
        let cache = cache::CompileCache::new(&engine, config.cache_dir);
        let scratch = scratch_dir(&cache);
        let empty_dir = open_removed_empty_dir(&scratch).map_err(|source| {
            EngineError(wasmtime::Error::msg(format!(
                "cannot make a scratch directory in {}: {source} (the engine's temporary files go in the compile \
                 cache directory when it is usable — $SONDE_CACHE_DIR, or --cache-dir — else in $TMPDIR)",
                scratch.display()
            )))
        })?;
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
                cache,
                scratch,
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

    /// The addresses the agent running this engine listens on, which no
    /// plugin's connection may reach ([`sonde_policy::reach`]); the agent
    /// adds its API's once it is bound.
    pub fn own_listeners(&self) -> &Arc<sonde_policy::reach::OwnListeners> {
        &self.inner.host.listeners
    }
}

/// The tenant of calls run without one (see [`Engine::run`]).
fn no_tenant() -> Arc<str> {
    static NONE: std::sync::OnceLock<Arc<str>> = std::sync::OnceLock::new();
    NONE.get_or_init(|| Arc::from("")).clone()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bindings::sonde::probe::types as wit;
    use crate::host::{Grants, NetPattern};
    use crate::verdict::Reason;
    use sonde_policy::grants::CallGrants;
    use std::time::Instant;
    use wasmtime::Store;

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
                observe: false,
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
        let mut store = engine
            .call_store("p", &no_tenant(), grants, &limits, super::store::How::default())
            .unwrap();
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

        let tcp = engine.load("tcp", sonde_builtins::get("tcp").unwrap()).await.unwrap();
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
}
