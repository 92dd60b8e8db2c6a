//! Compiling is a resource too: a component crafted to stress the
//! compiler took 38 s and 2.7 GB in one process. With a [`Compiler::Child`]
//! the engine compiles in a child process (the `sonde` binary's hidden
//! `compile-worker` command) that limits itself with `RLIMIT_DATA` (memory)
//! and `RLIMIT_CPU`, and that the parent kills at the wall-clock budget.
//! The child writes the compiled artifact (to the compile cache, or a
//! private temporary file), and the parent loads it with
//! `Component::deserialize_file`: the agent's own memory never holds the
//! compiler's working set.
//!
//! A component over budget is refused ([`LoadError::OverBudget`]), which
//! the API answers with 422.

use super::LoadError;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// Default wall-clock budget of one compile. sonde's
/// largest built-in plugin compiles in well under a second here; a tenant's
/// plugin gets twenty times that and more.
pub(crate) const DEFAULT_COMPILE_TIMEOUT: Duration = Duration::from_secs(20);
/// Default memory budget of one compile: the child's data limit. Compiling the built-in plugins needs well under 200 MiB.
pub(crate) const DEFAULT_COMPILE_MEMORY: u64 = 1024 * 1024 * 1024;
/// The name of the hidden command that compiles in a child.
pub(crate) const WORKER_COMMAND: &str = "compile-worker";
/// Bytes of the child's stderr kept for the error message.
const STDERR_BYTES: usize = 4 * 1024;

/// The time and memory one compile may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompileBudget {
    /// Wall-clock time, after which the child is killed.
    pub timeout: Duration,
    /// The child's data limit (`RLIMIT_DATA`), in bytes: the heap and
    /// writable mappings the compiler may use.
    pub memory: u64,
}

impl Default for CompileBudget {
    fn default() -> Self {
        Self {
            timeout: DEFAULT_COMPILE_TIMEOUT,
            memory: DEFAULT_COMPILE_MEMORY,
        }
    }
}

/// Where the engine compiles components.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Compiler {
    /// In the engine's own process, unbounded: for tests and tools that
    /// compile only what they trust.
    #[default]
    InProcess,
    /// In a child process running `program compile-worker`, under `budget`.
    Child {
        /// The `sonde` binary.
        program: PathBuf,
        /// The budget of each compile.
        budget: CompileBudget,
    },
}

impl Compiler {
    /// The running `sonde` binary as the compiler, with the default budget;
    /// in-process when the binary cannot be found.
    pub fn this_binary() -> Self {
        match std::env::current_exe() {
            Ok(program) => Self::Child {
                program,
                budget: CompileBudget::default(),
            },
            Err(_) => Self::InProcess,
        }
    }
}

/// Compiles `wasm` in a child process into `out` under `budget`, handing
/// it the component through a file in `scratch`; the child
/// builds the engine configuration of [`super::pool::base_config`], which
/// compiles the same code as the agent's.
pub(crate) async fn in_child(
    plugin: &str,
    program: &Path,
    budget: CompileBudget,
    wasm: &[u8],
    out: &Path,
    scratch: &Path,
) -> Result<(), LoadError> {
    let internal = |what: &str, e: std::io::Error| LoadError::Compile {
        plugin: plugin.to_string(),
        source: wasmtime::Error::msg(format!("{what}: {e}")),
    };
    let input = tempfile::Builder::new()
        .prefix("sonde-compile-")
        .suffix(".wasm")
        .tempfile_in(scratch)
        .map_err(|e| internal("cannot write the component for the compiler", e))?;
    std::fs::write(input.path(), wasm).map_err(|e| internal("cannot write the component for the compiler", e))?;
    // RLIMIT_CPU counts every thread: the compiler runs one per core.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    let cpu = budget.timeout.as_secs().max(1) * cores;
    let mut child = tokio::process::Command::new(program)
        .arg(WORKER_COMMAND)
        .arg("--input")
        .arg(input.path())
        .arg("--output")
        .arg(out)
        .arg("--memory")
        .arg(budget.memory.to_string())
        .arg("--cpu")
        .arg(cpu.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| internal(&format!("cannot start {}", program.display()), e))?;
    // What a killed child may leave half-written (see `write_atomically`).
    let partial = child.id().map(|pid| out.with_extension(format!("tmp{pid}")));
    let result = wait(plugin, &mut child, budget).await;
    if result.is_err()
        && let Some(p) = partial
    {
        let _ = std::fs::remove_file(p);
    }
    result
}

/// Waits for the compiler child within the budget and says how it ended.
async fn wait(plugin: &str, child: &mut tokio::process::Child, budget: CompileBudget) -> Result<(), LoadError> {
    let internal = |what: &str, e: std::io::Error| LoadError::Compile {
        plugin: plugin.to_string(),
        source: wasmtime::Error::msg(format!("{what}: {e}")),
    };
    let mut stderr = child.stderr.take();
    let read_stderr = async {
        let mut buf = Vec::new();
        if let Some(s) = stderr.as_mut() {
            let _ = s.take(STDERR_BYTES as u64).read_to_end(&mut buf).await;
        }
        buf
    };
    let waited = tokio::time::timeout(budget.timeout, async {
        let (status, err) = tokio::join!(child.wait(), read_stderr);
        (status, err)
    })
    .await;
    let over = |what: String| LoadError::OverBudget {
        plugin: plugin.to_string(),
        what,
    };
    let time = || {
        over(format!(
            "compiling took longer than the {} budget",
            humantime::format_duration(budget.timeout)
        ))
    };
    let memory = || {
        over(format!(
            "compiling needed more than the {} memory budget",
            bytesize::ByteSize(budget.memory)
        ))
    };
    let Ok((status, err)) = waited else {
        let _ = child.kill().await;
        return Err(time());
    };
    let status = status.map_err(|e| internal("cannot wait for the compiler", e))?;
    let err = String::from_utf8_lossy(&err);
    if status.success() {
        return Ok(());
    }
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(EXIT_COMPILE_ERROR), _) => Err(LoadError::Compile {
            plugin: plugin.to_string(),
            source: wasmtime::Error::msg(err.trim().to_string()),
        }),
        (_, Some(SIGXCPU | SIGKILL)) => Err(time()),
        _ if reads_as_out_of_memory(&err) => Err(memory()),
        (_, Some(SIGABRT)) => Err(memory()),
        _ => Err(LoadError::Compile {
            plugin: plugin.to_string(),
            source: wasmtime::Error::msg(format!("the compiler failed ({status}): {}", err.trim())),
        }),
    }
}

/// Whether the compiler's stderr says it ran out of memory: Rust's
/// allocation-failure message ("memory allocation of N bytes failed"), or
/// a mapping the OS refused (ENOMEM, "Cannot allocate memory"). The child
/// is another process, so no error type crosses: its text is all there is
/// (the tests pin the OS's).
fn reads_as_out_of_memory(stderr: &str) -> bool {
    stderr.contains("memory allocation") || stderr.contains("out of memory") || stderr.contains("Cannot allocate")
}

// Linux's numbers: SIGXCPU at the soft CPU limit, SIGKILL at the hard one,
// SIGABRT from Rust's allocation-failure handler.
const SIGXCPU: i32 = 24;
const SIGKILL: i32 = 9;
const SIGABRT: i32 = 6;

/// The exit code of a worker whose component does not compile.
const EXIT_COMPILE_ERROR: i32 = 2;

/// What the worker is asked to do.
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    /// The component to compile.
    #[arg(long)]
    input: PathBuf,
    /// Where to write the compiled artifact.
    #[arg(long)]
    output: PathBuf,
    /// The data limit, in bytes.
    #[arg(long)]
    memory: u64,
    /// The CPU-time limit, in seconds.
    #[arg(long)]
    cpu: u64,
}

/// The hidden `compile-worker` command: limits itself, compiles the input
/// with the engine configuration of an agent, writes the artifact
/// atomically. Returns the exit code.
pub fn worker(args: WorkerArgs) -> i32 {
    use rustix::process::{Resource, Rlimit, setrlimit};
    let limit = |resource, soft: u64, hard: u64| {
        setrlimit(
            resource,
            Rlimit {
                current: Some(soft),
                maximum: Some(hard),
            },
        )
    };
    // The hard CPU limit a little past the soft one: SIGXCPU first, then
    // SIGKILL if it is caught or ignored.
    if let Err(e) =
        limit(Resource::Data, args.memory, args.memory).and_then(|()| limit(Resource::Cpu, args.cpu, args.cpu + 1))
    {
        eprintln!("cannot limit the compiler: {e}");
        return 1;
    }
    let wasm = match std::fs::read(&args.input) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("cannot read {}: {e}", args.input.display());
            return 1;
        }
    };
    let engine = match wasmtime::Engine::new(&super::pool::base_config()) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("cannot set up the compiler: {e:#}");
            return 1;
        }
    };
    let bytes = match engine.precompile_component(&wasm) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("{e:#}");
            return EXIT_COMPILE_ERROR;
        }
    };
    match super::cache::write_atomically(&args.output, &bytes) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("cannot write {}: {e}", args.output.display());
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allocation_the_os_refuses_reads_as_out_of_memory() {
        let enomem = std::io::Error::from_raw_os_error(rustix::io::Errno::NOMEM.raw_os_error());
        assert!(
            reads_as_out_of_memory(&format!("cannot set up the compiler: {enomem}")),
            "{enomem}"
        );
        assert!(!reads_as_out_of_memory("failed to parse WebAssembly module"));
    }
}
