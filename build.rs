include!("mlx-sys/link_args.rs");

/// With the `runtime` feature: links lmx's own binaries and tests to MLX, re-publishes
/// mlx-sys's link metadata to crates that depend on lmx (see `lmx::build`), and compiles the
/// bundled models. Without it (lmx as a build-dependency) there is nothing to link or compile.
fn main() {
    if std::env::var_os("CARGO_FEATURE_RUNTIME").is_none() {
        return;
    }
    mlx_link_args("MLX");
    for key in ["lib_dir", "blas"] {
        if let Some(value) = std::env::var_os(format!("DEP_MLX_{}", key.to_uppercase())) {
            println!("cargo::metadata={key}={}", value.to_string_lossy());
        }
    }
    lmx_grammar::build::compile_models("models");
}
