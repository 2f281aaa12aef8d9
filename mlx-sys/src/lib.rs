//! Raw bindings to MLX's C API, mlx-c 0.7.0, for Linux (CPU and CUDA) and macOS (Metal).
//!
//! This crate replaces the published `mlx-sys` 0.7.0 through `[patch.crates-io]` so that mlx-rs
//! 0.33 builds unchanged off macOS. The build script (see `build/main.rs`) finds an official MLX
//! 0.32.2 build, compiles mlx-c from the published crate's sources and generates these bindings.

#![allow(non_upper_case_globals)]
#![allow(non_camel_case_types)]
#![allow(non_snake_case)]
#![allow(clippy::all)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

extern "C" {
    /// The identity of the array `a` is a handle to (MLX's `array::id()`, `csrc/array_id.cpp`):
    /// the same for every handle to one array, and no other array's while a handle to it lives.
    pub fn lmx_array_id(a: mlx_array) -> usize;

    /// Where the rows of `a` lie in the array it views (`csrc/array_id.cpp`): through reshapes,
    /// order-keeping transposes and slices or splits of the last axis, up to the first step that
    /// breaks the rows, row `b`'s values are `*base`'s flat values from `b * row_stride + offset`
    /// on. Writes a new handle to `*base` (the caller frees it) and returns true, or, for a
    /// scalar or where MLX throws, returns false and writes nothing.
    pub fn lmx_array_rows_of(
        a: mlx_array,
        base: *mut mlx_array,
        offset: *mut i64,
        row_stride: *mut i64,
    ) -> bool;
}

/// The directory holding the `libmlx` this crate was linked against.
pub const MLX_LIB_DIR: &str = env!("LMX_MLX_LIB_DIR");

/// The BLAS libraries placed ahead of MLX's own at link time, in order, as a path list (`""` when
/// MLX keeps its bundled one).
pub const LINKED_BLAS: &str = env!("LMX_LINKED_BLAS");

/// mlx-rs seeds its default random key from `mach_approximate_time`, which only Apple systems
/// provide; elsewhere this crate supplies it from the system clock, in nanoseconds.
#[cfg(not(target_vendor = "apple"))]
#[no_mangle]
pub extern "C" fn mach_approximate_time() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos() as u64)
}

/// The build script's choice of BLAS, tested here: a build script has no tests of its own.
#[cfg(test)]
#[path = "../build/blas_choice.rs"]
mod blas_choice;
