//! The `daylog` binary: parse the command line, load `.env`, hand over to the library.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // `cli::main` loads `.env` first; it never overrides a variable that is really set.
    daylog::cli::main(daylog::cli::Cli::parse())
}
