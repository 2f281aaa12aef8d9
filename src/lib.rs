//! lmx: transformer language models and their training steps, declared once (in `.lmx` files or
//! as Rust structs under `#[lmx::model]`) and compiled, over Apple's MLX.

/// The runtime: typed parameter trees, the compiled step, optimizers, layers, data, devices.
pub use lmx_runtime as runtime;
