fn main() {
    lmx_rpath();
}

/// Lets this crate's tests and examples find `libmlx` without `LD_LIBRARY_PATH` (a run path set
/// by a `-sys` crate does not reach its dependents' binaries). `LD_LIBRARY_PATH` still wins, which
/// is how a binary built here runs on MLX's CUDA build.
fn lmx_rpath() {
    if let Some(dir) = std::env::var_os("DEP_MLX_LIB_DIR") {
        let dir = dir.to_string_lossy();
        if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("macos") {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        } else {
            println!("cargo:rustc-link-arg=-Wl,--enable-new-dtags,-rpath,{dir}");
        }
    }
}
