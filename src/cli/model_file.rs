//! `--model path/to/file.lmx` for a model this program does not hold: the file is compiled into a
//! crate of its own (as `lmx new` writes one) in a cache folder keyed by the file's source, built
//! once with cargo in release mode, and the same command line runs in its binary. The generated
//! code is the fast path: after the first build, a file trains as fast as a bundled model.

use super::new::{self, CrateFiles};
use super::resolve::ModelFile;
use std::hash::Hasher;
use std::path::PathBuf;
use std::process::Command;

/// Set in the environment of a program built for a file: a program that still does not hold the
/// file's model (it changed meanwhile) stops instead of building again.
const BUILT_FOR_A_FILE: &str = "LMX_BUILT_FOR_FILE";

/// Builds (or finds) the program for `file` and runs this process's command line in it: on Unix
/// the program replaces this process, so its exit status and signals are the command's.
pub fn run_in_built_program(file: &ModelFile) -> anyhow::Result<()> {
    if std::env::var_os(BUILT_FOR_A_FILE).is_some() {
        anyhow::bail!(
            "{} changed while lmx built a program for it: run the command again",
            file.path.display()
        );
    }
    let program = build(file)?;
    let mut command = Command::new(&program);
    command
        .args(std::env::args_os().skip(1))
        .env(BUILT_FOR_A_FILE, &file.path);
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        let err = command.exec();
        anyhow::bail!("cannot run {}: {err}", program.display())
    }
    #[cfg(not(unix))]
    {
        let status = command
            .status()
            .map_err(|err| anyhow::anyhow!("cannot run {}: {err}", program.display()))?;
        std::process::exit(status.code().unwrap_or(1))
    }
}

/// The program for `file`, built in release mode: in `CACHE/models/NAME-HASH/` (HASH: the
/// source's), with its target folder `CARGO_TARGET_DIR` if set, else `CACHE/target`, shared by
/// every file's crate so that lmx and its dependencies build once. Cargo rebuilds it when lmx
/// itself changed.
fn build(file: &ModelFile) -> anyhow::Result<PathBuf> {
    let lmx = new::lmx_checkout(std::env::var_os("LMX_SOURCE").as_deref().map(AsRef::as_ref))
        .map_err(|err| {
            anyhow::anyhow!(
                "{}: training a .lmx file that this program does not hold builds a program for \
                 it against lmx's source, which must be at hand (set LMX_SOURCE to an lmx \
                 checkout): {err}",
                file.path.display()
            )
        })?;
    // The file's first step is its default; the program registers the others by name through it.
    let checked = lmx_grammar::check_source(&file.path.display().to_string(), &file.source)
        .map_err(|rendered| anyhow::anyhow!("{rendered}"))?;
    let first = checked.steps.first().ok_or_else(|| {
        anyhow::anyhow!(
            "{} declares no step: nothing to train (a model's steps are `step NAME(...) {{ ... }}`)",
            file.path.display()
        )
    })?;
    let default_step = format!(
        "{}::{}",
        file.name,
        lmx_grammar::codegen::step_type_name(&first.name)
    );
    let cache = cache_dir()?;
    let package = format!("lmx-model-{}-{:016x}", file.name, source_hash(&file.source));
    let dir = cache.join("models").join(&package);
    if !dir.join("Cargo.toml").is_file() {
        let written = new::write_crate(
            &dir,
            &CrateFiles {
                package: package.clone(),
                lmx,
                models: vec![(format!("{}.lmx", file.name), file.source.clone())],
                registered: vec![default_step],
                // The command runs in the caller's folder: its data paths are the caller's.
                corpus: false,
            },
        );
        // Another lmx may have written the same crate meanwhile: then it is there to build.
        if !dir.join("Cargo.toml").is_file() {
            written?;
        }
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache.join("target"));
    eprintln!(
        "building {} into a program of its own ({}; the first build takes minutes)",
        file.path.display(),
        dir.display()
    );
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(&cargo)
        .args(["build", "--release", "--manifest-path"])
        .arg(dir.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .map_err(|err| {
            anyhow::anyhow!(
                "cannot run cargo ({}) to build {}: {err}",
                PathBuf::from(&cargo).display(),
                file.path.display()
            )
        })?;
    if !status.success() {
        anyhow::bail!(
            "building {} failed ({status}); its crate is {}",
            file.path.display(),
            dir.display()
        );
    }
    Ok(target
        .join("release")
        .join(format!("{package}{}", std::env::consts::EXE_SUFFIX)))
}

/// `LMX_CACHE_DIR`, else `$XDG_CACHE_HOME/lmx`, else `~/.cache/lmx`.
fn cache_dir() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("LMX_CACHE_DIR") {
        return Ok(dir.into());
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return Ok(PathBuf::from(dir).join("lmx"));
    }
    match std::env::var_os("HOME") {
        Some(home) => Ok(PathBuf::from(home).join(".cache").join("lmx")),
        None => anyhow::bail!("no cache folder for built models: set LMX_CACHE_DIR"),
    }
}

/// A stable 64-bit hash of a model's source (FNV-1a): the key of its built program.
fn source_hash(source: &str) -> u64 {
    let mut hasher = fnv::FnvHasher::default();
    hasher.write(source.as_bytes());
    hasher.finish()
}
