// Link arguments for binaries (tests, examples, programs) of crates that depend on `mlx-sys`.
// A `-sys` crate's link arguments do not reach its dependents' binaries, so each such crate's
// build script includes this file and calls `mlx_link_args("MLX")`:
//
//     include!("../mlx-sys/link_args.rs");
//     fn main() { mlx_link_args("MLX"); }
//
// `lmx` re-publishes the same metadata under its own `links` name, and `lmx::build` calls
// `mlx_link_args("LMX")` for crates that depend on lmx alone (the metadata reaches only direct
// dependents).

/// A run path to `libmlx` (so binaries run without `LD_LIBRARY_PATH`, which still wins: that is
/// how a binary built here runs on MLX's CUDA build), and OpenBLAS ahead of MLX's reference BLAS
/// when `mlx-sys` chose one (with lmx's `liblmx_blas.so` in front of a system one), with run
/// paths to their directories (the binary names them by their sonames, and the wheel's, lmx's or
/// a named one is in no system directory). `links` is the `links` name of the
/// direct dependency that publishes mlx-sys's metadata: `MLX` (mlx-sys itself) or `LMX`.
fn mlx_link_args(links: &str) {
    let macos = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("macos");
    if let Some(dir) = std::env::var_os(format!("DEP_{links}_LIB_DIR")) {
        let dir = dir.to_string_lossy();
        if macos {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        } else {
            println!("cargo:rustc-link-arg=-Wl,--enable-new-dtags,-rpath,{dir}");
        }
    }
    if let Some(list) = std::env::var_os(format!("DEP_{links}_BLAS")) {
        // In this order: lmx's `liblmx_blas.so` first where a system OpenBLAS follows it.
        let libraries: Vec<_> = std::env::split_paths(&list).collect();
        for dir in libraries.iter().filter_map(|blas| blas.parent()) {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
        }
        let names: Vec<_> = libraries.iter().map(|blas| blas.display().to_string()).collect();
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed,{},--as-needed", names.join(","));
    }
}
