//! OpenBLAS ahead of the reference BLAS that MLX's `mlx-cpu` wheel bundles.
//!
//! The wheel's libmlx calls `cblas_*` and LAPACK through its own `libblas` and `liblapack`,
//! dependencies of libmlx. A library that the binary itself needs (kept with `--no-as-needed`,
//! although the binary calls none of its symbols) comes earlier in the loader's search order and
//! wins symbol resolution, so MLX's CPU matrix products run on OpenBLAS. The binary's own build
//! script adds it (`link_args.rs`). By default that is a system OpenBLAS when one is installed
//! (Debian: `apt install libopenblas0-pthread`), else the OpenBLAS of the `scipy-openblas32` wheel
//! fetched with pip ([`openblas_wheel`]). `LMX_BLAS` changes the choice ([`blas_choice`]):
//! `reference` keeps MLX's own, `openblas` the system's, `wheel` the wheel's, and a path names a
//! library. A system or named OpenBLAS gets [`shim`]'s `cblas_sgemm` linked ahead of it.

use crate::blas_choice::{self, Choice, Request};
use crate::{fail, openblas_wheel, shim};
use std::env;
use std::path::{Path, PathBuf};

/// Where distributions install OpenBLAS's runtime library.
const CANDIDATES: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
];

/// The BLAS libraries to link ahead of `libmlx`, in order (none for the reference BLAS). The
/// wheel's is fetched into `cache` and its forwarding library compiled into `out_dir` only when it
/// is the one chosen.
pub fn select(cache: &Path, out_dir: &Path, libmlx: &Path) -> Vec<PathBuf> {
    if env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("macos") {
        return Vec::new(); // MLX on macOS uses Accelerate.
    }
    let request = Request::parse(env::var("LMX_BLAS").ok().as_deref());
    if let Request::File(path) = &request {
        if !path.is_file() {
            fail::with(format!("LMX_BLAS={} is not a file", path.display()));
        }
    }
    let system = CANDIDATES
        .iter()
        .map(Path::new)
        .find(|path| path.is_file())
        .map(Path::to_path_buf);
    let wheel = || openblas_wheel::shim(cache, out_dir, libmlx);
    match blas_choice::decide(&request, system, wheel) {
        // The wheel's forwarding library, compiled here, has the shim's `cblas_sgemm` in it.
        Ok(Choice::Linked(path)) if path == out_dir.join(shim::SHIM) => vec![path],
        Ok(Choice::Linked(path)) => match shim::ahead_of(&path, out_dir) {
            Ok(ahead) => vec![ahead, path],
            Err(why) => {
                warn(&format!(
                    "one-row products stay with {}'s sgemm: {why}",
                    path.display()
                ));
                vec![path]
            }
        },
        Ok(Choice::Reference { warning }) => {
            if let Some(warning) = warning {
                warn(&warning);
            }
            Vec::new()
        }
        Err(why) => fail::with(why),
    }
}

fn warn(text: &str) {
    for line in text.lines() {
        println!("cargo:warning={line}");
    }
}
