//! The (token, choice) rows of sparse experts put in expert order and back, with gradients that
//! gather instead of scatter.
//!
//! [`switch_glu`](super::switch_glu) sorts its rows by expert before MLX's `gather_mm` and puts
//! the products back in order afterwards, two `take`s by a permutation (the first also repeats
//! each token once per choice). MLX differentiates a `take` by a scatter-add of the cotangent
//! into zeros: a zeroed buffer, then an atomic add per element on its CUDA backend (16-bit
//! atomics in bfloat16), two scatters of `tokens * k` rows of the model's width per layer in
//! every backward pass. The gradient of a permutation is the inverse permutation, a gather, and
//! a token's repeats are then neighbours, summed by a reduction: the same sums, no atomics, and
//! in a fixed order.

use super::custom_vjp::{self, WithGradient};
use crate::error::{Error, Result};
use mlx_rs::{ops, Array};

/// `x`'s rows taken in the order `order` gives, each of `x`'s rows standing for `repeats`
/// consecutive entries of `order`'s range: row `j` of the result is `x[order[j] / repeats]`.
/// `order` (integers, `[rows * repeats]`) is a permutation and `inverse` its inverse.
pub(crate) fn reorder(x: &Array, order: &Array, inverse: &Array, repeats: i32) -> Result<Array> {
    custom_vjp::apply(
        &Reorder { repeats },
        &[x.clone(), order.clone(), inverse.clone()],
    )?
    .pop()
    .ok_or_else(|| Error::Layout("the experts' reordering returned nothing".into()))
}

/// [`reorder`]'s custom function over `[x, order, inverse]`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Reorder {
    repeats: i32,
}

impl WithGradient for Reorder {
    const NAME: &'static str = "the experts' reordering";

    fn forward(&self, inputs: &[Array]) -> Result<Vec<Array>> {
        let [x, order, _] = inputs else {
            return Err(arity(inputs.len()));
        };
        let rows = match self.repeats {
            1 => order.clone(),
            repeats => order.floor_divide(Array::from_int(repeats))?,
        };
        Ok(vec![x.take_axis(&rows, 0)?])
    }

    /// Row `t` of `dx` sums the cotangent's rows `inverse[t * repeats + c]` over `c`; the
    /// permutations, integers, get zeros.
    fn vjp(&self, primals: &[Array], cotangents: &[Array]) -> Result<Vec<Array>> {
        let [x, order, inverse] = primals else {
            return Err(arity(primals.len()));
        };
        let dy = cotangents
            .first()
            .ok_or_else(|| Error::Layout("the experts' reordering got no cotangent".into()))?;
        let back = dy.take_axis(inverse, 0)?;
        let dx = match self.repeats {
            1 => back,
            repeats => {
                let mut shape = x.shape().to_vec();
                shape.insert(1, repeats);
                back.reshape(&shape)?.sum_axis(1, false)?
            }
        };
        Ok(vec![dx, ops::zeros_like(order)?, ops::zeros_like(inverse)?])
    }
}

fn arity(count: usize) -> Error {
    Error::Layout(format!(
        "the experts' reordering takes [x, order, inverse], got {count} arrays"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::transforms::value_and_grad;

    /// `<w, f(x)>` and its gradient in `x`.
    fn gradient(f: impl Fn(&Array) -> Result<Array> + 'static, x: &Array, w: &Array) -> Array {
        let w = w.clone();
        let objective =
            move |args: &[Array]| -> std::result::Result<Vec<Array>, mlx_rs::error::Exception> {
                let y = f(&args[0]).map_err(Error::into_exception)?;
                Ok(vec![y.multiply(&w)?.sum(None)?])
            };
        let (_, grads) = value_and_grad(objective)(std::slice::from_ref(x)).unwrap();
        grads.into_iter().next().unwrap()
    }

    #[test]
    fn values_and_gradients_are_the_plain_takes() -> Result<()> {
        let (tokens, k, d) = (37, 3, 5);
        let key = mlx_rs::random::key(7)?;
        let x = mlx_rs::random::normal::<f32>(&[tokens, 1, d], None, None, &key)?;
        let choices = mlx_rs::random::randint::<_, u32>(0, 8, &[tokens * k], &key)?;
        let order = ops::argsort_axis(&choices, 0)?;
        let inverse = ops::argsort_axis(&order, 0)?;
        let w = mlx_rs::random::normal::<f32>(
            &[tokens * k, 1, d],
            None,
            None,
            &mlx_rs::random::key(8)?,
        )?;

        let rows = order.floor_divide(Array::from_int(k))?;
        let plain = x.take_axis(&rows, 0)?;
        let ours = reorder(&x, &order, &inverse, k)?;
        assert_eq!(
            plain.subtract(&ours)?.abs()?.max(None)?.item_exact::<f32>(),
            0.0
        );

        let (o, i) = (order.clone(), inverse.clone());
        let spread = gradient(move |x| reorder(x, &o, &i, k), &x, &w);
        let r = rows.clone();
        let reference = gradient(move |x| Ok(x.take_axis(&r, 0)?), &x, &w);
        assert!(
            spread
                .subtract(&reference)?
                .abs()?
                .max(None)?
                .item_exact::<f32>()
                < 1e-6
        );

        // Back to token order: the inverse permutation, one row each.
        let y = plain;
        let (o, i) = (order.clone(), inverse.clone());
        let back = gradient(move |y| reorder(y, &i, &o, 1), &y, &w);
        let i = inverse.clone();
        let reference = gradient(move |y| Ok(y.take_axis(&i, 0)?), &y, &w);
        assert_eq!(
            back.subtract(&reference)?
                .abs()?
                .max(None)?
                .item_exact::<f32>(),
            0.0
        );
        Ok(())
    }
}
