//! `liblmx_blas.so`, the library this build compiles to stand ahead of libmlx's BLAS. Its
//! `cblas_sgemm` is C (`csrc/blas_vector_products.c`): a product with one row or one column of
//! output (each projection of a decoded token) goes to `sgemv`, which reads the matrix once,
//! where OpenBLAS's `sgemm` packs it first. Over the `scipy-openblas32` wheel the library also
//! forwards every other name MLX calls ([`crate::openblas_wheel`]); ahead of a system or named
//! OpenBLAS it holds `cblas_sgemm` alone, and that OpenBLAS is linked right after it.

use std::collections::BTreeSet;
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The library's file name and soname.
pub const SHIM: &str = "liblmx_blas.so";
/// The function it defines in C.
pub const IN_C: &str = "cblas_sgemm";
/// The functions that C calls, before any prefix.
const C_CALLS: [&str; 2] = ["sgemm_", "cblas_sgemv"];

/// The C source.
pub fn c_source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("csrc/blas_vector_products.c")
}

/// The shim ahead of `blas` (a system or named OpenBLAS, linked right after it), compiled into
/// `out_dir`; or why there is none (`blas` lacks a function the C calls, or it would not build).
pub fn ahead_of(blas: &Path, out_dir: &Path) -> Result<PathBuf, String> {
    has_c_calls(blas, &dynamic_symbols(blas, "--defined-only")?, "")?;
    let library = out_dir.join(SHIM);
    compile(&[&c_source()], "", blas, &library)?;
    Ok(library)
}

/// Whether `blas`, whose dynamic symbols are `defined`, has every function the C calls under
/// `prefix`; or the first it lacks.
pub fn has_c_calls(blas: &Path, defined: &BTreeSet<String>, prefix: &str) -> Result<(), String> {
    match C_CALLS
        .iter()
        .find(|name| !defined.contains(&format!("{prefix}{name}")))
    {
        Some(missing) => Err(format!("{} defines no {prefix}{missing}", blas.display())),
        None => Ok(()),
    }
}

/// The names of the dynamic symbols of `library` that `nm` lists with `filter`
/// (`--defined-only`, `--undefined-only`), without version suffixes.
pub fn dynamic_symbols(library: &Path, filter: &str) -> Result<BTreeSet<String>, String> {
    let nm = env::var_os("NM").unwrap_or_else(|| "nm".into());
    let output = Command::new(&nm)
        .args(["-D", filter])
        .arg(library)
        .output()
        .map_err(|err| format!("cannot run {}: {err}", nm.to_string_lossy()))?;
    if !output.status.success() {
        return Err(format!(
            "nm could not read {}: {}",
            library.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().last())
        .map(|symbol| symbol.split('@').next().unwrap_or(symbol).to_owned())
        .collect())
}

/// Compiles `sources` into the shared library `library`, the C's calls named with `prefix`,
/// linked against `blas`, which it finds through its own run path.
pub fn compile(sources: &[&Path], prefix: &str, blas: &Path, library: &Path) -> Result<(), String> {
    let (Some(dir), Some(name)) = (blas.parent(), blas.file_name()) else {
        return Err(format!("{} names no library file", blas.display()));
    };
    let compiler = cc::Build::new()
        .try_get_compiler()
        .map_err(|err| format!("no C compiler: {err}"))?;
    let mut command = compiler.to_command();
    command
        .args(["-shared", "-fPIC", "-O2"])
        .arg(format!("-DLMX_BLAS_PREFIX={prefix}"))
        .arg("-o")
        .arg(library)
        .args(sources)
        .arg(format!("-Wl,-soname,{SHIM}"))
        .arg(format!("-L{}", dir.display()))
        .arg(format!("-l:{}", name.to_string_lossy()))
        .arg(format!("-Wl,-rpath,{}", dir.display()));
    let output = command
        .output()
        .map_err(|err| format!("cannot run the C compiler: {err}"))?;
    if !output.status.success() {
        return Err(format!(
            "the C compiler could not build {SHIM}: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(())
}
