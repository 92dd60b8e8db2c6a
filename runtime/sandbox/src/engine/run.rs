//! One call of a plugin: its store, its `describe` or `check`, and what
//! became of it (a trap, a host bound, the deadline) as a [`RunResult`].

use super::limits::MAX_MESSAGE_BYTES;
use super::store::{CallSetupError, CallState, How};
use super::{Engine, Limits, Plugin, PluginInfo, no_tenant};
use crate::bindings::{self, sonde::probe::types as wit};
use crate::host::{self, Grants, NetPattern};
use crate::verdict::from_wit::{from_outcome, probe_error};
use crate::verdict::{Reason, RunResult, plugin_text, truncate};
use sonde_policy::grants::CallGrants;
use std::sync::Arc;
use std::time::Instant;
use wasmtime::{Store, Trap, UpdateDeadline};

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
    /// Whether the host records everything it sees of the call's
    /// connections ([`crate::verdict::Observed`]), as `GET /probe`'s
    /// answer reads it: a response's version, length and dates. Without
    /// it (a scheduled run) only what the run's cause and its span read is
    /// kept: lookups, addresses, phases, responses counted.
    pub observe: bool,
}

/// Why a plugin's `describe` gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum DescribeError {
    /// Its sandbox could not be set up.
    #[error(transparent)]
    Setup(#[from] CallSetupError),
    /// The engine is shutting down.
    #[error("the engine is shutting down")]
    ShuttingDown,
    /// No answer within the default call deadline.
    #[error("no answer within {}", humantime::format_duration(*.0))]
    Timeout(std::time::Duration),
    /// It trapped: what went wrong, with what the plugin said on stderr.
    #[error("{0}")]
    Trapped(String),
    /// It tried something no plugin is granted while describing itself.
    #[error("{0}")]
    Denied(String),
}

impl Engine {
    /// The store of one call of `probe` for `tenant`: its state (the
    /// grants, the memory cap, the deadline `limits.timeout` from now) and
    /// its fuel, hostcall fuel and epoch deadline. Fails when a `files`
    /// grant cannot be opened.
    pub(super) fn call_store(
        &self,
        probe: &str,
        tenant: &Arc<str>,
        grants: Arc<CallGrants>,
        limits: &Limits,
        how: How<'_>,
    ) -> Result<Store<CallState>, CallSetupError> {
        let state = CallState::new(
            probe.into(),
            tenant.clone(),
            grants,
            self.inner.host.clone(),
            &self.inner.empty_dir,
            limits,
            how,
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

    pub(super) async fn describe(&self, pre: &bindings::PluginPre<CallState>) -> Result<PluginInfo, DescribeError> {
        let limits = Limits::default();
        let grants = Arc::new(CallGrants::new(None, Arc::default(), self.own_listeners().clone()));
        let mut store = self.call_store("describe", &no_tenant(), grants.clone(), &limits, How::default())?;
        let _slot = self
            .inner
            .slots
            .acquire()
            .await
            .map_err(|_| DescribeError::ShuttingDown)?;
        let _ticking = self.inner.ticker.busy();
        let call = async {
            let instance = pre.instantiate_async(&mut store).await?;
            instance.call_describe(&mut store).await
        };
        match tokio::time::timeout(limits.timeout, call).await {
            Err(_) => Err(DescribeError::Timeout(limits.timeout)),
            Ok(Err(e)) => Err(DescribeError::Trapped(trap_message(&e, &store))),
            Ok(Ok(info)) => match grants.denial_message() {
                Some(denial) => Err(DescribeError::Denied(denial)),
                None => Ok(info.into()),
            },
        }
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
        self.run_traced(tenant, plugin, call, None).await
    }

    /// [`Engine::run_for`], its HTTP and gRPC requests carrying `trace` as
    /// their `traceparent` when given; the result's observations say so.
    pub async fn run_traced(
        &self,
        tenant: &Arc<str>,
        plugin: &Plugin,
        call: &Call<'_>,
        trace: Option<crate::verdict::observed::TraceContext>,
    ) -> RunResult {
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
        let how = How {
            trace: trace.as_ref(),
            observe: call.observe,
        };
        let mut store = match self.call_store(call.probe, tenant, grants.clone(), &call.limits, how) {
            Ok(s) => s,
            Err(e) => return RunResult::error(Reason::Internal, e.to_string()),
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
        // whatever the plugin made of it. A trap after a denial is named
        // too: an interpreter's traceback reads its source files, so the
        // denial may be only the echo of the bug that stopped the plugin.
        if let Some(mut message) = grants.denial_message() {
            if result.reason == Some(Reason::Trap) {
                message = truncate(format!("{message}; then {}", result.message), MAX_MESSAGE_BYTES);
            }
            result = RunResult::error(Reason::Denied, message);
        } else if let Some(why) = store.data().bounds.breach() {
            result = RunResult::error(Reason::HostLimit, why.to_string());
        }
        if let Some(s) = grants.scrubber() {
            s.string(&mut result.message);
            if let Some(detail) = &mut result.detail {
                s.string(detail);
            }
        }
        result.duration = duration;
        result.observed = store.data().bounds.take_observed();
        if trace.is_some() {
            result.observed.get_or_insert_default().trace = trace;
        }
        result.fuel_consumed = call.limits.fuel.saturating_sub(store.get_fuel().unwrap_or(0));
        result.memory_bytes = store.data().memory.peak() as u64;
        result
    }
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
