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
//! The padding copies the weight, so it is kept for products of at least [`MIN_ROWS`] input rows
//! (training and prefill), where the product is compute-bound; decoding a few tokens reads the
//! weight once in a matrix-vector product that has no such cliff. On the CPU the BLAS product has
//! none either and the copy would be pure cost, so the padding is the GPU's only.

use super::linear_grad::linear_with_row_major_grad;
use crate::device::{default_kind, DeviceKind};
use crate::error::Result;
use mlx_rs::ops::indexing::{Ellipsis, IndexOp};
use mlx_rs::{ops, Array};

/// The multiple the output features are padded to: 64 values is 128 bytes in bfloat16, the
/// widest vector load and the tile edge of the products that fall back.
const ALIGN: i32 = 64;

/// Counts that are a multiple of this already give 16-byte aligned rows in every float dtype
/// MLX computes in (8 bfloat16 values), which the vectorised kernels accept: no padding.
const ALIGNED: i32 = 8;

/// The fewest input rows for which the padding pays for its copy of the weight.
const MIN_ROWS: i32 = 256;

/// `x @ w.T (+ b)` through [`linear_with_row_major_grad`], with `w`'s rows (and `b`) padded to a
/// multiple of [`ALIGN`] when their count is not a multiple of [`ALIGNED`] and the product runs
/// on a GPU over at least [`MIN_ROWS`] rows of `x`.
pub fn linear(x: &Array, w: &Array, b: Option<&Array>) -> Result<Array> {
    let outputs = w.shape()[0];
    let shape = x.shape();
    let rows: i32 = shape[..shape.len().saturating_sub(1)].iter().product();
    if outputs % ALIGNED == 0 || rows < MIN_ROWS || default_kind()? != DeviceKind::Gpu {
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
    use super::*;
    use crate::error::Error;
    use mlx_rs::error::Exception;
    use mlx_rs::random;
    use mlx_rs::transforms::value_and_grad_with_argnums as value_and_grad;

    /// `sum(product(x, w, b) * r)`: its gradients are `r`'s pull-back through the product.
    fn objective(
        pad: i32,
        r: Array,
    ) -> impl FnMut(&[Array]) -> std::result::Result<Vec<Array>, Exception> {
        move |args: &[Array]| {
            let y = match pad {
                0 => linear_with_row_major_grad(&args[0], &args[1], Some(&args[2])),
                pad => padded(&args[0], &args[1], Some(&args[2]), pad),
            }
            .map_err(Error::into_exception)?;
            Ok(vec![y.multiply(&r)?.sum(false)?])
        }
    }

    /// The padded product of 7 outputs (padded to 64) and its gradients in `x`, `w` and `b`
    /// equal the unpadded product's, in shape and value.
    #[test]
    fn padding_changes_neither_the_product_nor_its_gradients() {
        let key = |seed: u64| random::key(seed).unwrap();
        let normal =
            |shape: &[i32], seed| random::normal::<f32>(shape, None, None, &key(seed)).unwrap();
        let args = [normal(&[2, 5, 3], 0), normal(&[7, 3], 1), normal(&[7], 2)];
        let r = normal(&[2, 5, 7], 3);
        let argnums = [0, 1, 2];
        let (value, grads) = value_and_grad(objective(0, r.clone()), &argnums)(&args).unwrap();
        let (padded_value, padded_grads) =
            value_and_grad(objective(57, r), &argnums)(&args).unwrap();
        let close = |a: &Array, b: &Array| {
            a.shape() == b.shape() && a.all_close(b, 1e-6, 1e-6, None).unwrap()
        };
        assert!(close(&value[0], &padded_value[0]));
        for (plain, padded) in grads.iter().zip(&padded_grads) {
            assert!(close(plain, padded), "{plain:?} against {padded:?}");
        }
    }
}
