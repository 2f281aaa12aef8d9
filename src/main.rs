//! The `lmx` command: see `lmx --help`.

mod cli;

use clap::Parser;

fn main() -> std::process::ExitCode {
    #[cfg(unix)]
    end_quietly_on_a_closed_pipe();
    match cli::run(cli::Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Makes a closed pipe end the program quietly, as it ends any Unix command (`lmx bench report
/// runs.jsonl | head`): Rust starts programs with SIGPIPE ignored, so printing to a closed pipe
/// would panic instead.
#[cfg(unix)]
fn end_quietly_on_a_closed_pipe() {
    // SAFETY: called first in `main`, before any other thread exists, and it only restores the
    // signal's default action.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
