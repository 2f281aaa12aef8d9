//! For a crate's build script: compile its `.lmx` models and link its binaries to MLX.
//!
//! ```text
//! # Cargo.toml
//! [dependencies]
//! lmx = { path = "../lmx" }
//! [build-dependencies]
//! lmx = { path = "../lmx", default-features = false }
//!
//! // build.rs
//! fn main() {
//!     lmx::build::compile_models("models");
//! }
//! ```
//! and in the crate: `mod models { include!(concat!(env!("OUT_DIR"), "/models.rs")); }`.

include!("../mlx-sys/link_args.rs");

/// Compiles every `.lmx` file in `dir` into `$OUT_DIR/models.rs` (one module per model; see
/// [`lmx_grammar::build::compile_models`]) and links the crate's binaries to MLX
/// ([`link_mlx`]). A file with errors fails the build with its diagnostics.
pub fn compile_models(dir: impl AsRef<std::path::Path>) {
    lmx_grammar::build::compile_models(dir);
    link_mlx();
}

/// Link arguments for the crate's binaries, tests and examples: a run path to `libmlx` and the
/// BLAS library MLX was linked with. Link arguments of a dependency never reach its dependents'
/// binaries, so lmx publishes what they need as `links` metadata, which reaches the build script
/// of each crate that depends on lmx directly: that crate's build script calls this.
pub fn link_mlx() {
    mlx_link_args("LMX");
}
