//! OpenBLAS without root: the `scipy-openblas32` wheel (the OpenBLAS build that NumPy and SciPy
//! ship) fetched with pip, behind `liblmx_blas.so`, a small library compiled here that gives its
//! functions the names MLX calls.
//!
//! The wheel prefixes every symbol (`scipy_cblas_sgemm`, `scipy_sgemm_`) so that it never clashes
//! with another BLAS in a Python process, while libmlx imports the plain names (`cblas_sgemm`,
//! `sgetrf_`). The published wheels that ship an unprefixed shared `libopenblas` (cmeel-openblas,
//! ngsolve-openblas) need a system `libgfortran.so.5` that a fresh machine lacks, so they would
//! need a system package too (docs/architecture.md). `liblmx_blas.so` defines, for each function
//! that libmlx imports and the wheel defines, a trampoline: one tail jump to the prefixed function,
//! which leaves registers and stack as the caller set them and so forwards any signature exactly.
//! It also forwards `openblas_get_config`, through which `lmx platform` names the OpenBLAS in use,
//! and `openblas_set_num_threads`, through which `lmx` sets its threads. `cblas_sgemm` is the
//! shim's C ([`crate::shim`]), compiled in with the wheel's prefix.

use crate::python;
use crate::shim::{self, IN_C, SHIM};
use std::env;
use std::fs;
use std::path::{Path, PathBuf};

/// The wheel: OpenBLAS 0.3.34 with 32-bit integers, as MLX's LAPACK calls expect.
const WHEEL: &str = "scipy-openblas32==0.3.34.481.3";
/// Its directory in the cache.
const CACHE_NAME: &str = "scipy-openblas32-0.3.34.481.3";
/// The prefix of the wheel's symbols.
const PREFIX: &str = "scipy_";

/// Fetches the wheel into `cache` (once), compiles the library that forwards libmlx's BLAS and
/// LAPACK imports to it into `out_dir`, and returns that library; or why it cannot.
pub fn shim(cache: &Path, out_dir: &Path, libmlx: &Path) -> Result<PathBuf, String> {
    let jump = trampoline()?;
    let root =
        python::install_once(cache, CACHE_NAME, &[WHEEL], false).map_err(|err| match err {
            python::InstallError::Pip(pip) => format!("pip could not fetch {WHEEL}:\n{pip}"),
            python::InstallError::Cache(why) => why,
        })?;
    let lib_dir = root.join("scipy_openblas32/lib");
    let openblas = lib_dir.join("libscipy_openblas.so");
    let defined = shim::dynamic_symbols(&openblas, "--defined-only")?;
    let imported = shim::dynamic_symbols(libmlx, "--undefined-only")?;
    if !imported.contains(IN_C) {
        return Err(format!("{} imports no {IN_C}", libmlx.display()));
    }
    shim::has_c_calls(&openblas, &defined, PREFIX)?;
    let forwarded: Vec<&str> = imported
        .iter()
        .map(String::as_str)
        .chain(["openblas_get_config", "openblas_set_num_threads"])
        .filter(|name| *name != IN_C && defined.contains(&format!("{PREFIX}{name}")))
        .collect();
    let source = out_dir.join("lmx_blas.S");
    fs::write(&source, assembly(&forwarded, jump))
        .map_err(|err| format!("cannot write {}: {err}", source.display()))?;
    let library = out_dir.join(SHIM);
    shim::compile(&[&source, &shim::c_source()], PREFIX, &openblas, &library)?;
    Ok(library)
}

/// The jump to a prefixed function on this target, or why there is none.
fn trampoline() -> Result<&'static str, String> {
    match env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        // Through the PLT: the wheel's library is loaded anywhere.
        Ok("x86_64") => Ok("jmp {target}@PLT"),
        // The linker routes a branch to a symbol of another library through the PLT.
        Ok("aarch64") => Ok("b {target}"),
        Ok(arch) => Err(format!("no OpenBLAS trampolines are written for {arch}")),
        Err(_) => Err("cargo did not set CARGO_CFG_TARGET_ARCH".into()),
    }
}

/// The assembly of one global function per forwarded name, jumping to its prefixed twin.
fn assembly(forwarded: &[&str], jump: &str) -> String {
    let mut text = String::from("    .text\n");
    for name in forwarded {
        let target = format!("{PREFIX}{name}");
        let jump = jump.replace("{target}", &target);
        text += &format!("    .globl {name}\n    .type {name}, %function\n{name}:\n");
        text += &format!("    {jump}\n    .size {name}, .-{name}\n");
    }
    // No executable stack.
    text += "    .section .note.GNU-stack,\"\",%progbits\n";
    text
}
