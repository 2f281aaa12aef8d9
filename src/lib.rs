//! lmx: transformer language models and their training steps, declared once (in `.lmx` files or
//! as Rust structs under `#[lmx::model]`) and compiled, over Apple's MLX.

/// The runtime: typed parameter trees, the compiled step, optimizers, layers, data, devices.
pub use lmx_runtime as runtime;

/// `#[lmx::model]`: a typed parameter tree from a Rust struct, and with `config = ...` a
/// language model. `#[lmx::step]`: a training or evaluation step whose tensors cannot reach the
/// host. `#[derive(lmx::Tree)]`: the `Tree` impl of a struct generic over its leaf.
pub use lmx_macros::{model, step, Tree};

pub mod rules;

// Generated code names the runtime `::lmx::runtime`, inside this crate as in any other.
extern crate self as lmx;

/// The bundled models of `models/`, compiled from their `.lmx` files by `build.rs`: one module
/// per model (`models::gpt2`, `models::llama`, ...) with its `Config`, `Params`, `init`, `forward`,
/// the model type implementing `LanguageModel`, and its training steps implementing `TrainingStep`.
pub mod models {
    include!(concat!(env!("OUT_DIR"), "/models.rs"));
}
