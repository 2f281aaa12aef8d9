//! One way for the build script to stop: a message a person can act on, no backtrace.

/// Prints `message` as the build script's error and exits.
pub fn with(message: impl std::fmt::Display) -> ! {
    eprintln!("\nerror: mlx-sys: {message}\n");
    std::process::exit(1)
}
