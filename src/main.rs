//! The `daylog` binary: parse the command line, load `.env`, hand over to the library.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // `.env` never overrides a variable that is really set (dotenvy's rule).
    let _ = dotenvy::dotenv();
    daylog::cli::main(daylog::cli::Cli::parse())
}
