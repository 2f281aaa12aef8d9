//! lmx's runtime over mlx-rs: typed parameter trees, the compiled training step over a declared
//! state, optimizers, layers, devices.

pub mod arrays;
pub mod buffers;
pub mod checkpoint;
pub mod clip;
pub mod cuda;
pub mod data;
pub mod device;
pub mod distributed;
pub mod error;
pub mod flat;
pub mod generate;
pub mod hf;
pub mod lora;
pub mod model;
pub mod nn;
pub mod objectives;
pub mod optim;
pub mod platform;
pub mod quant;
pub mod run_lock;
pub mod schedule;
pub mod state;
pub mod step;
pub mod tensor;
#[cfg(test)]
mod test_arrays;
pub mod train;
pub mod tree;

pub use error::{Error, Result};
pub use mlx_rs;
pub use mlx_rs::Array;
