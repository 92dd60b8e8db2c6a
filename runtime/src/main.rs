//! The `sonde` command: parses the command line and hands over to the library.

use clap::Parser;

fn main() {
    let cli = sonde_runtime::cli::Cli::parse();
    std::process::exit(sonde_runtime::cli::main(cli));
}
