//! Build script of `mlx-sys`: MLX's official binaries, mlx-c compiled from the published crate's
//! sources, and bindgen over its headers. Every step works without root and without cmake.
//!
//! 1. [`mlx_install`] finds MLX 0.32.2 (`MLX_DIR`, the Python package `mlx`, or MLX's wheel fetched
//!    with pip into a cache under the target directory).
//! 2. [`mlx_c_source`] takes mlx-c 0.7.0 from the published `mlx-sys` crate and patches a copy of
//!    it in `OUT_DIR` for compilers and targets it does not support as published.
//! 3. mlx-c is compiled with the `cc` crate and linked statically; `libmlx` is linked dynamically.
//! 4. [`libclang`] finds libclang for bindgen (the system's, else the PyPI wheel).
//! 5. [`blas`] puts OpenBLAS ahead of the reference BLAS of the `mlx-cpu` wheel: the system's, or
//!    else the `scipy-openblas32` wheel's, fetched with pip into the cache ([`openblas_wheel`]),
//!    either behind `liblmx_blas.so` ([`shim`]).
//!
//! Dependents read `DEP_MLX_LIB_DIR` and `DEP_MLX_BLAS` (see `link_args.rs`, which their build
//! scripts include) to give their binaries a run path to `libmlx` and to load OpenBLAS first.

mod blas;
mod blas_choice;
mod fail;
mod libclang;
mod mlx_c_source;
mod mlx_install;
mod openblas_wheel;
mod python;
mod shim;

use std::env;
use std::path::{Path, PathBuf};

fn main() {
    for var in ["MLX_DIR", "LMX_MLX", "LMX_BLAS", "LIBCLANG_PATH", "PYTHON"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=build");
    println!("cargo:rerun-if-changed=csrc");

    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let cache = cache_dir(&out_dir);
    let mlx = mlx_install::locate(&cache);
    let mlx_c = mlx_c_source::prepare(&out_dir, &cache);

    compile_mlx_c(&mlx_c, &mlx);
    let blas = blas::select(&cache, &out_dir, &mlx.lib_dir().join("libmlx.so"));
    link(&mlx, &blas);
    generate_bindings(&mlx_c, &out_dir, &cache);
}

/// The cache shared by all profiles of this target directory: `<target>/mlx-sys-cache`.
fn cache_dir(out_dir: &Path) -> PathBuf {
    // OUT_DIR is <target>/[<triple>/]<profile>/build/mlx-sys-<hash>/out.
    let build = out_dir
        .ancestors()
        .find(|dir| dir.file_name().is_some_and(|name| name == "build"))
        .unwrap_or(out_dir);
    let target = build.ancestors().nth(2).unwrap_or(build);
    target.join("mlx-sys-cache")
}

fn compile_mlx_c(mlx_c: &Path, mlx: &mlx_install::Mlx) {
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++20")
        .include(mlx_c)
        .include(mlx.include_dir())
        .warnings(false)
        .extra_warnings(false);
    for source in mlx_c_source::sources(mlx_c) {
        build.file(source);
    }
    build.file(Path::new(env!("CARGO_MANIFEST_DIR")).join("csrc/array_id.cpp"));
    build.compile("mlxc");
}

/// Links libmlx, and publishes the BLAS libraries to link ahead of it (a list in the platform's
/// path-list form, `link_args.rs` splits it).
fn link(mlx: &mlx_install::Mlx, blas: &[PathBuf]) {
    let lib_dir = mlx.lib_dir();
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-link-lib=dylib=mlx");
    println!("cargo:rustc-env=LMX_MLX_LIB_DIR={}", lib_dir.display());
    let blas = env::join_paths(blas)
        .unwrap_or_else(|err| fail::with(format!("a BLAS path cannot be listed: {err}")));
    println!("cargo:rustc-env=LMX_LINKED_BLAS={}", blas.to_string_lossy());
    println!("cargo::metadata=lib_dir={}", lib_dir.display());
    if !blas.is_empty() {
        println!("cargo::metadata=blas={}", blas.to_string_lossy());
    }
}

fn generate_bindings(mlx_c: &Path, out_dir: &Path, cache: &Path) {
    let clang_args = libclang::prepare(cache);
    let headers = mlx_c_source::headers(mlx_c);
    let builder = headers.iter().fold(
        bindgen::Builder::default()
            .rust_target(bindgen::RustTarget::stable(73, 0).expect("a released Rust version"))
            .clang_arg(format!("-I{}", mlx_c.display()))
            .clang_args(clang_args)
            // bindgen's `c_ulong` sizes trip rustc's suspicious_runtime_symbol_definitions lint.
            .blocklist_function("malloc")
            .blocklist_function("realloc"),
        |builder, header| builder.header(header.to_string_lossy()),
    );
    let bindings = builder
        .generate()
        .unwrap_or_else(|err| fail::with(format!("bindgen could not read mlx-c's headers: {err}")));
    bindings
        .write_to_file(out_dir.join("bindings.rs"))
        .unwrap_or_else(|err| fail::with(format!("cannot write bindings.rs: {err}")));
}
