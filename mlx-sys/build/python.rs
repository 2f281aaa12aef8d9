//! Python 3, which the build uses for pip (MLX's wheels, libclang, OpenBLAS) and for
//! `python3 -m mlx`.

use std::env;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
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

/// Why [`install_once`] failed.
pub enum InstallError {
    /// pip failed; its error output.
    Pip(String),
    /// The cache could not be written.
    Cache(String),
}

/// `pip install`s `requirements` into `cache/name` once: staged in `name.partial`, renamed into
/// place and marked complete, so that an interrupted build never leaves a half-installed wheel
/// that a later build would take. Later builds reuse it. Returns `cache/name`.
pub fn install_once(
    cache: &Path,
    name: &str,
    requirements: &[&str],
    with_deps: bool,
) -> Result<PathBuf, InstallError> {
    let root = cache.join(name);
    let marker = root.join(".complete");
    if marker.is_file() {
        return Ok(root);
    }
    let staging = cache.join(format!("{name}.partial"));
    let _ = fs::remove_dir_all(&staging);
    pip_install(requirements, &staging, with_deps).map_err(InstallError::Pip)?;
    let _ = fs::remove_dir_all(&root);
    fs::rename(&staging, &root)
        .and_then(|()| fs::write(&marker, requirements.join("\n")))
        .map_err(|err| {
            InstallError::Cache(format!("cannot install into {}: {err}", root.display()))
        })?;
    Ok(root)
}
