//! Products whose output features are padded to an aligned count on a GPU.
//!
//! A product `x @ w.T` whose output count is not a multiple of 8 (GPT-2's vocabulary of 50,257
//! is the case met) gives the logits a row stride that no vectorised GEMM kernel accepts: cuBLAS
//! falls back to slow kernels for the forward product and for both of its gradient's products,
//! whose operand is the logits' cotangent of the same stride. The weight is padded here with zero rows to a
//! multiple of [`ALIGN`] before the product and the output cut back to its count after it, so
//! every operand is aligned; the zero rows add nothing to the kept outputs, and the padding's
//! gradient (a slice of the padded weight's) never reaches the parameter.
//!
//! The padding copies the weight, so it is kept for compute-bound products on a GPU
//! ([`gpu_rows`](super::gpu_rows)'s rule).

use super::decode_product::decode_product;
use super::gpu_rows::many_rows_on_gpu;
use super::linear_grad::linear_with_row_major_grad;
use crate::cuda::Weight;
use crate::error::Result;
use mlx_rs::ops::indexing::{Ellipsis, IndexOp};
use mlx_rs::{ops, Array};

/// The multiple the output features are padded to: 64 values is 128 bytes in bfloat16, the
/// widest vector load and the tile edge of the products that fall back.
const ALIGN: i32 = 64;

/// Counts that are a multiple of this already give 16-byte aligned rows in every float dtype
/// MLX computes in (8 bfloat16 values), which the vectorised kernels accept: no padding.
const ALIGNED: i32 = 8;

/// `x @ w.T (+ b)`: decoding's few rows through [`decode_product`]; otherwise through
/// [`linear_with_row_major_grad`], with `w`'s rows (and `b`) padded to a
/// multiple of [`ALIGN`] when their count is not a multiple of [`ALIGNED`] and the product runs
/// on a GPU over at least [`MIN_ROWS`](super::gpu_rows::MIN_ROWS) rows of `x`.
pub fn linear(x: &Array, w: &Array, b: Option<&Array>) -> Result<Array> {
    let biases = b.map(|b| [b]);
    if let Some(mut y) = decode_product(x, &[Weight::Dense(w)], biases.as_ref().map(|b| &b[..]))? {
        return Ok(y.remove(0));
    }
    let outputs = w.shape()[0];
    if outputs % ALIGNED == 0 || !many_rows_on_gpu(x)? {
        return linear_with_row_major_grad(x, w, b);
    }
    padded(x, w, b, (ALIGN - outputs % ALIGN) % ALIGN)
}

/// `x @ w.T (+ b)` over `w` and `b` padded with `pad` zero rows, the output cut back.
fn padded(x: &Array, w: &Array, b: Option<&Array>, pad: i32) -> Result<Array> {
    let zeros = |shape: &[i32], like: &Array| -> Result<Array> {
        Ok(Array::zeros::<f32>(shape)?.as_dtype(like.dtype())?)
    };
    let weight = ops::concatenate(&[w, &zeros(&[pad, w.shape()[1]], w)?], 0)?;
    let bias = match b {
        Some(b) => Some(ops::concatenate(&[b, &zeros(&[pad], b)?], 0)?),
        None => None,
    };
    let y = linear_with_row_major_grad(x, &weight, bias.as_ref())?;
    Ok(y.index((Ellipsis, ..w.shape()[0])))
}

#[cfg(test)]
mod tests {
    use super::super::same_gradients::assert_same_values_and_gradients;
    use super::*;

    /// The padded product of 7 outputs (padded to 64) and its gradients in `x`, `w` and `b`
    /// equal the unpadded product's, in shape and value.
    #[test]
    fn padding_changes_neither_the_product_nor_its_gradients() {
        assert_same_values_and_gradients(
            &[&[2, 5, 3], &[7, 3], &[7]],
            |args| linear_with_row_major_grad(&args[0], &args[1], Some(&args[2])),
            |args| padded(&args[0], &args[1], Some(&args[2]), 57),
            1e-6,
        );
    }
}
