//! Elementwise activations.
//!
//! On MLX's CUDA backend each activation is a custom function (`custom_vjp`) over two of lmx's
//! kernels: a forward pass and a backward pass that reads only `x` and the cotangent (in `x`'s
//! precision), each computing in float32 and rounding its result once, one read and one write of
//! the activations. MLX's own gradient of `x (1 + erf(x / sqrt 2)) / 2` keeps `1 + erf(x / sqrt
//! 2)` from the forward pass, and its compiled passes come out as two kernels each: on GPT-2
//! 124M, four passes over every block's 16,384 x 3,072 activations where two do
//! (docs/benchmarks.md).
//!
//! Elsewhere an activation is MLX's operations in the input's precision, as Python MLX's
//! `nn.gelu` computes it, compiled once per thread (shapeless) and differentiated by MLX. There a
//! backward pass from `x` alone would compute `erf` again, which MLX's CPU backend takes 26 ns
//! per value for: a third of an eager step of the tiny GPT.

use super::custom_vjp::{self, WithGradient};
use super::scalar;
use crate::cuda;
use crate::error::{Error, Result};
use mlx_rs::error::Exception;
use mlx_rs::transforms::compile::compile;
use mlx_rs::{ops, Array};
use std::cell::RefCell;

/// An elementwise activation; its discriminant names it to lmx's CUDA kernels (their `ACT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `x (1 + erf(x / sqrt 2)) / 2`.
    Gelu = 0,
    /// `x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) / 2`.
    GeluTanh = 1,
    /// `x sigmoid(x)`.
    Silu = 2,
}

impl Activation {
    /// The activation of `x`, as [`gelu`], [`gelu_tanh`] and [`silu`] compute it.
    pub fn of(self, x: &Array) -> Result<Array> {
        apply(self, x)
    }

    /// The activation of `x` in MLX's operations, in `x`'s precision.
    fn value(self, x: &Array) -> Result<Array> {
        let c = |value: f32| scalar(value, x.dtype());
        Ok(match self {
            Activation::Gelu => {
                let erf = ops::erf(x.multiply(c(std::f32::consts::FRAC_1_SQRT_2)?)?)?;
                x.multiply(erf.add(c(1.0)?)?)?.multiply(c(0.5)?)?
            }
            Activation::GeluTanh => {
                let cubic = x.power(c(3.0)?)?.multiply(c(0.044715)?)?;
                let inner = x
                    .add(cubic)?
                    .multiply(c((2.0 / std::f32::consts::PI).sqrt())?)?;
                let gate = ops::tanh(inner)?.add(c(1.0)?)?;
                x.multiply(gate)?.multiply(c(0.5)?)?
            }
            Activation::Silu => x.multiply(ops::sigmoid(x)?)?,
        })
    }
}

type Compiled = Box<dyn FnMut(&Array) -> std::result::Result<Array, Exception>>;

thread_local! {
    /// Each activation's operations, compiled (shapeless) on first use on this thread.
    static COMPILED: RefCell<Vec<(Activation, Compiled)>> = const { RefCell::new(Vec::new()) };
}

/// `activation` of `x` through its compiled operations: called eagerly (generation, an eager
/// step) it runs as one fused kernel instead of one kernel per operation; inside a step being
/// traced MLX inlines it like any other code.
fn fused(activation: Activation, x: &Array) -> Result<Array> {
    COMPILED.with(|cell| {
        let mut compiled = cell.borrow_mut();
        let index = match compiled.iter().position(|(key, _)| *key == activation) {
            Some(index) => index,
            None => {
                let pure = move |x: &Array| activation.value(x).map_err(Error::into_exception);
                compiled.push((activation, Box::new(compile(pure, true))));
                compiled.len() - 1
            }
        };
        (compiled[index].1)(x).map_err(Error::from)
    })
}

impl WithGradient for Activation {
    const NAME: &'static str = "an activation";

    fn forward(&self, inputs: &[Array]) -> Result<Vec<Array>> {
        Ok(vec![cuda::activation(*self, &inputs[0])?])
    }

    fn vjp(&self, primals: &[Array], cotangents: &[Array]) -> Result<Vec<Array>> {
        let (Some(x), Some(dy)) = (primals.first(), cotangents.first()) else {
            return Err(Error::Layout(
                "an activation's gradient needs its input and one cotangent".into(),
            ));
        };
        Ok(vec![cuda::activation_backward(*self, x, dy)?])
    }
}

/// Whether lmx's elementwise kernels take `x` (here and in the gated product): on a CUDA GPU, in a
/// pass whose gradient may be taken, for a floating-point array they can launch over.
pub(super) fn kernels_take(x: &Array) -> bool {
    !custom_vjp::gradient_free() && cuda::available() && cuda::activation_fits(x)
}

/// `activation` of `x`: lmx's kernels where they run and a gradient may be taken, MLX's
/// operations elsewhere. lmx's kernels pay in training (one read and one write of the
/// activations in each pass, the backward pass from `x` alone); a pass whose gradient is never
/// taken (generation, [`without_gradients`](super::without_gradients)) takes MLX's operations,
/// which a compiled step fuses with their neighbours (the bias added before GELU, the product of
/// a gated MLP after SiLU): one kernel fewer a layer for each token decoded.
fn apply(activation: Activation, x: &Array) -> Result<Array> {
    if x.size() == 0 {
        // MLX's CUDA backend divides by zero launching a compiled kernel over an empty array
        // (Python MLX's `nn.gelu` of a 0 x 3 array dies of SIGFPE there too); its separate
        // operations take one.
        return activation.value(x);
    }
    if !kernels_take(x) {
        return fused(activation, x);
    }
    custom_vjp::apply(&activation, std::slice::from_ref(x))?
        .pop()
        .ok_or_else(|| Error::Layout("an activation returned nothing".into()))
}

/// GELU with the exact error function: `x (1 + erf(x / sqrt 2)) / 2`.
pub fn gelu(x: &Array) -> Result<Array> {
    apply(Activation::Gelu, x)
}

/// GELU's tanh approximation, as GPT-2 trained with it (`gelu_new`).
pub fn gelu_tanh(x: &Array) -> Result<Array> {
    apply(Activation::GeluTanh, x)
}

/// SiLU (swish): `x sigmoid(x)`.
pub fn silu(x: &Array) -> Result<Array> {
    apply(Activation::Silu, x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::without_gradients;
    use mlx_rs::transforms::value_and_grad_with_argnums;
    use mlx_rs::Dtype;

    const ALL: [Activation; 3] = [Activation::Gelu, Activation::GeluTanh, Activation::Silu];

    const X: [f32; 6] = [-3.0, -1.0, -0.25, 0.0, 0.5, 2.0];
    const R: [f32; 6] = [0.5, -1.0, 2.0, 1.5, -0.25, 3.0];

    fn values() -> Array {
        Array::from_slice(&X, &[2, 3])
    }

    fn public(activation: Activation) -> fn(&Array) -> Result<Array> {
        match activation {
            Activation::Gelu => gelu,
            Activation::GeluTanh => gelu_tanh,
            Activation::Silu => silu,
        }
    }

    /// Abramowitz and Stegun 7.1.26, |error| < 1.5e-7.
    fn erf(v: f64) -> f64 {
        let t = 1.0 / (1.0 + 0.3275911 * v.abs());
        let poly = t
            * (0.254829592
                + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
        (1.0 - poly * (-v * v).exp()).copysign(v)
    }

    /// The activation and its derivative at `x`, written out in float64 on the host.
    fn closed_form(activation: Activation, x: f64) -> (f64, f64) {
        match activation {
            Activation::Gelu => {
                let cdf = 0.5 * (1.0 + erf(x / 2f64.sqrt()));
                let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
                (x * cdf, cdf + x * pdf)
            }
            Activation::GeluTanh => {
                let k = (2.0 / std::f64::consts::PI).sqrt();
                let t = (k * (x + 0.044715 * x.powi(3))).tanh();
                let slope = k * (1.0 + 3.0 * 0.044715 * x * x);
                (
                    0.5 * x * (1.0 + t),
                    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * slope,
                )
            }
            Activation::Silu => {
                let s = 1.0 / (1.0 + (-x).exp());
                (x * s, s * (1.0 + x * (1.0 - s)))
            }
        }
    }

    /// `f(x)` and the gradient of `sum(f(x) * r)` in `x`, as float32.
    fn value_and_gradient(
        f: fn(&Array) -> Result<Array>,
        x: &Array,
        r: &Array,
    ) -> (Vec<f32>, Vec<f32>) {
        let r = r.clone();
        let objective = move |args: &[Array]| -> std::result::Result<Vec<Array>, Exception> {
            let y = f(&args[0]).map_err(Error::into_exception)?;
            Ok(vec![y
                .as_dtype(Dtype::Float32)?
                .multiply(r.reshape(args[0].shape())?)?
                .sum(false)?])
        };
        let (_, grads) =
            value_and_grad_with_argnums(objective, &[0])(std::slice::from_ref(x)).unwrap();
        let y = f(x).unwrap().as_dtype(Dtype::Float32).unwrap();
        let grad = grads[0].as_dtype(Dtype::Float32).unwrap();
        (
            y.as_slice::<f32>().to_vec(),
            grad.as_slice::<f32>().to_vec(),
        )
    }

    fn assert_close(got: &[f32], expected: &[f32], tolerance: f32, what: &str) {
        assert_eq!(got.len(), expected.len(), "{what}");
        for (i, (g, e)) in got.iter().zip(expected).enumerate() {
            assert!(
                (g - e).abs() <= tolerance * e.abs().max(1.0),
                "{what}: value {i} is {g}, expected {e} (tolerance {tolerance})"
            );
        }
    }

    /// How far values in `dtype` may be from the float64 closed forms, relative to the larger of 1
    /// and the expected value: lmx's kernels round once from float32; MLX's operations, which
    /// every other backend runs, round after each one.
    fn tolerance(dtype: Dtype) -> f32 {
        let on_cuda = cuda::available();
        match dtype {
            Dtype::Float16 if on_cuda => 2e-3,
            Dtype::Float16 => 3e-3,
            Dtype::Bfloat16 if on_cuda => 8e-3,
            Dtype::Bfloat16 => 1.5e-2,
            _ => 2e-6,
        }
    }

    #[test]
    fn values_and_gradients_match_the_closed_forms() {
        for activation in ALL {
            let (want_y, want_grad): (Vec<f32>, Vec<f32>) = X
                .iter()
                .zip(R)
                .map(|(&x, r)| {
                    let (y, dy) = closed_form(activation, x as f64);
                    (y as f32, (dy * r as f64) as f32)
                })
                .unzip();
            for x in [
                values(),
                values().reshape(&[6]).unwrap(),
                // bfloat16 holds these inputs exactly.
                values().as_dtype(Dtype::Bfloat16).unwrap(),
            ] {
                let tolerance = tolerance(x.dtype());
                let what = format!("{activation:?} of {:?} {:?}", x.shape(), x.dtype());
                let r = Array::from_slice(&R, &[2, 3]);
                let (y, grad) = value_and_gradient(public(activation), &x, &r);
                assert_close(&y, &want_y, tolerance, &format!("{what}: values"));
                assert_close(&grad, &want_grad, tolerance, &format!("{what}: gradients"));
            }
        }
    }

    #[test]
    fn long_inputs_in_every_precision_match_the_closed_forms() {
        // 4,099 values: many threads of the kernels' 16-byte path, then a ragged end. The inputs
        // are rounded to each precision before the reference reads them, and the cotangents are
        // quarters, exact in every precision.
        let n: i32 = 4099;
        let x: Vec<f32> = (0..n)
            .map(|i| (i as f32 * 0.618_034).fract() * 8.0 - 4.0)
            .collect();
        let r: Vec<f32> = (0..n).map(|i| ((i * 7) % 17) as f32 * 0.25 - 2.0).collect();
        let r = Array::from_slice(&r, &[n]);
        for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
            let tolerance = tolerance(dtype);
            let x = Array::from_slice(&x, &[n]).as_dtype(dtype).unwrap();
            let rounded = x.as_dtype(Dtype::Float32).unwrap();
            for activation in ALL {
                let (want_y, want_grad): (Vec<f32>, Vec<f32>) = rounded
                    .as_slice::<f32>()
                    .iter()
                    .zip(r.as_slice::<f32>())
                    .map(|(&x, &r)| {
                        let (y, dy) = closed_form(activation, x as f64);
                        (y as f32, (dy * r as f64) as f32)
                    })
                    .unzip();
                let what = format!("{activation:?} of {n} values in {dtype:?}");
                let (y, grad) = value_and_gradient(public(activation), &x, &r);
                assert_close(&y, &want_y, tolerance, &format!("{what}: values"));
                assert_close(&grad, &want_grad, tolerance, &format!("{what}: gradients"));
            }
        }
    }

    #[test]
    fn an_empty_input_gives_an_empty_value_and_gradient() {
        let x = Array::from_slice::<f32>(&[], &[0, 3]);
        for activation in ALL {
            let f = public(activation);
            let objective = move |args: &[Array]| -> std::result::Result<Vec<Array>, Exception> {
                Ok(vec![f(&args[0])
                    .map_err(Error::into_exception)?
                    .sum(false)?])
            };
            let y = f(&x).unwrap();
            let (_, grads) =
                value_and_grad_with_argnums(objective, &[0])(std::slice::from_ref(&x)).unwrap();
            mlx_rs::transforms::eval([&y, &grads[0]]).unwrap();
            assert_eq!(y.shape(), [0, 3], "{activation:?}");
            assert_eq!(grads[0].shape(), [0, 3], "{activation:?}");
        }
    }

    #[test]
    fn the_gradient_is_the_same_compiled_and_the_values_without_gradients() {
        for activation in ALL {
            let f = public(activation);
            let grads_of = move |args: &[Array]| -> std::result::Result<Vec<Array>, Exception> {
                let objective = |args: &[Array]| -> std::result::Result<Vec<Array>, Exception> {
                    Ok(vec![f(&args[0])
                        .map_err(Error::into_exception)?
                        .sum(false)?])
                };
                let (_, grads) = value_and_grad_with_argnums(objective, &[0])(args)?;
                Ok(grads)
            };
            let eager = grads_of(&[values()]).unwrap();
            let compiled = compile(grads_of, false)(&[values()]).unwrap();
            assert_close(
                compiled[0].as_slice::<f32>(),
                eager[0].as_slice::<f32>(),
                1e-6,
                &format!("{activation:?}: compiled gradient"),
            );
            let with = f(&values()).unwrap();
            // Without gradients MLX's operations run on CUDA too: equal within float32's rounding.
            let without = without_gradients(|| f(&values()).unwrap());
            assert_close(
                without.as_slice::<f32>(),
                with.as_slice::<f32>(),
                tolerance(Dtype::Float32),
                &format!("{activation:?}: without gradients"),
            );
        }
    }
}
