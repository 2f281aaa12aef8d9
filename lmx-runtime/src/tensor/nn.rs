//! The runtime's layers over `Tensor` leaves. Attention and dropout are methods of the forward
//! pass's [`Context`](super::Context).

use super::{arrays, Tensor};
use crate::nn::{
    self, EmbeddingParams, LayerNormParams, LinearParams, RmsNormParams, SwitchGluParams,
};
use crate::Result;

/// `x W^T + b` (and an adapter's term, without its dropout: `Context::linear` applies that in
/// a training step).
pub fn linear(params: &LinearParams<Tensor>, x: &Tensor) -> Result<Tensor> {
    Ok(Tensor(nn::linear(&arrays(params), &x.0)?))
}

/// Stacked experts (mlx-lm's `SwitchGLU`, the `.lmx` layer `experts(..)`) over `x [..., dim]`
/// and the experts each token chose, `indices [..., k]`: `[..., k, dim]` (and the adapters'
/// terms, without their dropout: `Context::experts` applies that in a training step).
pub fn experts(params: &SwitchGluParams<Tensor>, x: &Tensor, indices: &Tensor) -> Result<Tensor> {
    Ok(Tensor(nn::experts(&arrays(params), &x.0, &indices.0)?))
}

/// The rows of the table for integer `ids`.
pub fn embedding(params: &EmbeddingParams<Tensor>, ids: &Tensor) -> Result<Tensor> {
    Ok(Tensor(nn::embedding(&arrays(params), &ids.0)?))
}

/// `x` projected on the embedding table (a tied output head).
pub fn embedding_as_linear(params: &EmbeddingParams<Tensor>, x: &Tensor) -> Result<Tensor> {
    Ok(Tensor(nn::embedding_as_linear(&arrays(params), &x.0)?))
}

/// Layer normalisation over the last axis.
pub fn layer_norm(params: &LayerNormParams<Tensor>, x: &Tensor, eps: f32) -> Result<Tensor> {
    Ok(Tensor(nn::layer_norm(&arrays(params), &x.0, eps)?))
}

/// RMS normalisation over the last axis.
pub fn rms_norm(params: &RmsNormParams<Tensor>, x: &Tensor, eps: f32) -> Result<Tensor> {
    Ok(Tensor(nn::rms_norm(&arrays(params), &x.0, eps)?))
}

/// SiLU: `x sigmoid(x)`.
pub fn silu(x: &Tensor) -> Result<Tensor> {
    Ok(Tensor(nn::silu(&x.0)?))
}

/// The gated MLP's product `silu(gate) * up` (`nn::swiglu`: lmx's kernels on a CUDA GPU), as the
/// `.lmx` code generator lowers that product.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    Ok(Tensor(nn::swiglu(&gate.0, &up.0)?))
}

/// GELU with the exact error function.
pub fn gelu(x: &Tensor) -> Result<Tensor> {
    Ok(Tensor(nn::gelu(&x.0)?))
}

/// GELU with the tanh approximation (GPT-2's).
pub fn gelu_tanh(x: &Tensor) -> Result<Tensor> {
    Ok(Tensor(nn::gelu_tanh(&x.0)?))
}

/// `max(x, 0)`.
pub fn relu(x: &Tensor) -> Result<Tensor> {
    Ok(Tensor(nn::relu(&x.0)?))
}

/// `[B, T, heads * head_dim] -> [B, heads, T, head_dim]`.
pub fn split_heads(x: &Tensor, heads: i32) -> Result<Tensor> {
    Ok(Tensor(nn::split_heads(&x.0, heads)?))
}

/// `[B, heads, T, head_dim] -> [B, T, heads * head_dim]`.
pub fn merge_heads(x: &Tensor) -> Result<Tensor> {
    Ok(Tensor(nn::merge_heads(&x.0)?))
}

/// Rotary position embedding over the first `dims` features of the last axis, positions from
/// `offset`, an int32 scalar (a forward pass passes [`Context::offset`](super::Context::offset)).
pub fn rope(x: &Tensor, dims: i32, base: f32, offset: &Tensor) -> Result<Tensor> {
    Ok(Tensor(nn::rope(&x.0, dims, base, &offset.0)?))
}

/// Mean token cross-entropy, in float32.
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    Ok(Tensor(nn::cross_entropy(&logits.0, &targets.0)?))
}
