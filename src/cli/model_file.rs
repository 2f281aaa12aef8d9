//! `--model path/to/file.lmx` for a model this program does not hold: the file is compiled into a
//! crate of its own (as `lmx new` writes one) in a cache folder keyed by the file's source and the
//! lmx checkout it builds against, built once with cargo in release mode, and the same command
//! line runs in its binary. The generated code is the fast path: after the first build, a file
//! trains as fast as a bundled model.

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
/// source's and the lmx checkout's, [`program_hash`]), with its target folder `CARGO_TARGET_DIR`
/// if set, else `CACHE/target`, shared by every file's crate so that lmx and its dependencies
/// build once. Cargo rebuilds it when that checkout's sources changed.
fn build(file: &ModelFile) -> anyhow::Result<PathBuf> {
    let lmx = new::lmx_checkout(std::env::var_os("LMX_SOURCE").as_deref().map(AsRef::as_ref))
        .map_err(|err| {
            anyhow::anyhow!(
                "{}: a .lmx file that this program does not hold runs in a program built for \
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
    let cache = lmx::runtime::platform::cache_dir()
        .ok_or_else(|| anyhow::anyhow!("no cache folder for built models: set LMX_CACHE_DIR"))?;
    let package = format!(
        "lmx-model-{}-{:016x}",
        file.name,
        program_hash(&file.source, &lmx)
    );
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
    let program = target
        .join("release")
        .join(format!("{package}{}", std::env::consts::EXE_SUFFIX));
    // Built before, the program is only checked (cargo's one line, or its progress where lmx's
    // checkout changed since); the first build is the one worth a warning.
    if !program.is_file() {
        eprintln!(
            "building {} into a program of its own ({}; the first build takes minutes)",
            file.path.display(),
            dir.display()
        );
    }
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
    Ok(program)
}

/// A stable 64-bit hash (FNV-1a) of a model's source and of the lmx checkout its crate depends
/// on: the key of its built program. The checkout is part of the key because the crate names it
/// by path: a program built against another checkout (an older clone, another branch) would
/// otherwise be found and run with that checkout's runtime.
fn program_hash(source: &str, lmx: &std::path::Path) -> u64 {
    let mut hasher = fnv::FnvHasher::default();
    hasher.write(source.as_bytes());
    // 0xff occurs in no UTF-8 text: the source's end cannot run into the path.
    hasher.write(&[0xff]);
    hasher.write(lmx.as_os_str().as_encoded_bytes());
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::program_hash;
    use std::path::Path;

    /// One source builds one program per lmx checkout, and the same one for the same checkout.
    #[test]
    fn a_program_is_keyed_by_its_source_and_its_lmx_checkout() {
        let (a, b) = (Path::new("/src/lmx"), Path::new("/tmp/old-lmx"));
        assert_eq!(program_hash("model M {}", a), program_hash("model M {}", a));
        assert_ne!(program_hash("model M {}", a), program_hash("model M {}", b));
        assert_ne!(program_hash("model M {}", a), program_hash("model N {}", a));
        // FNV-1a of b"m\xff/x", computed apart from this code (in Python).
        assert_eq!(program_hash("m", Path::new("/x")), 0xd935_f6a4_eb29_c1d2);
    }
}
