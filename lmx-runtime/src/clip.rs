//! Global-norm gradient clipping that stays in the graph, so it works inside a compiled step.
//!
//! `mlx_rs::optimizers::clip_grad_norm` reads the norm to the host, which a compiled step cannot
//! do. Here the scale `min(1, max_norm / (norm + eps))` is an array like any other.

use crate::error::Result;
use mlx_rs::{ops, Array, Dtype};

/// Added to the norm before dividing, as in MLX's and PyTorch's clipping.
pub const EPS: f32 = 1e-6;

/// A gradient of at least this many elements is squared and summed where it lies. Flattening it
/// would copy it whenever its layout is not contiguous (a transposed weight's gradient is not)
/// and joining it would copy it again: on the CPU, medium's 151M-parameter step spent a third
/// of its time in those copies. Below this size the copies cost less than the kernels they save.
pub const JOIN_BELOW: usize = 1 << 16;

/// Elements per bucket of joined small gradients in [`global_norm`]: a small model's gradients
/// fit in a few, and the float32 squares stay a minor allocation.
pub const BUCKET_ELEMENTS: usize = 1 << 20;

/// The global L2 norm of `grads`, accumulated in float32.
///
/// Each gradient of [`JOIN_BELOW`] elements or more is squared and summed on its own. Smaller
/// ones are flattened and joined into buckets of up to [`BUCKET_ELEMENTS`], each squared and
/// summed at once: two kernels per bucket rather than two per bias or norm scale, which is most
/// of the norm's cost where a step's time is kernel launches. On CUDA a bucket's squares are
/// summed by lmx's kernel (`cuda::squares`), which reads it once and writes no float32 copy.
pub fn global_norm(grads: &[Array]) -> Result<Array> {
    norm_in_buckets(grads, JOIN_BELOW, BUCKET_ELEMENTS)
}

fn norm_in_buckets(grads: &[Array], join_below: usize, limit: usize) -> Result<Array> {
    let cuda = crate::cuda::available();
    let mut total = Array::from_f32(0.0);
    for bucket in buckets(grads, join_below, limit) {
        let joined = match bucket {
            [single] => single.clone(),
            _ => {
                let flat = bucket
                    .iter()
                    .map(|grad| Ok(grad.reshape(&[-1])?))
                    .collect::<Result<Vec<_>>>()?;
                ops::concatenate(&flat, 0)?
            }
        };
        let squares = if cuda && crate::cuda::squares_fit(&joined) {
            crate::cuda::squares(&joined)?
        } else {
            joined.as_dtype(Dtype::Float32)?.square()?.sum(false)?
        };
        total = total.add(squares)?;
    }
    Ok(total.sqrt()?)
}

/// Consecutive runs of gradients smaller than `join_below`, of one dtype and at most `limit`
/// elements; every other gradient is a bucket of its own.
fn buckets(grads: &[Array], join_below: usize, limit: usize) -> Vec<&[Array]> {
    let mut buckets = Vec::new();
    let (mut start, mut elements) = (0, 0);
    for (index, grad) in grads.iter().enumerate() {
        let joins = grad.size() < join_below
            && grads[start].size() < join_below
            && elements + grad.size() <= limit
            && grad.dtype() == grads[start].dtype();
        if index > start && !joins {
            buckets.push(&grads[start..index]);
            (start, elements) = (index, 0);
        }
        elements += grad.size();
    }
    if start < grads.len() {
        buckets.push(&grads[start..]);
    }
    buckets
}

/// `grads` scaled so that their global norm is at most `max_norm`, and the norm before clipping.
pub fn clip_by_global_norm(grads: &[Array], max_norm: f32) -> Result<(Vec<Array>, Array)> {
    let norm = global_norm(grads)?;
    Ok((clip_to_norm(grads, &norm, max_norm)?, norm))
}

/// `grads`, whose global norm is `norm`, scaled so that it is at most `max_norm`.
pub fn clip_to_norm(grads: &[Array], norm: &Array, max_norm: f32) -> Result<Vec<Array>> {
    scale(grads, &clip_scale(norm, max_norm)?)
}

/// What clipping to `max_norm` multiplies gradients of global norm `norm` by:
/// `min(1, max_norm / (norm + eps))`, a float32 scalar.
pub fn clip_scale(norm: &Array, max_norm: f32) -> Result<Array> {
    Ok(ops::minimum(
        Array::from_f32(max_norm).divide(norm.add(Array::from_f32(EPS))?)?,
        Array::from_f32(1.0),
    )?)
}

/// `grads` times `scale` (a float32 scalar), each in its own dtype.
pub fn scale(grads: &[Array], scale: &Array) -> Result<Vec<Array>> {
    // One conversion of the scale per precision, not one per gradient.
    let mut scales: Vec<(Dtype, Array)> = Vec::new();
    let mut scaled = Vec::with_capacity(grads.len());
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
        scaled.push(grad.multiply(scale)?);
    }
    Ok(scaled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_global_norm_is_the_norm_of_every_element_across_buckets() {
        let sizes = [3, 2, 4, 5, 4, 11, 2];
        let mut grads: Vec<Array> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| Array::full::<f32>(&[n], Array::from_f32(0.5 + i as f32)).unwrap())
            .collect();
        // A transposed (non-contiguous) gradient, as a weight's often is, and a bfloat16 one.
        let values = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        grads.push(Array::from_slice(&values, &[2, 3]).t());
        grads.push(
            Array::from_slice(&[3.0f32, 4.0], &[2, 1])
                .as_dtype(Dtype::Bfloat16)
                .unwrap(),
        );
        let sizes_of = |bucket: &[Array]| bucket.iter().map(Array::size).collect::<Vec<_>>();
        let layout: Vec<Vec<usize>> = buckets(&grads, 5, 8).into_iter().map(sizes_of).collect();
        let expected_layout: [&[usize]; 8] = [&[3, 2], &[4], &[5], &[4], &[11], &[2], &[6], &[2]];
        assert_eq!(layout, expected_layout);
        let expected: f64 = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| n as f64 * (0.5 + i as f64).powi(2))
            .sum::<f64>()
            + values.iter().map(|&v| (v as f64).powi(2)).sum::<f64>()
            + 25.0;
        for (join_below, limit) in [(1, 1), (5, 8), (JOIN_BELOW, BUCKET_ELEMENTS)] {
            let norm = norm_in_buckets(&grads, join_below, limit).unwrap();
            let norm = norm.item_exact::<f32>() as f64;
            assert!(
                (norm - expected.sqrt()).abs() < 1e-5,
                "{norm} with buckets of {limit} joining below {join_below}"
            );
        }
    }

    #[test]
    fn clipping_scales_to_the_maximum_norm_and_reports_the_norm_before() {
        let grads = [
            Array::from_slice(&[3.0f32, 0.0], &[2]),
            Array::from_slice(&[4.0f32], &[1]),
        ];
        let (clipped, norm) = clip_by_global_norm(&grads, 1.0).unwrap();
        assert!((norm.item_exact::<f32>() - 5.0).abs() < 1e-6);
        let first: Vec<f32> = clipped[0].as_slice().to_vec();
        assert!((first[0] - 0.6).abs() < 1e-6 && first[1] == 0.0);
        assert!((clipped[1].as_slice::<f32>()[0] - 0.8).abs() < 1e-6);
    }
}
