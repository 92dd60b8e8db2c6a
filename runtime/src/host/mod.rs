//! Host capabilities: what a plugin can reach, each checked against the
//! probe's grants.
//!
//! One file per capability, each with the same small shape: state kept in
//! [`HostState`], an `add_to_linker`, and a grant check in [`CallGrants`]:
//!
//! - [`net`]: `wasi:sockets`, filtered to the target and `net` grants,
//!   including name lookups;
//! - [`http`]: `wasi:http/outgoing-handler`, likewise, and sonde's own
//!   `http` probe transport, with its keep-alive [`pool`];
//! - [`handshake`]: sonde's `tls` interface, a TLS handshake by the host;
//! - [`grpc`]: sonde's `grpc` interface, one unary call to the target or a
//!   `net` grant;
//! - [`files`]: `wasi:filesystem`, showing only the read-only `files` grants;
//! - [`exec`]: sonde's `exec` interface, for granted programs only;
//! - [`log`]: sonde's `log` interface, capped per call.
//!
//! [`tls`] is the TLS client the transports share. What outlives a call (the
//! TLS client, the pool) is in [`Shared`], built once per engine.
//!
//! Everything else WASI offers is present but empty: no environment, no
//! arguments, stdin closed, stdout discarded, stderr kept (bounded) so a
//! plugin's panic message can be reported.

pub mod exec;
pub mod files;
pub mod grants;
pub mod grpc;
pub mod handshake;
pub mod http;
pub mod log;
pub mod net;
pub mod pool;
pub mod tls;

pub use grants::{GrantError, Grants, NetPattern};

use crate::engine::limits::MemoryCap;
use grants::CallGrants;
use std::sync::Arc;
use std::time::Instant;
use wasmtime::component::{Linker, ResourceTable};
use wasmtime_wasi::filesystem::Dir;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

/// How much of a plugin's stderr the host keeps for error messages.
const STDERR_CAPTURE_BYTES: usize = 4 * 1024;

/// The standard WASI state of one call, kept apart from sonde's own so a
/// capability can borrow both at once.
pub(crate) struct Sandbox {
    wasi: WasiCtx,
    table: ResourceTable,
}

impl WasiView for Sandbox {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// What every call of an engine shares (built once per engine): the TLS
/// client with its trust roots, and the HTTP keep-alive pool.
#[derive(Default)]
pub(crate) struct Shared {
    pub(crate) tls: tls::TlsClient,
    pub(crate) pool: pool::Pool,
}

/// The data of one call's `Store`: built per call, dropped with it.
pub struct HostState {
    pub(crate) sandbox: Sandbox,
    pub(crate) http: WasiHttpCtx,
    pub(crate) hooks: http::Hooks,
    pub(crate) memory: MemoryCap,
    pub(crate) grants: Arc<CallGrants>,
    pub(crate) log: log::CallLog,
    pub(crate) lookups: net::Lookups,
    pub(crate) stderr: MemoryOutputPipe,
    pub(crate) empty_dir: Dir,
    pub(crate) exec: exec::CallExec,
    pub(crate) shared: Arc<Shared>,
    /// TLS sessions the plugin holds open.
    pub(crate) tls_sessions: usize,
}

impl HostState {
    /// Builds the state of one call (the per-call phase): a WASI context
    /// that denies everything the grants do not allow.
    pub(crate) fn new(
        probe: Arc<str>,
        grants: Arc<CallGrants>,
        shared: Arc<Shared>,
        empty_dir: &Dir,
        memory: u64,
        deadline: Instant,
    ) -> Result<Self, String> {
        let mut builder = WasiCtx::builder();
        net::configure(&mut builder, grants.clone());
        files::configure(&mut builder, &grants.config().files)?;
        let stderr = MemoryOutputPipe::new(STDERR_CAPTURE_BYTES);
        builder.stderr(stderr.clone());
        Ok(Self {
            sandbox: Sandbox {
                wasi: builder.build(),
                table: ResourceTable::new(),
            },
            http: WasiHttpCtx::new(),
            hooks: http::Hooks::new(grants.clone()),
            memory: MemoryCap::new(memory),
            log: log::CallLog::new(probe),
            lookups: net::Lookups::default(),
            grants,
            stderr,
            empty_dir: empty_dir.clone(),
            exec: exec::CallExec::new(deadline),
            shared,
            tls_sessions: 0,
        })
    }

    /// The last line the plugin wrote to stderr, such as a panic message.
    pub(crate) fn stderr_tail(&self) -> Option<String> {
        let bytes = self.stderr.contents();
        let text = String::from_utf8_lossy(&bytes);
        let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        // A Rust panic prints "thread '<unnamed>' panicked at FILE:LINE:COL:"
        // and the message on the next line.
        match lines.iter().rposition(|l| l.contains("panicked at")) {
            Some(i) => Some(lines[i..(i + 2).min(lines.len())].join(" ")),
            None => lines.last().map(|l| l.to_string()),
        }
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        self.sandbox.ctx()
    }
}

impl WasiHttpView for HostState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.sandbox.table,
            hooks: &mut self.hooks,
        }
    }
}

/// Adds every host capability to `linker` (the once-per-process phase).
/// With `files_granted` false, every filesystem path operation is a denial.
pub(crate) fn add_to_linker(linker: &mut Linker<HostState>, files_granted: bool) -> wasmtime::Result<()> {
    wasmtime_wasi::p2::add_to_linker_async(linker)?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(linker)?;
    // Name lookups need a grant check that wasmtime-wasi has no hook for.
    linker.allow_shadowing(true);
    net::add_to_linker(linker)?;
    linker.allow_shadowing(false);
    if !files_granted {
        files::deny_all_in_linker(linker)?;
    }
    log::add_to_linker(linker)?;
    exec::add_to_linker(linker)?;
    http::add_to_linker(linker)?;
    grpc::add_to_linker(linker)?;
    handshake::add_to_linker(linker)?;
    Ok(())
}
