//! Sums over a batch's rows, as a bias's gradient is.

use crate::cuda;
use crate::error::Result;
use mlx_rs::{Array, Dtype};

/// The sum of `x: [..., columns]` over every axis but the last, accumulated in float32 and
/// returned in `x`'s dtype.
///
/// MLX sums a bfloat16 array in bfloat16: over the 16,384 rows of a GPT-2 batch its 8-bit
/// mantissa drops much of a bias's gradient. On MLX's CUDA backend this is lmx's own kernel
/// (`cuda`), which also spreads the rows over the whole GPU; elsewhere, MLX's sum of a float32
/// copy.
///
/// ```
/// use lmx_runtime::{nn, Array};
/// let x = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]);
/// assert_eq!(nn::column_sum(&x).unwrap().as_slice::<f32>(), [9.0, 12.0]);
/// ```
pub fn column_sum(x: &Array) -> Result<Array> {
    let columns = x.shape().last().copied().unwrap_or(1);
    let rows = x.reshape(&[-1, columns])?;
    if cuda::available() {
        return cuda::column_sum(&rows);
    }
    Ok(rows
        .as_dtype(Dtype::Float32)?
        .sum_axis(0, false)?
        .as_dtype(x.dtype())?)
}
