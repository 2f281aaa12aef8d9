//! Global-norm gradient clipping that stays in the graph, so it works inside a compiled step.
//!
//! `mlx_rs::optimizers::clip_grad_norm` reads the norm to the host, which a compiled step cannot
//! do. Here the scale `min(1, max_norm / (norm + eps))` is an array like any other.

use crate::error::Result;
use mlx_rs::{ops, Array, Dtype};

/// Added to the norm before dividing, as in MLX's and PyTorch's clipping.
pub const EPS: f32 = 1e-6;

/// The global L2 norm of `grads`, accumulated in float32.
pub fn global_norm(grads: &[Array]) -> Result<Array> {
    let mut total = Array::from_f32(0.0);
    for grad in grads {
        total = total.add(grad.as_dtype(Dtype::Float32)?.square()?.sum(false)?)?;
    }
    Ok(total.sqrt()?)
}

/// `grads` scaled so that their global norm is at most `max_norm`, and the norm before clipping.
pub fn clip_by_global_norm(grads: &[Array], max_norm: f32) -> Result<(Vec<Array>, Array)> {
    let norm = global_norm(grads)?;
    let scale = ops::minimum(
        Array::from_f32(max_norm).divide(norm.add(Array::from_f32(EPS))?)?,
        Array::from_f32(1.0),
    )?;
    // One conversion of the scale per precision, not one per gradient.
    let mut scales: Vec<(Dtype, Array)> = Vec::new();
    let mut clipped = Vec::with_capacity(grads.len());
    for grad in grads {
        let dtype = grad.dtype();
        let scale = match scales.iter().find(|(seen, _)| *seen == dtype) {
            Some((_, scale)) => scale.clone(),
            None => {
                let converted = scale.as_dtype(dtype)?;
                scales.push((dtype, converted.clone()));
                converted
            }
        };
        clipped.push(grad.multiply(scale)?);
    }
    Ok((clipped, norm))
}
