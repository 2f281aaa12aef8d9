//! The embedding lookup with its gradient written out, so that the table's gradient is summed in
//! float32.
//!
//! MLX differentiates `table[ids]` by a scatter-add of the output's cotangent into zeros of the
//! table's dtype. In bfloat16 that is a sum of thousands of rows per frequent token in 8 bits of
//! mantissa, and on MLX's CUDA backend 16-bit atomic adds, contended on frequent ids: the
//! scatter of GPT-2 124M's 16 x 1024 tokens took 7.5 ms of a 42 ms step on the H100
//! (docs/benchmarks.md, "Data parallel"). Here the rows are added into a float32 table and the
//! sum cast once to the table's dtype: float32 atomics, and a gradient rounded once.
//!
//! The lookup is an MLX custom function (see `custom_vjp`) over `[table, ids]`.

use super::custom_vjp::{self, WithGradient};
use crate::error::{Error, Result};
use mlx_rs::ops::indexing::scatter_add_single;
use mlx_rs::{ops, Array, Dtype};

/// `table[ids]` with the table's gradient summed in float32.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Lookup;

impl WithGradient for Lookup {
    const NAME: &'static str = "the embedding lookup";

    fn forward(&self, inputs: &[Array]) -> Result<Vec<Array>> {
        let [table, ids] = inputs else {
            return Err(arity(inputs.len()));
        };
        // On CUDA lmx's kernel copies whole 16-byte pieces of the rows (`cuda/rows.rs`).
        if crate::cuda::available() && crate::cuda::rows_fit(table, ids) {
            return Ok(vec![crate::cuda::rows(table, ids)?]);
        }
        Ok(vec![table.take_axis(ids, 0)?])
    }

    /// `[d table, d ids]`: the cotangent's rows added into a float32 table at their ids; ids,
    /// integers, get zeros.
    fn vjp(&self, primals: &[Array], cotangents: &[Array]) -> Result<Vec<Array>> {
        let [table, ids] = primals else {
            return Err(arity(primals.len()));
        };
        let dy = cotangents.first().ok_or_else(|| {
            Error::Layout("the embedding lookup's gradient got no cotangent".into())
        })?;
        let shape = table.shape();
        let dim = shape[1];
        let rows = ids.reshape(&[-1])?;
        // One update per id, `[n, 1, dim]`: the slice of the table each one adds to.
        let updates = dy.reshape(&[-1, 1, dim])?.as_dtype(Dtype::Float32)?;
        let sums =
            scatter_add_single(ops::zeros_dtype(shape, Dtype::Float32)?, &rows, &updates, 0)?;
        Ok(vec![sums.as_dtype(table.dtype())?, ops::zeros_like(ids)?])
    }
}

/// The rows of `table` (`[vocab, dim]`) for the integer `ids`: `[...] -> [..., dim]`, whose
/// gradient in `table` is summed in float32.
pub fn lookup(table: &Array, ids: &Array) -> Result<Array> {
    custom_vjp::apply(&Lookup, &[table.clone(), ids.clone()])?
        .pop()
        .ok_or_else(|| Error::Layout("the embedding lookup returned nothing".into()))
}

fn arity(count: usize) -> Error {
    Error::Layout(format!(
        "the embedding lookup takes [table, ids], got {count} arrays"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::error::Exception;
    use mlx_rs::random;
    use mlx_rs::transforms::value_and_grad_with_argnums as value_and_grad;

    /// `sum(lookup(table, ids) * r)`, differentiated in the table.
    fn table_gradient(
        lookup: fn(&Array, &Array) -> Result<Array>,
        table: &Array,
        ids: &Array,
        r: &Array,
    ) -> (Array, Array) {
        let (ids, r) = (ids.clone(), r.clone());
        let objective = move |args: &[Array]| -> std::result::Result<Vec<Array>, Exception> {
            let y = lookup(&args[0], &ids).map_err(Error::into_exception)?;
            Ok(vec![y.multiply(&r)?.sum(false)?])
        };
        let (values, grads) = value_and_grad(objective, &[0])(std::slice::from_ref(table)).unwrap();
        (values[0].clone(), grads[0].clone())
    }

    /// MLX differentiating `take` itself: the independent reference.
    fn plain(table: &Array, ids: &Array) -> Result<Array> {
        Ok(table.take_axis(ids, 0)?)
    }

    fn values(array: &Array) -> Vec<f32> {
        array.as_dtype(Dtype::Float32).unwrap().as_slice().to_vec()
    }

    #[test]
    fn float32_values_and_gradients_are_mlx_s() {
        let key = |seed: u64| random::key(seed).unwrap();
        let table = random::normal::<f32>(&[7, 3], None, None, &key(0)).unwrap();
        // Repeated ids: their rows' cotangents add up.
        let ids = Array::from_slice(&[1i32, 4, 1, 6, 0, 1], &[2, 3]);
        let r = random::normal::<f32>(&[2, 3, 3], None, None, &key(1)).unwrap();
        let (ours, our_grad) = table_gradient(lookup, &table, &ids, &r);
        let (theirs, their_grad) = table_gradient(plain, &table, &ids, &r);
        assert_eq!(values(&ours), values(&theirs));
        assert_eq!(our_grad.shape(), table.shape());
        for (a, b) in values(&our_grad).iter().zip(values(&their_grad)) {
            assert!((a - b).abs() <= 1e-6, "{a} vs {b}");
        }
        // Rows no id names get nothing.
        assert!(values(&our_grad)[2 * 3..4 * 3].iter().all(|v| *v == 0.0));
    }

    /// 4,096 cotangents of 1 + 2^-7 (a bfloat16 number) on one id of a bfloat16 table: the
    /// float32 sum, 4,128, is a bfloat16 number too (4,096 + 32), whereas a running sum kept in
    /// bfloat16 stops growing once its spacing passes twice the addend (at 512, where adding
    /// 1.0078 rounds away: MLX differentiating `take` gives 512).
    #[test]
    fn a_bfloat16_tables_gradient_is_summed_in_float32() {
        let table = ops::zeros_dtype(&[3, 2], Dtype::Bfloat16).unwrap();
        let ids = ops::full::<i32>(&[4096], Array::from_int(2)).unwrap();
        let r = ops::full::<f32>(&[4096, 2], Array::from_f32(1.0 + 1.0 / 128.0))
            .unwrap()
            .as_dtype(Dtype::Bfloat16)
            .unwrap();
        let (_, grad) = table_gradient(lookup, &table, &ids, &r);
        assert_eq!(grad.dtype(), Dtype::Bfloat16);
        assert_eq!(values(&grad), vec![0.0, 0.0, 0.0, 0.0, 4128.0, 4128.0]);
    }
}
