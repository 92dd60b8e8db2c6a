//! The data of one call's `Store`: a composition of the capabilities' own
//! states, built per call and dropped with the store, and the linker that
//! wires each capability to its part through an accessor (the
//! once-per-process phase).
//!
//! Only this module knows the whole; a capability sees its view alone
//! (`host::exec::ExecView`, `host::tls::TlsView`…).
//!
//! wasmtime-wasi's context (stdio, random, sockets, environment) is built
//! at its first use, not with the store: most calls never touch it. The
//! clocks and `wasi:io` are linked to parts of their own (the call's
//! [`WasiClocksCtx`], itself built at the first clock read, and resource
//! table), so timing a check or polling a stream does not build it
//! either. A call with `files` grants builds it up front, where opening a
//! granted directory can fail.

use super::limits::MemoryCap;
use crate::host::bounds::CallBounds;
use crate::host::contain::RunLimits;
use crate::host::{
    Shared, client_certs, credentials, exec, filesystem, grpc, http, icmp, log, outgoing_handler, sockets, tcp, tls,
    udp,
};
use sonde_policy::grants::CallGrants;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use wasmtime::component::{Linker, ResourceTable};
use wasmtime_wasi::clocks::{WasiClocks, WasiClocksCtx, WasiClocksCtxView};
use wasmtime_wasi::filesystem::Dir;
use wasmtime_wasi::p2::bindings::clocks::{monotonic_clock, wall_clock};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};
use wasmtime_wasi_io::IoView;

/// How much of a plugin's stderr the host keeps for error messages.
const STDERR_CAPTURE_BYTES: usize = 4 * 1024;

/// The data of one call's `Store`.
pub(crate) struct CallState {
    // What every capability may borrow: the call's grants, deadline and
    // resource table, and what the engine's calls share.
    grants: Arc<CallGrants>,
    deadline: Instant,
    table: ResourceTable,
    shared: Arc<Shared>,
    /// The tenant the call runs for.
    tenant: Arc<str>,
    /// The shared empty directory shown to calls without a `files` grant.
    empty_dir: Dir,
    // The capabilities' own states.
    /// wasmtime-wasi's context, once something has used it.
    wasi: Option<Wasi>,
    /// The clocks, once the plugin has read one.
    clocks: Option<WasiClocksCtx>,
    wasi_http: WasiHttpCtx,
    http_hooks: outgoing_handler::Hooks,
    sockets: sockets::SocketsCtx,
    log: log::LogCtx,
    tls: tls::TlsCtx,
    /// The client certificates the call registered (`credentials`).
    certs: client_certs::ClientCerts,
    /// What the call holds against the host's bounds.
    pub(crate) bounds: CallBounds,
    /// What bounds the cgroup of each program the call runs.
    exec_limits: RunLimits,
    // The store's own.
    pub(crate) memory: MemoryCap,
}

/// A call's WASI context, and the pipe its stderr goes to.
struct Wasi {
    ctx: WasiCtx,
    stderr: MemoryOutputPipe,
}

impl Wasi {
    /// A context whose sockets go through `grants` and whose stderr is
    /// kept, with nothing else granted.
    fn new(grants: &Arc<CallGrants>) -> Self {
        Self::build(grants, |_| Ok::<(), core::convert::Infallible>(())).unwrap_or_else(|never| match never {})
    }

    /// The same, with `files` mounted read-only: opening one can fail.
    fn with_files(grants: &Arc<CallGrants>, files: &[PathBuf]) -> Result<Self, CallSetupError> {
        Self::build(grants, |builder| {
            filesystem::configure(builder, files).map_err(CallSetupError::FilesGrant)
        })
    }

    fn build<E>(grants: &Arc<CallGrants>, more: impl FnOnce(&mut WasiCtxBuilder) -> Result<(), E>) -> Result<Self, E> {
        let mut builder = WasiCtx::builder();
        builder.max_random_size(crate::host::bounds::RANDOM_BYTES);
        sockets::configure(&mut builder, grants.clone());
        more(&mut builder)?;
        let stderr = MemoryOutputPipe::new(STDERR_CAPTURE_BYTES);
        builder.stderr(stderr.clone());
        Ok(Self {
            ctx: builder.build(),
            stderr,
        })
    }
}

/// Why a call's sandbox could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum CallSetupError {
    /// A `files` grant could not be opened.
    #[error(transparent)]
    FilesGrant(#[from] crate::host::filesystem::FilesGrantError),
}

/// What a call carries besides its grants and limits: the trace context
/// its requests send, and whether everything the host sees is recorded.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct How<'a> {
    /// The run's trace context, when its probe propagates one.
    pub(crate) trace: Option<&'a crate::verdict::observed::TraceContext>,
    /// [`crate::engine::Call::observe`].
    pub(crate) observe: bool,
}

impl CallState {
    /// Builds the state of one call (the per-call phase). Its WASI context,
    /// which denies everything the grants do not allow, is built now if the
    /// call has `files` grants (opening one can fail), else at first use.
    pub(crate) fn new(
        probe: Arc<str>,
        tenant: Arc<str>,
        grants: Arc<CallGrants>,
        shared: Arc<Shared>,
        empty_dir: &Dir,
        limits: &super::Limits,
        how: How<'_>,
    ) -> Result<Self, CallSetupError> {
        let (memory, deadline) = (limits.memory, Instant::now() + limits.timeout);
        let files = &grants.config().files;
        let wasi = if files.is_empty() {
            None
        } else {
            Some(Wasi::with_files(&grants, files)?)
        };
        // The engine's bounds in force now, for the whole call.
        let bounds = CallBounds::new(&shared.bounds).for_call(how.trace, how.observe);
        let limits = *bounds.limits();
        let mut table = ResourceTable::new();
        table.set_max_capacity(limits.table_entries_per_call);
        let mut wasi_http = WasiHttpCtx::new();
        wasi_http.set_field_size_limit(limits.fields_bytes);
        Ok(Self {
            wasi,
            clocks: None,
            table,
            wasi_http,
            http_hooks: outgoing_handler::Hooks::new(grants.clone(), bounds.clone(), shared.clone()),
            sockets: sockets::SocketsCtx::default(),
            log: log::LogCtx::new(probe).scrubbing(&grants),
            tls: tls::TlsCtx::default(),
            certs: client_certs::ClientCerts::default(),
            bounds,
            exec_limits: RunLimits {
                pids: limits.exec_pids,
                memory,
            },
            memory: MemoryCap::new(memory, limits.host_memory_per_call()),
            grants,
            deadline,
            shared,
            tenant,
            empty_dir: empty_dir.clone(),
        })
    }

    /// The plugin's panic message, as a plugin without std reports it
    /// (through the log: it has no stderr).
    pub(crate) fn logged_panic(&self) -> Option<&str> {
        self.log.panic_message()
    }

    /// Whether the call has built its WASI context (for tests).
    #[cfg(test)]
    pub(crate) fn wasi_built(&self) -> bool {
        self.wasi.is_some()
    }

    /// The last line the plugin wrote to stderr, such as a panic message.
    pub(crate) fn stderr_tail(&self) -> Option<String> {
        let bytes = self.wasi.as_ref()?.stderr.contents();
        let text = String::from_utf8_lossy(&bytes);
        let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        // A Rust panic prints "thread '<unnamed>' panicked at FILE:LINE:COL:"
        // and the message on the next line.
        match lines.iter().rposition(|l| l.contains("panicked at")) {
            Some(i) => Some(lines[i..(i + 2).min(lines.len())].join(" ")),
            None => lines.last().map(|l| l.to_string()),
        }
    }

    fn clocks_view(&mut self) -> WasiClocksCtxView<'_> {
        WasiClocksCtxView {
            ctx: self.clocks.get_or_insert_with(WasiClocksCtx::default),
            table: &mut self.table,
        }
    }

    fn sockets_view(&mut self) -> sockets::SocketsView<'_> {
        sockets::SocketsView {
            inner: wasmtime_wasi::sockets::WasiSocketsCtxView {
                ctx: wasi_ctx(&mut self.wasi, &self.grants).sockets(),
                table: &mut self.table,
            },
            grants: &self.grants,
            ctx: &mut self.sockets,
            bounds: &mut self.bounds,
        }
    }

    fn filesystem_view(&mut self) -> filesystem::EmptyView<'_> {
        filesystem::EmptyView {
            table: &mut self.table,
            empty: &self.empty_dir,
            grants: &self.grants,
        }
    }

    fn call_grants(&self) -> &CallGrants {
        &self.grants
    }

    fn call_bounds(&self) -> &CallBounds {
        &self.bounds
    }

    fn log_ctx(&mut self) -> &mut log::LogCtx {
        &mut self.log
    }

    fn exec_view(&mut self) -> exec::ExecView<'_> {
        exec::ExecView {
            grants: &self.grants,
            deadline: self.deadline,
            run_limits: self.exec_limits,
        }
    }

    fn http_view(&mut self) -> http::HttpView<'_> {
        http::HttpView {
            grants: &self.grants,
            deadline: self.deadline,
            tls: &self.shared.tls,
            pool: &self.shared.pool,
            tenant: &self.tenant,
            bounds: &self.bounds,
            certs: &self.certs,
        }
    }

    fn grpc_view(&mut self) -> grpc::GrpcView<'_> {
        grpc::GrpcView {
            grants: &self.grants,
            deadline: self.deadline,
            tls: &self.shared.tls,
            bounds: &self.bounds,
            certs: &self.certs,
        }
    }

    fn udp_view(&mut self) -> udp::UdpView<'_> {
        udp::UdpView {
            grants: &self.grants,
            deadline: self.deadline,
            bounds: &self.bounds,
        }
    }

    fn tls_view(&mut self) -> tls::TlsView<'_> {
        tls::TlsView {
            ctx: &mut self.tls,
            table: &mut self.table,
            grants: &self.grants,
            deadline: self.deadline,
            tls: &self.shared.tls,
            bounds: &mut self.bounds,
            certs: &self.certs,
        }
    }
}

// wasmtime-wasi and wasmtime-wasi-http take their views through these
// traits rather than an accessor.
impl WasiView for CallState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: wasi_ctx(&mut self.wasi, &self.grants),
            table: &mut self.table,
        }
    }
}

impl IoView for CallState {
    fn table(&mut self) -> &mut ResourceTable {
        &mut self.table
    }
}

/// The call's WASI context, built now if this is its first use (the call
/// has no `files` grant then: [`CallState::new`] built it otherwise).
fn wasi_ctx<'a>(wasi: &'a mut Option<Wasi>, grants: &Arc<CallGrants>) -> &'a mut WasiCtx {
    let wasi = wasi.get_or_insert_with(|| Wasi::new(grants));
    &mut wasi.ctx
}

impl WasiHttpView for CallState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.wasi_http,
            table: &mut self.table,
            hooks: &mut self.http_hooks,
        }
    }
}

/// Adds every host capability to `linker` (the once-per-process phase).
/// With `files_granted` false, every filesystem path operation is a denial.
pub(crate) fn add_to_linker(linker: &mut Linker<CallState>, files_granted: bool) -> wasmtime::Result<()> {
    wasmtime_wasi::p2::add_to_linker_async(linker)?;
    // The clocks and wasi:io again, on the call's own parts instead of
    // the (lazily built) WASI context.
    linker.allow_shadowing(true);
    wasmtime_wasi_io::add_to_linker_async(linker)?;
    wall_clock::add_to_linker::<_, WasiClocks>(linker, CallState::clocks_view)?;
    monotonic_clock::add_to_linker::<_, WasiClocks>(linker, CallState::clocks_view)?;
    linker.allow_shadowing(false);
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(linker)?;
    sockets::add_to_linker(linker, CallState::sockets_view)?;
    if files_granted {
        filesystem::add_to_linker_guarded(linker, CallState::call_grants, CallState::call_bounds)?;
    } else {
        filesystem::add_to_linker_denying(linker, CallState::filesystem_view)?;
    }
    log::add_to_linker(linker, CallState::log_ctx)?;
    exec::add_to_linker(linker, CallState::exec_view)?;
    http::add_to_linker(linker, CallState::http_view)?;
    grpc::add_to_linker(linker, CallState::grpc_view)?;
    tls::add_to_linker(linker, CallState::tls_view)?;
    tcp::add_to_linker(linker, CallState::tls_view)?;
    icmp::add_to_linker(linker, CallState::tls_view)?;
    udp::add_to_linker(linker, CallState::udp_view)?;
    credentials::add_to_linker(linker, CallState::tls_view)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sonde_policy::grants::Grants;
    use std::path::PathBuf;

    fn state(files: Vec<PathBuf>, empty: &Dir) -> Result<CallState, CallSetupError> {
        let grants = Grants {
            files,
            ..Grants::default()
        };
        CallState::new(
            "p".into(),
            "t".into(),
            Arc::new(CallGrants::new(None, Arc::new(grants), Arc::default())),
            Arc::new(Shared::new(16, crate::host::bounds::HostLimits::default())),
            empty,
            &crate::engine::Limits {
                memory: 1 << 20,
                ..crate::engine::Limits::default()
            },
            How::default(),
        )
    }

    #[test]
    fn the_wasi_context_is_built_at_first_use_unless_files_are_granted() {
        let dir = tempfile::tempdir().unwrap();
        let empty = filesystem::open_empty_dir(dir.path()).unwrap();

        let mut lazy = state(Vec::new(), &empty).unwrap();
        assert!(lazy.wasi.is_none() && lazy.stderr_tail().is_none());
        // The clocks and wasi:io have parts of their own, the clocks built
        // at their first read.
        assert!(lazy.clocks.is_none());
        let _ = lazy.clocks_view();
        assert!(lazy.clocks.is_some());
        let _ = IoView::table(&mut lazy);
        assert!(lazy.wasi.is_none(), "built for the clocks or wasi:io");
        // Anything else builds it, stderr capture included.
        let _ = lazy.sockets_view();
        assert!(lazy.wasi.is_some());

        let granted = state(vec![dir.path().to_path_buf()], &empty).unwrap();
        assert!(granted.wasi.is_some());

        // Opening a granted directory fails when the call starts, named.
        let missing = dir.path().join("missing");
        let err = state(vec![missing.clone()], &empty).err().unwrap();
        assert!(err.to_string().contains(&missing.display().to_string()), "{err}");
    }

    /// A call's state takes its engine's bounds in force when it starts:
    /// the table's capacity, the `fields` size, the exec'd programs'
    /// `pids.max` and the host's share of the memory cap.
    #[test]
    fn a_call_runs_under_its_engines_bounds_in_force_when_it_starts() {
        use crate::host::bounds::HostLimits;
        let dir = tempfile::tempdir().unwrap();
        let empty = filesystem::open_empty_dir(dir.path()).unwrap();
        let shared = Arc::new(Shared::new(16, HostLimits::default()));
        let limits = HostLimits {
            table_entries_per_call: 100,
            fields_bytes: 2048,
            exec_pids: 7,
            ..HostLimits::default()
        };
        shared.set_limits(limits);
        let grants = Arc::new(CallGrants::new(None, Arc::default(), Arc::default()));
        let memory = 64 << 20;
        let limits_of_call = crate::engine::Limits {
            memory,
            ..crate::engine::Limits::default()
        };
        let state = CallState::new(
            "p".into(),
            "t".into(),
            grants,
            shared,
            &empty,
            &limits_of_call,
            How::default(),
        )
        .unwrap();
        assert_eq!(state.exec_limits.pids, 7);
        assert_eq!(*state.bounds.limits(), limits);
        assert_eq!(
            state.memory.cap() as u64,
            memory - limits.host_memory_per_call(),
            "the host's share of 100 × 2 KiB + 4 MiB is taken out"
        );
    }
}
