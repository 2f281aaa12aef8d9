//! lmx: transformer language models and their training steps, declared once (in `.lmx` files or
//! as Rust structs under `#[lmx::model]`) and compiled, over Apple's MLX.
//!
//! A crate of one's own names `lmx` and nothing else: its generated code refers to `::lmx::...`
//! only, its build script calls [`build::compile_models`] (with lmx as a build-dependency without
//! default features, which compiles no MLX), and its `main` runs [`cli::Registry::main`].

pub mod build;

/// The runtime: typed parameter trees, the compiled step, optimizers, layers, data, devices.
#[cfg(feature = "runtime")]
pub use lmx_runtime as runtime;

/// `#[lmx::model]`: a typed parameter tree from a Rust struct, and with `config = ...` a
/// language model. `#[lmx::step]`: a training or evaluation step whose tensors cannot reach the
/// host. `#[derive(lmx::Tree)]`: the `Tree` impl of a struct generic over its leaf.
#[cfg(feature = "runtime")]
pub use lmx_macros::{model, step, Tree};

/// For generated code (a model's `Config` derives `Serialize`/`Deserialize` through
/// `::lmx::serde`), so that a crate need not name serde itself.
#[cfg(feature = "runtime")]
pub use serde;
/// For a crate's own code that reads or writes configurations and run records.
#[cfg(feature = "runtime")]
pub use serde_json;

mod allocator;
#[cfg(feature = "runtime")]
pub mod cli;
#[cfg(feature = "runtime")]
pub mod rules;
#[cfg(feature = "runtime")]
pub mod serve;

// Generated code names the runtime `::lmx::runtime`, inside this crate as in any other.
extern crate self as lmx;

/// The bundled models of `models/`, compiled from their `.lmx` files by `build.rs`: one module
/// per model (`models::gpt2`, `models::llama`, ...) with its `Config`, `Params`, `init`, `forward`,
/// the model type implementing `LanguageModel`, and its training steps implementing `TrainingStep`.
#[cfg(feature = "runtime")]
pub mod models {
    include!(concat!(env!("OUT_DIR"), "/models.rs"));
}

#[cfg(feature = "runtime")]
mod backbones;
