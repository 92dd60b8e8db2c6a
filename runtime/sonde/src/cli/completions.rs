//! `sonde completions` and `sonde man`: shell completions and manual pages
//! generated from the clap definitions, so they never drift from `--help`.

use super::error::CliError;
use clap::Args;
use std::path::PathBuf;

/// Arguments of `sonde completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell: bash, zsh, fish, elvish or powershell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Arguments of `sonde man`.
#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write sonde.1 and a page per subcommand (sonde-run.1, …) into DIR instead of printing sonde.1.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// Prints the completion script for `args.shell` on stdout.
/// `cmd` is the whole `sonde` command.
pub(super) fn completions(args: CompletionsArgs, mut cmd: clap::Command) -> Result<i32, CliError> {
    clap_complete::generate(args.shell, &mut cmd, "sonde", &mut std::io::stdout());
    Ok(0)
}

/// Prints `sonde.1` on stdout, or writes every page into `--dir`.
/// `cmd` is the whole `sonde` command.
pub(super) fn man(args: ManArgs, cmd: clap::Command) -> Result<i32, CliError> {
    match args.dir {
        Some(dir) => {
            std::fs::create_dir_all(&dir)
                .and_then(|()| clap_mangen::generate_to(cmd, &dir))
                .map_err(|e| {
                    CliError::Message(format!(
                        "cannot write manual pages into {}: {e}; choose a writable directory with --dir",
                        dir.display()
                    ))
                })?;
            Ok(0)
        }
        None => {
            let mut out = Vec::new();
            clap_mangen::Man::new(cmd).render(&mut out).map_err(|e| {
                CliError::Message(format!(
                    "cannot render the manual page: {e}; please report this as a bug"
                ))
            })?;
            use std::io::Write;
            std::io::stdout()
                .write_all(&out)
                .map_err(|e| CliError::Message(format!("cannot write the manual page: {e}; is stdout closed?")))?;
            Ok(0)
        }
    }
}
