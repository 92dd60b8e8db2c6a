//! What can go wrong in a command, each printed as one line (exit code 3).

use std::path::{Path, PathBuf};

/// A command-line error: printed as one line, exit code 3. A library's
/// error keeps its type (and its sources); `Message` is only for what the
/// command itself says of what it was given, with what to do.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// What the command found wrong in what it was given (a flag, a name,
    /// a value, the agent's answer), said for the user with what to do.
    #[error("{0}")]
    Message(String),
    /// A file or directory that could not be read or written.
    #[error("{}: {source}; {}", path.display(), what_to_do(source))]
    File {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The engine could not start.
    #[error(transparent)]
    Engine(#[from] sonde_sandbox::engine::EngineError),
    /// A target or grant given on the command line that is not one.
    #[error(transparent)]
    Grant(#[from] sonde_policy::GrantError),
    /// The agent's API could not be asked.
    #[error(transparent)]
    Client(#[from] super::client::ClientError),
    /// A plugin the engine would not load.
    #[error(transparent)]
    Load(#[from] sonde_sandbox::engine::LoadError),
    /// A registry exchange, a reference or the OCI cache.
    #[error(transparent)]
    Oci(#[from] sonde_oci::OciError),
    /// A signature or key.
    #[error(transparent)]
    Signature(#[from] sonde_oci::signing::SignatureError),
    /// The agent could not start or stopped on an error.
    #[error(transparent)]
    Agent(#[from] crate::agent::AgentError),
    /// A config file that does not load.
    #[error(transparent)]
    Config(#[from] sonde_core::config::ConfigErrors),
}

impl CliError {
    /// A file that could not be read or written, with what to check.
    pub(crate) fn file(path: &Path, e: std::io::Error) -> Self {
        Self::File {
            path: path.to_path_buf(),
            source: e,
        }
    }
}

/// What to check when a file could not be used.
fn what_to_do(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::NotFound => "check the path",
        std::io::ErrorKind::PermissionDenied => "check that this user may use it (ls -l)",
        _ => "check the path and the disk",
    }
}
