//! The `sonde` command line. Exit codes follow the Nagios convention:
//! 0 success, 1 warning, 2 failure, 3 unknown or error.

/// `println!` for what a command prints on stdout ([`write_out`](output::write_out)).
macro_rules! out {
    () => {
        $crate::cli::output::write_out(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::cli::output::write_out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` for the same, without the newline.
macro_rules! out_part {
    ($($arg:tt)*) => {
        $crate::cli::output::write_out(format_args!($($arg)*))
    };
}

mod args;
mod bench;
mod check;
pub mod client;
mod command;
mod completions;
pub mod effective;
mod error;
mod load;
mod modules;
mod output;
mod plugin;
mod run;
mod scaffold;

use sonde_sandbox::engine::EngineConfig;

pub use crate::build::VERSION;
pub use command::{Cli, Command, LogFormat};
pub use error::CliError;
pub use output::Output;

/// Runs the command and returns the process exit code. Logging is the
/// binary's to set up (`main.rs`), before this.
pub fn main(cli: Cli) -> i32 {
    // The compiler child needs no async runtime (and no threads of one
    // counted against its limits).
    if let Command::CompileWorker(args) = cli.command {
        return sonde_sandbox::engine::compile::worker(args);
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sonde: cannot start the async runtime: {e}");
            return 3;
        }
    };
    let code = match runtime.block_on(dispatch(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sonde: {e}");
            3
        }
    };
    // Dropping the runtime would wait for every blocking thread, and one
    // may never return (a plugin's file read, a lookup against a dead
    // resolver): the command has its answer, so it exits now.
    runtime.shutdown_background();
    code
}

async fn dispatch(cli: Cli) -> Result<i32, CliError> {
    // Plugins are compiled in a child under a time and memory budget.
    let mut compiler = sonde_sandbox::engine::Compiler::this_binary();
    if let sonde_sandbox::engine::Compiler::Child { budget, .. } = &mut compiler {
        budget.timeout = cli.compile_timeout;
        budget.timeout_per_mib = cli.compile_timeout_per_mib;
        budget.max_timeout = cli.compile_timeout_max;
    }
    let config = EngineConfig {
        cache_dir: if cli.no_cache {
            None
        } else {
            cli.cache_dir.clone().or_else(sonde_sandbox::engine::cache::default_dir)
        },
        compiler,
        ..EngineConfig::default()
    };
    match cli.command {
        Command::Check(args) => check::run(config, args).await,
        Command::Plugin(cmd) => plugin::run(config, cmd).await,
        Command::Run(args) => run::run(config, args).await,
        Command::Validate(args) => run::validate(config, args).await,
        Command::Modules(cmd) => modules::run(cmd),
        Command::Status(args) => run::status(args).await,
        Command::Bench(args) => bench::run(config, args).await,
        Command::Completions(args) => completions::completions(args, <Cli as clap::CommandFactory>::command()),
        Command::Man(args) => completions::man(args, <Cli as clap::CommandFactory>::command()),
        Command::CompileWorker(args) => Ok(sonde_sandbox::engine::compile::worker(args)),
    }
}
