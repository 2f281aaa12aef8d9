//! The `lmx` command: see `lmx --help`.

mod cli;

use clap::Parser;

fn main() -> std::process::ExitCode {
    match cli::run(cli::Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
