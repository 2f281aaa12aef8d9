//! The linear layer with its gradient written out, so that a weight's gradient comes out in the
//! weight's own layout.
//!
//! Differentiating `x @ w.T` through MLX's matmul and transpose gives the weight's gradient as a
//! transposed view of `x.T @ dy`. Every later elementwise kernel that reads it (the global norm,
//! the clip, the optimizer's fused update) then walks it column by column. Here the gradient is
//! `dy.T @ x`, a matrix product that lands row-major like the weight, at the same FLOPs. On the
//! CPU the compiled step of the 151M-parameter `medium` GPT went from 3.5 s to 1.5 s this way, all
//! of it in the optimizer's update (docs/benchmarks.md). The price: MLX keeps a custom function's
//! outputs until its gradient runs, so each layer's output lives until the backward pass.
//!
//! The layer is an MLX custom function (see `custom_vjp`): a forward over `[x, w]` or `[x, w, b]`
//! and the vector-Jacobian product below, whose bias gradient is a float32-accumulated
//! [`column_sum`].

use super::column_sum::column_sum;
use super::custom_vjp::{self, WithGradient};
use super::gpu_rows::one_row_on_gpu;
use crate::error::{Error, Result};
use mlx_rs::{ops, Array};

/// The linear layer `x @ w.T (+ b)` with its gradient written out.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Linear;

impl WithGradient for Linear {
    const NAME: &'static str = "the linear layer";

    /// The forward pass, as `mlx.nn.Linear` computes it.
    fn forward(&self, inputs: &[Array]) -> Result<Vec<Array>> {
        let y = match inputs {
            [x, w] => x.matmul(w.t())?,
            // MLX's CUDA backend multiplies one row by its matrix-vector kernel only when no bias
            // is fused in; with one it goes to cuBLASLt, whose host-side setup per product (a
            // stream capture into a child graph) costs a decoded token more than the kernel.
            [x, w, b] if one_row_on_gpu(x)? => ops::add(&x.matmul(w.t())?, b)?,
            [x, w, b] => ops::addmm(b, x, w.t(), None, None)?,
            _ => return Err(arity(inputs.len())),
        };
        Ok(vec![y])
    }

    /// `[dx, dw (, db)]` for the cotangent `dy` of the output.
    fn vjp(&self, primals: &[Array], cotangents: &[Array]) -> Result<Vec<Array>> {
        let (x, w) = match primals {
            [x, w] | [x, w, _] => (x, w),
            _ => return Err(arity(primals.len())),
        };
        let dy = cotangents
            .first()
            .ok_or_else(|| Error::Layout("the linear layer's gradient got no cotangent".into()))?;
        let (outputs, features) = (w.shape()[0], w.shape()[1]);
        let dy_rows = dy.reshape(&[-1, outputs])?;
        let mut grads = vec![
            dy.matmul(w)?,
            dy_rows.t().matmul(x.reshape(&[-1, features])?)?,
        ];
        if primals.len() == 3 {
            grads.push(column_sum(&dy_rows)?);
        }
        Ok(grads)
    }
}

/// `x @ w.T (+ b)` over the last axis of `x`, with the gradient of `w` computed as `dy.T @ x`.
pub fn linear_with_row_major_grad(x: &Array, w: &Array, b: Option<&Array>) -> Result<Array> {
    let mut inputs = vec![x.clone(), w.clone()];
    inputs.extend(b.cloned());
    custom_vjp::apply(&Linear, &inputs)?
        .pop()
        .ok_or_else(|| Error::Layout("the linear layer returned nothing".into()))
}

fn arity(count: usize) -> Error {
    Error::Layout(format!(
        "the linear layer takes [x, w] or [x, w, b], got {count} arrays"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::without_gradients;
    use mlx_rs::error::Exception;
    use mlx_rs::random;
    use mlx_rs::transforms::{compile::compile, value_and_grad_with_argnums as value_and_grad};

    /// `sum(linear(x, w, b) * r)`: its gradient in `x`, `w` and `b` is `r`'s pull-back.
    fn objective(
        linear: fn(&[Array]) -> Result<Array>,
        r: Array,
    ) -> impl FnMut(&[Array]) -> std::result::Result<Vec<Array>, Exception> {
        move |args: &[Array]| {
            let y = linear(args).map_err(Error::into_exception)?;
            Ok(vec![y.multiply(&r)?.sum(false)?])
        }
    }

    fn custom(args: &[Array]) -> Result<Array> {
        linear_with_row_major_grad(&args[0], &args[1], args.get(2))
    }

    /// The formula differentiated by MLX itself: the independent reference.
    fn plain(args: &[Array]) -> Result<Array> {
        let y = args[0].matmul(args[1].t())?;
        Ok(match args.get(2) {
            Some(b) => y.add(b)?,
            None => y,
        })
    }

    fn inputs(bias: bool) -> (Vec<Array>, Array) {
        let key = |seed: u64| random::key(seed).unwrap();
        let x = random::normal::<f32>(&[2, 3, 4], None, None, &key(0)).unwrap();
        let w = random::normal::<f32>(&[5, 4], None, None, &key(1)).unwrap();
        let r = random::normal::<f32>(&[2, 3, 5], None, None, &key(3)).unwrap();
        let mut args = vec![x, w];
        if bias {
            args.push(random::normal::<f32>(&[5], None, None, &key(2)).unwrap());
        }
        (args, r)
    }

    fn max_difference(a: &Array, b: &Array) -> f32 {
        a.subtract(b)
            .unwrap()
            .abs()
            .unwrap()
            .max(false)
            .unwrap()
            .item_exact::<f32>()
    }

    #[test]
    fn values_and_gradients_match_mlx_differentiating_the_formula() {
        for bias in [false, true] {
            let (args, r) = inputs(bias);
            let argnums: Vec<i32> = (0..args.len() as i32).collect();
            let (ours, our_grads) =
                value_and_grad(objective(custom, r.clone()), &argnums)(&args).unwrap();
            let (theirs, their_grads) =
                value_and_grad(objective(plain, r.clone()), &argnums)(&args).unwrap();
            assert!(max_difference(&ours[0], &theirs[0]) < 1e-5);
            assert_eq!(our_grads.len(), args.len());
            for (index, (ours, theirs)) in our_grads.iter().zip(&their_grads).enumerate() {
                assert_eq!(ours.shape(), args[index].shape());
                let difference = max_difference(ours, theirs);
                assert!(
                    difference < 1e-5,
                    "input {index} (bias {bias}): {difference}"
                );
            }
        }
    }

    #[test]
    fn the_weight_gradient_is_dy_transposed_times_x_by_hand() {
        // x = [[1, 2]], w = [[1, 0], [0, 1], [1, 1]], r = [[1, 2, 3]]: dw = r.T @ x.
        let x = Array::from_slice(&[1.0f32, 2.0], &[1, 2]);
        let w = Array::from_slice(&[1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0], &[3, 2]);
        let r = Array::from_slice(&[1.0f32, 2.0, 3.0], &[1, 3]);
        let (_, grads) = value_and_grad(objective(custom, r), &[0, 1])(&[x, w]).unwrap();
        assert_eq!(grads[1].as_slice::<f32>(), [1.0, 2.0, 2.0, 4.0, 3.0, 6.0]);
        // dx = r @ w = [1 + 3, 2 + 3].
        assert_eq!(grads[0].as_slice::<f32>(), [4.0, 5.0]);
    }

    #[test]
    fn the_gradient_is_the_same_inside_a_compiled_function() {
        let (args, r) = inputs(true);
        let argnums = [0, 1, 2];
        let mut eager = value_and_grad(objective(custom, r.clone()), &argnums);
        let (_, expected) = eager(&args).unwrap();
        let grads_of = move |args: &[Array]| -> std::result::Result<Vec<Array>, Exception> {
            let (_, grads) = value_and_grad(objective(custom, r.clone()), &argnums)(args)?;
            Ok(grads)
        };
        let mut compiled = compile(grads_of, false);
        let grads = compiled(&args).unwrap();
        for (ours, theirs) in grads.iter().zip(&expected) {
            let difference = max_difference(ours, theirs);
            assert!(difference < 1e-5, "{difference}");
        }
    }

    #[test]
    fn the_weight_gradient_comes_out_row_major_like_the_weight() {
        let (args, r) = inputs(true);
        let (_, grads) = value_and_grad(objective(custom, r), &[1])(&args).unwrap();
        mlx_rs::transforms::eval([&grads[0]]).unwrap();
        assert_eq!(grads[0].shape(), [5, 4]);
        assert_eq!(grads[0].strides(), [4, 1]);
    }

    #[test]
    fn without_gradients_the_custom_function_is_not_made_and_the_mode_is_restored() {
        // A fresh thread: its custom function is made on its first use outside the scope.
        std::thread::spawn(|| {
            let (args, _) = inputs(true);
            let made = || custom_vjp::is_made(&Linear);
            let inside = without_gradients(|| {
                let nested = without_gradients(|| custom(&args).unwrap());
                // Still inside the outer scope after the nested one has ended.
                let after_nested = custom(&args).unwrap();
                assert!(max_difference(&nested, &after_nested) < 1e-6);
                after_nested
            });
            assert!(!made(), "inside the scopes the layer is the plain product");
            let outside = custom(&args).unwrap();
            assert!(made(), "outside it, the custom function");
            assert!(max_difference(&inside, &outside) < 1e-6, "the same numbers");

            let unwound = std::panic::catch_unwind(|| without_gradients(|| panic!("inside")));
            assert!(unwound.is_err());
            assert!(
                !custom_vjp::gradient_free(),
                "the mode is restored after a scope that panicked"
            );
        })
        .join()
        .unwrap();
    }

    #[test]
    fn mismatched_shapes_are_an_error_that_names_them() {
        let x = Array::from_slice(&[1.0f32, 2.0, 3.0], &[1, 3]);
        let w = Array::from_slice(&[1.0f32, 0.0], &[1, 2]);
        let message = linear_with_row_major_grad(&x, &w, None)
            .unwrap_err()
            .to_string();
        assert!(message.contains("[matmul]"), "{message}");
        assert!(
            message.contains("(1,3)") && message.contains("(2,1)"),
            "{message}"
        );
    }
}
