//! How a command writes what it prints on stdout.

use clap::ValueEnum;

/// How results are printed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// One line for a person, then the metrics.
    #[default]
    Text,
    /// One JSON object.
    Json,
}

/// Writes a command's output on stdout. A reader that closed the pipe
/// (`sonde … | head`) ends the command quietly with exit 0, as it ends a
/// C tool, instead of the panic `println!` makes of it; any other write
/// error is one line and exit 3.
pub(crate) fn write_out(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout.write_fmt(args).and_then(|()| stdout.flush()) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => {
            eprintln!("sonde: cannot write to stdout: {e}");
            std::process::exit(3);
        }
    }
}
