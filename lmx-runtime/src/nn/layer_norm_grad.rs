//! Layer normalisation with its gradient written out on MLX's CUDA backend.
//!
//! The forward pass is MLX's fused kernel everywhere. On CUDA the backward pass is lmx's own
//! kernel (`cuda::layer_norm_backward`): one pass over the rows instead of MLX's three kernels,
//! with the weight's and bias's gradients accumulated in float32. Elsewhere MLX differentiates
//! its kernel itself.

use super::custom_vjp::{self, WithGradient};
use crate::cuda;
use crate::error::{Error, Result};
use mlx_rs::{fast, Array};

/// `layer_norm(x, w, b, eps)` over the last axis, differentiated by lmx's kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
struct LayerNorm {
    eps: f32,
}

impl WithGradient for LayerNorm {
    const NAME: &'static str = "layer normalisation";

    fn forward(&self, inputs: &[Array]) -> Result<Vec<Array>> {
        let (x, w, b) = parts(inputs)?;
        Ok(vec![fast::layer_norm(x, w, b, self.eps)?])
    }

    fn vjp(&self, primals: &[Array], cotangents: &[Array]) -> Result<Vec<Array>> {
        let (x, w, b) = parts(primals)?;
        let g = cotangents.first().ok_or_else(|| {
            Error::Layout("layer normalisation's gradient got no cotangent".into())
        })?;
        let columns = x.shape().last().copied().unwrap_or(1);
        let [dx, dw, db] = cuda::layer_norm_backward(
            &x.reshape(&[-1, columns])?,
            w,
            &g.reshape(&[-1, columns])?,
            self.eps,
        )?;
        let mut grads = vec![dx.reshape(x.shape())?, dw];
        if b.is_some() {
            grads.push(db);
        }
        Ok(grads)
    }
}

/// `[x, w]` or `[x, w, b]`.
fn parts(inputs: &[Array]) -> Result<(&Array, &Array, Option<&Array>)> {
    match inputs {
        [x, w] => Ok((x, w, None)),
        [x, w, b] => Ok((x, w, Some(b))),
        _ => Err(Error::Layout(format!(
            "layer normalisation takes [x, w] or [x, w, b], got {} arrays",
            inputs.len()
        ))),
    }
}

/// Layer normalisation of `x` over its last axis with the scale `w` and the shift `b`: MLX's
/// fused kernel, whose gradient on CUDA is lmx's where `x`, `w` and `b` share one precision and
/// rows hold at most [`cuda::LAYER_NORM_MAX_COLUMNS`] values.
pub(crate) fn layer_norm(x: &Array, w: &Array, b: Option<&Array>, eps: f32) -> Result<Array> {
    let columns = x.shape().last().copied().unwrap_or(1);
    let one_precision = w.dtype() == x.dtype() && b.is_none_or(|b| b.dtype() == x.dtype());
    if !cuda::available() || !one_precision || columns > cuda::LAYER_NORM_MAX_COLUMNS {
        return Ok(fast::layer_norm(x, w, b, eps)?);
    }
    let mut inputs = vec![x.clone(), w.clone()];
    inputs.extend(b.cloned());
    custom_vjp::apply(&LayerNorm { eps }, &inputs)?
        .pop()
        .ok_or_else(|| Error::Layout("layer normalisation returned nothing".into()))
}
