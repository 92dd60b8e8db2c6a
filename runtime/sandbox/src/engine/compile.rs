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
//!
//! The time budget scales with the component's size
//! ([`CompileBudget::timeout_for`]): a base, plus so much per MiB, capped.
//! A Python or JavaScript component carries its interpreter (12-19 MB) and
//! takes 10-40 s to compile on a small shared machine, where a Rust plugin
//! of 200 kB takes under a second; the cap keeps a padded component from
//! buying an unbounded compile.

use super::LoadError;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// Default wall-clock budget of one compile, before its share by size.
/// sonde's largest built-in plugin compiles in well under a second here; a
/// tenant's plugin gets twenty times that and more.
pub(crate) const DEFAULT_COMPILE_TIMEOUT: Duration = Duration::from_secs(20);
/// Default time added to the budget per MiB of component: an 18 MB Python
/// component (CPython inside) took 11-37 s to compile on a 2-core machine
/// under load, and gets 20 s + 17.8 x 5 s = 109 s.
pub(crate) const DEFAULT_COMPILE_TIMEOUT_PER_MIB: Duration = Duration::from_secs(5);
/// Default cap of the scaled budget, reached at 20 MiB.
pub(crate) const DEFAULT_COMPILE_TIMEOUT_MAX: Duration = Duration::from_secs(120);
/// Default memory budget of one compile: the child's data limit. Compiling the built-in plugins needs well under 200 MiB.
pub(crate) const DEFAULT_COMPILE_MEMORY: u64 = 1024 * 1024 * 1024;
/// The name of the hidden command that compiles in a child.
pub(crate) const WORKER_COMMAND: &str = "compile-worker";
/// Bytes of the child's stderr kept for the error message.
const STDERR_BYTES: usize = 4 * 1024;

/// The time and memory one compile may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompileBudget {
    /// Wall-clock time of any compile (the base of [`Self::timeout_for`]),
    /// after which the child is killed.
    pub timeout: Duration,
    /// Wall-clock time added per MiB of component.
    pub timeout_per_mib: Duration,
    /// The most wall-clock time any compile gets, whatever its size (never
    /// less than `timeout`).
    pub max_timeout: Duration,
    /// The child's data limit (`RLIMIT_DATA`), in bytes: the heap and
    /// writable mappings the compiler may use.
    pub memory: u64,
}

impl Default for CompileBudget {
    fn default() -> Self {
        Self {
            timeout: DEFAULT_COMPILE_TIMEOUT,
            timeout_per_mib: DEFAULT_COMPILE_TIMEOUT_PER_MIB,
            max_timeout: DEFAULT_COMPILE_TIMEOUT_MAX,
            memory: DEFAULT_COMPILE_MEMORY,
        }
    }
}

impl CompileBudget {
    /// A budget of `timeout` whatever the component's size.
    pub fn fixed(timeout: Duration, memory: u64) -> Self {
        Self {
            timeout,
            timeout_per_mib: Duration::ZERO,
            max_timeout: timeout,
            memory,
        }
    }

    /// The wall-clock budget of compiling a component of `bytes`:
    /// `timeout + timeout_per_mib x bytes / MiB`, at most `max_timeout`
    /// (and never less than `timeout`).
    pub fn timeout_for(&self, bytes: usize) -> Duration {
        let mib = bytes as f64 / (1024.0 * 1024.0);
        let share = Duration::try_from_secs_f64(self.timeout_per_mib.as_secs_f64() * mib).unwrap_or(Duration::MAX);
        self.timeout
            .saturating_add(share)
            .min(self.max_timeout.max(self.timeout))
    }

    /// This budget for a component of `bytes`: its time scaled and fixed.
    fn for_size(&self, bytes: usize) -> Self {
        Self::fixed(self.timeout_for(bytes), self.memory)
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

/// Compiles `wasm` in a child process into `out` under `budget` (scaled to
/// `wasm`'s size), handing
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
    let budget = budget.for_size(wasm.len());
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
    let cpu = budget.timeout.as_secs().max(1).saturating_mul(cores);
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

    const MIB: usize = 1024 * 1024;

    #[test]
    fn the_time_budget_scales_with_the_size_and_is_capped() {
        let budget = CompileBudget::default();
        let secs = |bytes: usize| budget.timeout_for(bytes).as_secs_f64();
        assert_eq!(secs(0), 20.0);
        assert_eq!(secs(200 * 1024).round(), 21.0, "a Rust plugin");
        assert_eq!(secs(12 * MIB), 80.0, "a JavaScript component");
        assert_eq!(secs(18 * MIB), 110.0, "a Python component");
        assert_eq!(secs(20 * MIB), 120.0);
        assert_eq!(secs(21 * MIB), 120.0, "capped");
        assert_eq!(secs(usize::MAX), 120.0, "capped");
        assert!(secs(MIB) < secs(2 * MIB));
    }

    #[test]
    fn the_cap_never_lowers_the_base_and_a_fixed_budget_does_not_scale() {
        let budget = CompileBudget {
            timeout: Duration::from_secs(30),
            max_timeout: Duration::from_secs(10),
            ..CompileBudget::default()
        };
        assert_eq!(budget.timeout_for(100 * MIB), Duration::from_secs(30));
        let fixed = CompileBudget::fixed(Duration::from_secs(4), 1);
        assert_eq!(fixed.timeout_for(0), fixed.timeout_for(100 * MIB));
        let huge = CompileBudget {
            timeout_per_mib: Duration::MAX,
            max_timeout: Duration::MAX,
            ..CompileBudget::default()
        };
        assert_eq!(huge.timeout_for(2 * MIB), Duration::MAX, "saturates");
        assert_eq!(
            CompileBudget::default().for_size(18 * MIB).timeout,
            Duration::from_secs(110)
        );
    }

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
