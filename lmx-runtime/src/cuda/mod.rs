//! lmx's own kernels for MLX's CUDA backend, where MLX's generic ones lose speed or precision.
//!
//! On a bfloat16 model MLX sums a bias or norm gradient over the batch's rows in bfloat16, with
//! one kernel whose few dozen thread blocks leave most of an H100 idle (24 blocks for a
//! 16,384 x 768 gradient; docs/benchmarks.md). The kernels here read the rows in their own
//! precision, accumulate in float32 across hundreds of blocks, and add the blocks' partial sums
//! in a fixed order, so that a run's numbers do not depend on scheduling. The activations' kernels
//! make each pass one read and one write of the activations. Each kernel is reached through a
//! layer function ([`column_sum`](crate::nn::column_sum), [`layer_norm`](crate::nn::layer_norm),
//! [`gelu`](crate::nn::gelu), ...) that computes the same with MLX's ops on every other backend.

mod activation;
mod decode_attention;
mod kernel;
mod layer_norm;
mod matvec;
mod mlp_block;
mod pack;
mod rope;
mod row_norm;
mod rows;
mod squares;
mod sums;
mod tasks;
mod weights;

pub(crate) use activation::{
    activation, activation_backward, activation_fits, swiglu, swiglu_backward,
};
pub(crate) use decode_attention::{decode_attention, decode_attention_fits, NewKeyValue, Rotation};
pub(crate) use layer_norm::{layer_norm_backward, LAYER_NORM_MAX_COLUMNS};
pub(crate) use matvec::{
    matvec, matvec_fits, normed_matvec, normed_matvec_fits, OneLayer, MAX_ROWS,
};
pub(crate) use mlp_block::{BlockInput, FirstProducts, MlpBlock};
pub(crate) use pack::pack_with_squares;
pub(crate) use rope::{rope, rope_fits};
pub(crate) use row_norm::{NormKind, RowNorm};
pub(crate) use rows::{rows, rows_fit, PackedRows};
pub(crate) use squares::{squares, squares_fit};
pub(crate) use sums::column_sum;
pub(crate) use weights::{HeldWeight, Weight};

use crate::device::{default_kind, DeviceKind};

/// Whether MLX computes on a CUDA GPU: this build of MLX has the CUDA backend and the default
/// device is the GPU.
pub fn available() -> bool {
    // SAFETY: `available` outlives the call; mlx-c writes one bool and reports failure by status.
    let mut available = false;
    let status = unsafe { mlx_sys::mlx_cuda_is_available(&mut available) };
    status == 0 && available && matches!(default_kind(), Ok(DeviceKind::Gpu))
}
