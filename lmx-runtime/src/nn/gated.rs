//! The SiLU-gated product of a gated MLP, `silu(gate) * up`, as one function on a CUDA GPU.
//!
//! Written as two operations, the product is two kernels forward (the SiLU, then the product,
//! with `silu(gate)` kept for the backward pass) and three backward. On a CUDA GPU it is one
//! custom function over two of lmx's kernels ([`crate::cuda`]): the forward pass reads `gate` and
//! `up` and writes the product, and the backward pass reads `gate`, `up` and the cotangent and
//! writes both gradients, computing the sigmoid again instead of keeping it; each computes in
//! float32 and rounds its outputs once. MLX's compiled step does not fuse the same passes written
//! as MLX operations (docs/benchmarks.md, GRPO's update), so elsewhere, and in passes whose
//! gradient is never taken, it is the two operations, which MLX fuses with their neighbours in a
//! traced decode step. The `.lmx` code generator lowers `silu(a) * b` to it.

use super::activation::{kernels_take, silu};
use super::custom_vjp::{self, WithGradient};
use crate::cuda;
use crate::error::{Error, Result};
use mlx_rs::Array;

#[derive(Clone, Copy, PartialEq)]
struct GatedProduct;

impl WithGradient for GatedProduct {
    const NAME: &'static str = "a SiLU-gated product";

    fn forward(&self, inputs: &[Array]) -> Result<Vec<Array>> {
        let [gate, up] = inputs else {
            return Err(arity());
        };
        Ok(vec![cuda::swiglu(gate, up)?])
    }

    fn vjp(&self, primals: &[Array], cotangents: &[Array]) -> Result<Vec<Array>> {
        let ([gate, up], Some(dy)) = (primals, cotangents.first()) else {
            return Err(arity());
        };
        Ok(cuda::swiglu_backward(gate, up, dy)?.into())
    }
}

fn arity() -> Error {
    Error::Layout("a gated product takes its gate, its input and one cotangent".into())
}

/// `silu(gate) * up`, the gated MLP's product (SwiGLU's): lmx's kernels on a CUDA GPU where a
/// gradient may be taken and `gate` and `up` have one shape and one floating dtype; the two
/// operations otherwise (a broadcast, a promotion, integers, an empty pair, another backend).
pub fn swiglu(gate: &Array, up: &Array) -> Result<Array> {
    if !(kernels_take(gate) && gate.shape() == up.shape() && gate.dtype() == up.dtype()) {
        return Ok(silu(gate)?.multiply(up)?);
    }
    custom_vjp::apply(&GatedProduct, &[gate.clone(), up.clone()])?
        .pop()
        .ok_or_else(|| Error::Layout("a gated product returned nothing".into()))
}

#[cfg(test)]
mod tests {
    use super::super::same_gradients::assert_same_values_and_gradients;
    use super::*;
    use crate::nn::without_gradients;
    use mlx_rs::error::Exception;
    use mlx_rs::transforms::compile::compile;
    use mlx_rs::transforms::value_and_grad_with_argnums;
    use mlx_rs::{ops, Dtype};

    const GATE: [f32; 6] = [0.0, 1.0, -2.0, 3.5, -0.25, 0.75];
    const UP: [f32; 6] = [1.0, 2.0, 3.0, -1.5, 0.5, -4.0];
    const R: [f32; 6] = [1.0, 1.0, 1.0, 0.5, -2.0, 1.5];

    fn plain(args: &[Array]) -> Result<Array> {
        Ok(args[0]
            .multiply(ops::sigmoid(&args[0])?)?
            .multiply(&args[1])?)
    }

    fn ours(args: &[Array]) -> Result<Array> {
        swiglu(&args[0], &args[1])
    }

    /// `sum(swiglu(gate, up) * r)`'s gradients in `gate` and `up`, with `swiglu(gate, up)`.
    fn value_and_gradients(args: &[Array], r: &Array) -> Vec<Array> {
        let r = r.clone();
        let objective = move |args: &[Array]| -> std::result::Result<Vec<Array>, Exception> {
            let y = ours(args).map_err(Error::into_exception)?;
            Ok(vec![y.multiply(&r)?.sum(false)?, y])
        };
        let (values, grads) = value_and_grad_with_argnums(objective, &[0, 1])(args).unwrap();
        vec![values[1].clone(), grads[0].clone(), grads[1].clone()]
    }

    fn close(a: &Array, b: &Array, tolerance: f64) -> bool {
        a.shape() == b.shape() && a.all_close(b, tolerance, tolerance, None).unwrap()
    }

    /// The value and both gradients against the derivative written out in float64 on the host.
    #[test]
    fn value_and_gradients_match_the_closed_form() {
        let args = [
            Array::from_slice(&GATE, &[2, 3]),
            Array::from_slice(&UP, &[2, 3]),
        ];
        let got = value_and_gradients(&args, &Array::from_slice(&R, &[2, 3]));
        for i in 0..GATE.len() {
            let (g, u, r) = (GATE[i] as f64, UP[i] as f64, R[i] as f64);
            let s = 1.0 / (1.0 + (-g).exp());
            let want = [g * s * u, r * u * s * (1.0 + g * (1.0 - s)), r * g * s];
            for (got, want) in got.iter().zip(want) {
                let got = got.as_slice::<f32>()[i] as f64;
                assert!(
                    (got - want).abs() < 1e-6 * (1.0 + want.abs()),
                    "{i}: {got} against {want}"
                );
            }
        }
        assert!(!cuda::available() || custom_vjp::is_made(&GatedProduct));
        // Hand-computed at gate 1, up 2: sigmoid(1) = 0.7310586, d gate = 2 (0.7310586 +
        // 0.7310586 x 0.2689414) = 1.8553411, d up = 0.7310586.
        assert!((got[1].as_slice::<f32>()[1] - 1.855_341_1).abs() < 1e-6);
        assert!((got[2].as_slice::<f32>()[1] - 0.731_058_6).abs() < 1e-6);
    }

    /// The same numbers as MLX's own derivative of the two operations: eagerly, a broadcast
    /// `up` (which takes the two operations), inside a compiled function, and without
    /// gradients; an empty pair computes nothing.
    #[test]
    fn it_computes_what_the_two_operations_compute() {
        assert_same_values_and_gradients(&[&[4, 8, 16], &[4, 8, 16]], plain, ours, 1e-5);
        assert_same_values_and_gradients(&[&[4, 8, 16], &[1, 16]], plain, ours, 1e-6);
        let normal = || mlx_rs::random::normal::<f32>(&[4, 8, 16], None, None, None).unwrap();
        let (args, r) = ([normal(), normal()], normal());
        let eager = value_and_gradients(&args, &r);
        let in_compiled = |args: &[Array]| -> std::result::Result<Vec<Array>, Exception> {
            let objective = |args: &[Array]| -> std::result::Result<Vec<Array>, Exception> {
                let y = ours(&args[..2]).map_err(Error::into_exception)?;
                Ok(vec![y.multiply(&args[2])?.sum(false)?])
            };
            Ok(value_and_grad_with_argnums(objective, &[0, 1])(args)?.1)
        };
        let compiled = compile(in_compiled, false)(&[args[0].clone(), args[1].clone(), r]).unwrap();
        assert!(close(&compiled[0], &eager[1], 1e-5) && close(&compiled[1], &eager[2], 1e-5));
        let free = without_gradients(|| ours(&args)).unwrap();
        assert!(close(&free, &eager[0], 1e-6));
        let empty = Array::from_slice::<f32>(&[], &[0, 3]);
        assert_eq!(swiglu(&empty, &empty).unwrap().shape(), [0, 3]);
    }

    /// In bfloat16 the value and both gradients are the float32 ones of the same bfloat16
    /// inputs, rounded once, on a CUDA GPU: equal but for the few a different contraction of the
    /// arithmetic into fused multiply-adds may tip (the two operations in bfloat16, rounding after
    /// every step, miss far more often).
    /// Elsewhere, where the two operations run, within 1% of the largest value.
    #[test]
    fn bfloat16_rounds_each_output_once() {
        let normal = |seed| {
            let key = mlx_rs::random::key(seed).unwrap();
            let x = mlx_rs::random::normal::<f32>(&[64, 64], None, None, &key).unwrap();
            x.multiply(Array::from_f32(3.0))
                .unwrap()
                .as_dtype(Dtype::Bfloat16)
                .unwrap()
        };
        let half = [normal(1), normal(2)];
        let r = normal(3);
        let wide = |a: &Array| a.as_dtype(Dtype::Float32).unwrap();
        let ours = value_and_gradients(&half, &r);
        let exact = value_and_gradients(&half.each_ref().map(wide), &wide(&r));
        for (got, want) in ours.iter().zip(&exact) {
            assert_eq!(got.dtype(), Dtype::Bfloat16);
            let rounded = want.as_dtype(Dtype::Bfloat16).unwrap();
            if cuda::available() {
                let missed = got
                    .ne(&rounded)
                    .unwrap()
                    .sum(false)
                    .unwrap()
                    .item_cast::<u32>();
                assert!(
                    missed <= 40,
                    "{missed} of 4096 differ from the rounded float32 result"
                );
            } else {
                let largest = |a: &Array| a.abs().unwrap().max(None).unwrap().item_exact::<f32>();
                let gap = largest(&wide(got).subtract(want).unwrap());
                assert!(gap <= 1e-2 * largest(want), "{gap} of {}", largest(want));
            }
        }
    }
}
