//! The layer library: parameter structs (each a [`Tree`](crate::tree::Tree)) and the functions
//! that apply them. Layers are plain functions of their parameters, so a model's forward pass is
//! a pure function of its parameter tree, as the compiled step requires.

mod activation;
mod extra;
mod layers;
mod leaf_struct;
mod linear_grad;
mod loss;

pub use activation::*;
pub use extra::*;
pub use layers::*;
pub use linear_grad::without_gradients;
pub use loss::*;
