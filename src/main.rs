//! The `lmx` command: see `lmx --help`.

mod cli;

fn main() -> std::process::ExitCode {
    #[cfg(unix)]
    end_quietly_on_a_closed_pipe();
    match cli::run(cli::Cli::parse_noting_given()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // A run stopped by a signal is no error: it says where it stopped, and exits as the
        // signal would have.
        Err(err) => match err.downcast_ref::<cli::Interrupted>() {
            Some(interrupted) => {
                eprintln!("{interrupted}");
                interrupted.exit_code()
            }
            None => {
                eprintln!("error: {err:#}");
                std::process::ExitCode::FAILURE
            }
        },
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
