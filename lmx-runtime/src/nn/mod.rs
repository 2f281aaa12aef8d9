//! The layer library: parameter structs (each a [`Tree`](crate::tree::Tree)) and the functions
//! that apply them. Layers are plain functions of their parameters, so a model's forward pass is
//! a pure function of its parameter tree, as the compiled step requires.

mod activated_product;
mod activation;
mod column_sum;
mod custom_vjp;
mod decode_attention;
mod decode_product;
mod deferred;
mod dynamic;
mod embedding_grad;
mod expert_rows;
mod experts;
mod extra;
mod gated;
mod gpu_rows;
mod layer_norm_grad;
mod layers;
mod linear_grad;
mod loss;
mod padded_product;
mod quantized_product;
mod resident;
mod rope;
#[cfg(test)]
mod same_gradients;
mod scan;
mod shared_input;
mod switch;
mod tiled_attention;
pub(crate) mod view_rows;

pub use activated_product::{linear_plus_in, LayerInput, Residual};
pub use activation::*;
pub use column_sum::column_sum;
pub use custom_vjp::without_gradients;
pub(crate) use decode_attention::{decode_attention, DecodeSlots};
pub use dynamic::slice_update_dynamic;
pub use experts::*;
pub use extra::*;
pub use gated::swiglu;
pub use layers::*;
pub use loss::*;
pub(crate) use resident::{device_resident, release_host_buffers};
pub use rope::*;
pub use scan::*;
pub use shared_input::linears_in;
pub use switch::{experts, experts_in, SwitchGluParams, SwitchLinearParams};
pub use tiled_attention::causal_attention;
