//! OpenBLAS ahead of the reference BLAS that MLX's `mlx-cpu` wheel bundles.
//!
//! The wheel's libmlx calls `cblas_*` through its own `libblas`, a dependency of libmlx. A library
//! that the binary itself needs (kept with `--no-as-needed`, although the binary calls none of its
//! symbols) comes earlier in the loader's search order and wins symbol resolution, so MLX's CPU
//! matrix products run on OpenBLAS. The binary's own build script adds it (`link_args.rs`). `LMX_BLAS=reference` keeps MLX's own,
//! `LMX_BLAS=<path to libopenblas.so.0>` names one, and by default a system OpenBLAS is used when
//! one is installed (Debian: `apt install libopenblas0-pthread`).

use crate::fail;
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

/// The OpenBLAS library to link ahead of libmlx, if any.
pub fn select() -> Option<PathBuf> {
    if cfg!(target_os = "macos") || env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("macos") {
        return None; // MLX on macOS uses Accelerate.
    }
    match env::var("LMX_BLAS").as_deref() {
        Ok("reference") => None,
        Ok("" | "openblas") | Err(_) => {
            let found = CANDIDATES.iter().map(Path::new).find(|path| path.is_file());
            if found.is_none() && env::var("LMX_BLAS").as_deref() == Ok("openblas") {
                fail::with("LMX_BLAS=openblas, but no libopenblas.so.0 was found");
            }
            found.map(Path::to_path_buf)
        }
        Ok(path) => {
            let path = PathBuf::from(path);
            if !path.is_file() {
                fail::with(format!("LMX_BLAS={} is not a file", path.display()));
            }
            Some(path)
        }
    }
}
