//! Python 3, which the build uses for pip (MLX's wheels, libclang) and for `python3 -m mlx`.

use std::env;
use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, Output};

/// The interpreter: `PYTHON` if set, else `python3`.
pub fn interpreter() -> OsString {
    env::var_os("PYTHON").unwrap_or_else(|| "python3".into())
}

/// Runs the interpreter with `args`; `None` when it cannot be started.
pub fn run(args: &[&str]) -> Option<Output> {
    Command::new(interpreter()).args(args).output().ok()
}

/// `pip install` of `requirements` (no dependencies unless `with_deps`) into `target`.
/// Returns pip's error output on failure.
pub fn pip_install(requirements: &[&str], target: &Path, with_deps: bool) -> Result<(), String> {
    let target = target.to_string_lossy();
    let mut args = vec![
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--only-binary=:all:",
        "--upgrade",
        "--target",
        &target,
    ];
    if !with_deps {
        args.push("--no-deps");
    }
    args.extend_from_slice(requirements);
    match run(&args) {
        None => Err(format!("cannot run {}", interpreter().to_string_lossy())),
        Some(output) if output.status.success() => Ok(()),
        Some(output) => Err(String::from_utf8_lossy(&output.stderr).trim().to_owned()),
    }
}
