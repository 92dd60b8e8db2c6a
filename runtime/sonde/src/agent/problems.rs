//! What stops `sonde run` from starting: a config it refuses,
//! and every other start error, each with what to do about it.

use super::*;

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The config is invalid.
    #[error("{0}")]
    Config(ConfigErrors),
    /// The config is valid, but what it asks for cannot start this way
    /// (`start_problems`: `sonde validate` says the same).
    #[error("{}", StartProblem::list(.0))]
    Refused(Vec<StartProblem>),
    /// The executor's threads could not be started.
    #[error("{source}; the system refused a thread: check the user's process limits (ulimit -u)")]
    Executor {
        /// Why.
        source: Box<sonde_core::executor::ExecutorError>,
    },
    /// The API could not listen on its address.
    #[error(
        "{source}; is another sonde (or another program) serving there? Stop it, or choose another address with --api or the file's `api`"
    )]
    Listen {
        /// Why.
        source: api::ApiError,
    },
    /// The state dir could not be opened.
    #[error(
        "{source}; give a directory this user can write and no other sonde uses (--state-dir or the file's state_dir)"
    )]
    StateDir {
        /// Why.
        source: Box<sonde_core::results::store::StoreError>,
    },
    /// How the API authenticates cannot be settled.
    #[error("{source}")]
    ApiAuth {
        /// Why.
        source: sonde_core::auth::ApiAuthError,
    },
    /// The API's `auth: kubernetes` has no API server to review callers.
    #[error("api: auth kubernetes: {source}")]
    Reviews {
        /// Why.
        source: Box<kubernetes::ConnectError>,
    },
    /// The `kubernetes:` block cannot be used.
    #[error("{file}{source}")]
    GateSettings {
        /// The config file, with `: `, when there is one.
        file: String,
        /// What is wrong.
        source: Box<kubernetes::GateSettingsError>,
    },
    /// No API server for the readiness gates.
    #[error("{source}")]
    Kubernetes {
        /// Why.
        source: Box<kubernetes::ConnectError>,
    },
    /// The OTLP export could not start.
    #[error("otlp: {source}")]
    Otlp {
        /// Why.
        source: sonde_otel::TransportError,
    },
    /// The agent cannot handle signals.
    #[error("cannot handle signals: {source}; please report this as a bug")]
    Signals {
        /// Why.
        source: std::io::Error,
    },
}

/// Something `sonde run` refuses at start in a config that loads: what
/// `start_problems` finds, `sonde run` and `sonde validate` alike.
#[derive(Debug, thiserror::Error)]
pub enum StartProblem {
    /// The API would answer without a token where anyone can reach it, or
    /// a token is asked for (`--api-auth token`) and none is configured.
    #[error("{source}")]
    ApiAuth {
        /// Where the API would listen.
        addr: SocketAddr,
        /// What [`ApiAuth::resolve`] said.
        source: sonde_core::auth::ApiAuthError,
    },
    /// Readiness gates would be served (a `kubernetes:` block, or
    /// `--kubernetes`) with settings that cannot work.
    #[error("{file}{source}")]
    Kubernetes {
        /// The config file and `: `, or nothing for the embedded default.
        file: String,
        /// What is wrong.
        source: Box<kubernetes::GateSettingsError>,
    },
    /// An `otlp:` block's TLS files or secret headers cannot be used.
    #[error("{file}{tenant}{source}")]
    Otlp {
        /// The config file and `: `, or nothing for the embedded default.
        file: String,
        /// `tenant "acme": ` for a tenant's block, else nothing.
        tenant: String,
        /// What is wrong.
        source: sonde_otel::TransportError,
    },
}

impl StartProblem {
    /// The problems, one a line.
    pub fn list(problems: &[StartProblem]) -> String {
        problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n")
    }
}

/// What `sonde run` was asked besides the config file that decides
/// whether it can start ([`start_problems`]).
#[derive(Clone, Debug)]
pub(crate) struct StartOptions {
    /// `--api`: overrides the file's `api`.
    pub api: Option<SocketAddr>,
    /// `--api-auth`.
    pub api_auth: ApiAuth,
    /// Whether readiness gates are served: `Some` for `sonde run`, with
    /// `--kubernetes` and `$NODE_NAME`; `None` for an agent that serves
    /// none (the library's [`Agent::start`]), whose `kubernetes:` block is
    /// then not checked.
    pub kubernetes: Option<KubernetesStart>,
}

/// How `sonde run` would serve readiness gates.
#[derive(Clone, Debug, Default)]
pub struct KubernetesStart {
    /// `--kubernetes`: serve them without a `kubernetes:` block.
    pub forced: bool,
    /// `$NODE_NAME`, where the block names no node.
    pub node_name: Option<String>,
}

/// Everything `sonde run` refuses at start in a config that loads: the one
/// place these rules live, called by [`Agent::start`] (which refuses to
/// start on any) and by `sonde validate` (which reports them as errors), so
/// the two cannot disagree. Empty when the agent can start.
///
/// What is left to the start itself, because only running finds it: a
/// state directory another sonde holds, an address already in use, the
/// API server out of reach.
pub(crate) fn start_problems(catalog: &Catalog, options: &StartOptions) -> Vec<StartProblem> {
    let mut problems = Vec::new();
    if let Some(addr) = options.api.or(catalog.agent.api)
        && let Err(why) = options.api_auth.or_file(catalog.agent.api_auth).resolve(
            addr,
            catalog.tenants.has_tokens(),
            catalog.tenants.len() > 1,
        )
    {
        problems.push(StartProblem::ApiAuth { addr, source: why });
    }
    if let Some(k) = &options.kubernetes
        && (k.forced || catalog.agent.kubernetes.is_some())
        && let Err(source) = kubernetes::GateSettings::new(catalog.agent.kubernetes.as_ref(), k.node_name.clone())
    {
        problems.push(StartProblem::Kubernetes {
            file: catalog
                .source
                .as_ref()
                .map_or(String::new(), |p| format!("{}: ", p.display())),
            source: source.into(),
        });
    }
    for otlp in catalog.agent.otlp.all() {
        if let Err(source) = sonde_otel::Transport::metrics(otlp) {
            problems.push(StartProblem::Otlp {
                file: catalog
                    .source
                    .as_ref()
                    .map_or(String::new(), |p| format!("{}: ", p.display())),
                tenant: otlp
                    .tenant
                    .as_ref()
                    .map_or(String::new(), |t| format!("tenant {:?}: ", &*t.id)),
                source,
            });
        }
    }
    problems
}
