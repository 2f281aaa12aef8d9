//! Elementwise activations with their derivatives written out.
//!
//! Each activation is a custom function (`custom_vjp`) whose forward pass and whose
//! vector-Jacobian product each compute in float32 and round once to the input's precision, and
//! whose backward pass reads only `x` and the cotangent. On MLX's CUDA backend each pass is one of
//! lmx's kernels (`cuda`), one read and one write of the activations; elsewhere each is a
//! shapeless compiled function of MLX's operations. MLX's own gradient of
//! `x (1 + erf(x / sqrt 2)) / 2` keeps `1 + erf(x / sqrt 2)` from the forward pass, and its
//! compiled passes come out as two kernels each: on GPT-2 124M, four passes over every block's
//! 16,384 x 3,072 activations where two do (docs/benchmarks.md).

use super::custom_vjp::{self, WithGradient};
use crate::cuda;
use crate::error::{Error, Result};
use mlx_rs::error::Exception;
use mlx_rs::transforms::compile::compile;
use mlx_rs::{ops, Array, Dtype};
use std::cell::RefCell;

/// An elementwise activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Activation {
    /// `x (1 + erf(x / sqrt 2)) / 2`.
    Gelu,
    /// `x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) / 2`.
    GeluTanh,
    /// `x sigmoid(x)`.
    Silu,
}

/// `sqrt(2 / pi)`.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// `1 / sqrt(2 pi)`.
const INV_SQRT_2PI: f32 = 0.398_942_3;

/// GELU's tanh approximation's cubic coefficient.
const CUBIC: f32 = 0.044715;

fn c(value: f32) -> Array {
    Array::from_f32(value)
}

impl Activation {
    /// The same function in lmx's CUDA kernels.
    fn kernel(self) -> cuda::Function {
        match self {
            Activation::Gelu => cuda::Function::Gelu,
            Activation::GeluTanh => cuda::Function::GeluTanh,
            Activation::Silu => cuda::Function::Silu,
        }
    }

    /// The activation of float32 `x`.
    fn value(self, x: &Array) -> Result<Array> {
        Ok(match self {
            Activation::Gelu => {
                let erf = ops::erf(x.multiply(c(std::f32::consts::FRAC_1_SQRT_2))?)?;
                x.multiply(erf.add(c(1.0))?)?.multiply(c(0.5))?
            }
            Activation::GeluTanh => {
                let gate = ops::tanh(tanh_argument(x)?)?.add(c(1.0))?;
                x.multiply(gate)?.multiply(c(0.5))?
            }
            Activation::Silu => x.multiply(ops::sigmoid(x)?)?,
        })
    }

    /// The derivative at float32 `x`.
    fn derivative(self, x: &Array) -> Result<Array> {
        Ok(match self {
            // (1 + erf(x / sqrt 2)) / 2 + x exp(-x^2 / 2) / sqrt(2 pi)
            Activation::Gelu => {
                let cdf = ops::erf(x.multiply(c(std::f32::consts::FRAC_1_SQRT_2))?)?
                    .add(c(1.0))?
                    .multiply(c(0.5))?;
                let pdf = ops::exp(x.square()?.multiply(c(-0.5))?)?.multiply(c(INV_SQRT_2PI))?;
                cdf.add(x.multiply(pdf)?)?
            }
            // (1 + t) / 2 + x (1 - t^2) sqrt(2 / pi) (1 + 3 0.044715 x^2) / 2, t = tanh(...)
            Activation::GeluTanh => {
                let t = ops::tanh(tanh_argument(x)?)?;
                let slope = x
                    .square()?
                    .multiply(c(3.0 * CUBIC))?
                    .add(c(1.0))?
                    .multiply(c(SQRT_2_OVER_PI))?;
                let inner = c(1.0).subtract(t.square()?)?.multiply(slope)?.multiply(x)?;
                t.add(c(1.0))?.add(inner)?.multiply(c(0.5))?
            }
            // s (1 + x (1 - s)), s = sigmoid(x)
            Activation::Silu => {
                let s = ops::sigmoid(x)?;
                s.multiply(x.multiply(c(1.0).subtract(&s)?)?.add(c(1.0))?)?
            }
        })
    }
}

/// `sqrt(2 / pi) (x + 0.044715 x^3)`.
fn tanh_argument(x: &Array) -> Result<Array> {
    Ok(x.add(x.power(c(3.0))?.multiply(c(CUBIC))?)?
        .multiply(c(SQRT_2_OVER_PI))?)
}

/// Which of an activation's two functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pass {
    /// `[x] -> [f(x)]`.
    Forward,
    /// `[x, dy] -> [dy f'(x)]`.
    Backward,
}

type Compiled = Box<dyn FnMut(&[Array]) -> std::result::Result<Vec<Array>, Exception>>;

thread_local! {
    /// Each activation's passes, compiled (shapeless) on first use on this thread.
    static COMPILED: RefCell<Vec<((Activation, Pass), Compiled)>> = const { RefCell::new(Vec::new()) };
}

/// One pass of `activation` over `inputs`: lmx's kernel on CUDA, elsewhere its compiled
/// function.
fn run(activation: Activation, pass: Pass, inputs: &[Array]) -> Result<Array> {
    if cuda::available() && cuda::activation_fits(&inputs[0]) {
        let function = activation.kernel();
        return match pass {
            Pass::Forward => cuda::activation(function, &inputs[0]),
            Pass::Backward => cuda::activation_backward(function, &inputs[0], &inputs[1]),
        };
    }
    COMPILED.with(|cell| {
        let mut compiled = cell.borrow_mut();
        let index = match compiled
            .iter()
            .position(|(key, _)| *key == (activation, pass))
        {
            Some(index) => index,
            None => {
                let body = move |inputs: &[Array]| -> Result<Vec<Array>> {
                    let dtype = inputs[0].dtype();
                    let x = inputs[0].as_dtype(Dtype::Float32)?;
                    let y = match pass {
                        Pass::Forward => activation.value(&x)?,
                        Pass::Backward => inputs[1]
                            .as_dtype(Dtype::Float32)?
                            .multiply(activation.derivative(&x)?)?,
                    };
                    Ok(vec![y.as_dtype(dtype)?])
                };
                let pure = move |inputs: &[Array]| body(inputs).map_err(Error::into_exception);
                compiled.push(((activation, pass), Box::new(compile(pure, true))));
                compiled.len() - 1
            }
        };
        let mut outputs = (compiled[index].1)(inputs)?;
        Ok(outputs.remove(0))
    })
}

impl WithGradient for Activation {
    const NAME: &'static str = "an activation";

    fn forward(&self, inputs: &[Array]) -> Result<Vec<Array>> {
        Ok(vec![run(*self, Pass::Forward, inputs)?])
    }

    fn vjp(&self, primals: &[Array], cotangents: &[Array]) -> Result<Vec<Array>> {
        let (Some(x), Some(dy)) = (primals.first(), cotangents.first()) else {
            return Err(Error::Layout(
                "an activation's gradient needs its input and one cotangent".into(),
            ));
        };
        Ok(vec![run(*self, Pass::Backward, &[x.clone(), dy.clone()])?])
    }
}

fn apply(activation: Activation, x: &Array) -> Result<Array> {
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
    use mlx_rs::transforms::{compile::compile, value_and_grad_with_argnums};

    const ALL: [Activation; 3] = [Activation::Gelu, Activation::GeluTanh, Activation::Silu];

    fn values() -> Array {
        Array::from_slice(&[-3.0f32, -1.0, -0.25, 0.0, 0.5, 2.0], &[2, 3])
    }

    fn public(activation: Activation) -> fn(&Array) -> Result<Array> {
        match activation {
            Activation::Gelu => gelu,
            Activation::GeluTanh => gelu_tanh,
            Activation::Silu => silu,
        }
    }

    /// `sum(f(x) * r)` and its gradient in `x`, with `f` either the activation or its formula
    /// differentiated by MLX itself (the independent reference), in float32.
    fn value_and_gradient(f: fn(&Array) -> Result<Array>, x: &Array) -> (Vec<f32>, Vec<f32>) {
        let r = Array::from_slice(&[0.5f32, -1.0, 2.0, 1.5, -0.25, 3.0], &[2, 3]);
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
        for (g, e) in got.iter().zip(expected) {
            assert!(
                (g - e).abs() <= tolerance * e.abs().max(1.0),
                "{what}: {got:?} against {expected:?}"
            );
        }
    }

    #[test]
    fn values_and_gradients_match_mlx_differentiating_the_formulas() {
        for activation in ALL {
            let formula: fn(&Array) -> Result<Array> = match activation {
                Activation::Gelu => |x| Activation::Gelu.value(x),
                Activation::GeluTanh => |x| Activation::GeluTanh.value(x),
                Activation::Silu => |x| Activation::Silu.value(x),
            };
            let (want_y, want_grad) = value_and_gradient(formula, &values());
            for (x, tolerance) in [
                (values(), 1e-6),
                (values().reshape(&[6]).unwrap(), 1e-6),
                // bfloat16 inputs are these values exactly; the outputs are rounded once.
                (values().as_dtype(Dtype::Bfloat16).unwrap(), 8e-3),
            ] {
                let what = format!("{activation:?} of {:?} {:?}", x.shape(), x.dtype());
                let (y, grad) = value_and_gradient(public(activation), &x);
                assert_close(&y, &want_y, tolerance, &format!("{what}: values"));
                assert_close(&grad, &want_grad, tolerance, &format!("{what}: gradients"));
            }
        }
    }

    #[test]
    fn the_gradient_is_the_same_compiled_and_without_gradients_the_values_are() {
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
            let without = without_gradients(|| f(&values()).unwrap());
            assert_close(
                without.as_slice::<f32>(),
                with.as_slice::<f32>(),
                0.0,
                &format!("{activation:?}: without gradients"),
            );
        }
    }

    #[test]
    fn gelu_matches_its_definition() {
        let x = values();
        let got: Vec<f32> = gelu(&x).unwrap().as_slice().to_vec();
        let erf = |v: f64| {
            // Abramowitz and Stegun 7.1.26, |error| < 1.5e-7.
            let t = 1.0 / (1.0 + 0.3275911 * v.abs());
            let poly = t
                * (0.254829592
                    + t * (-0.284496736
                        + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
            (1.0 - poly * (-v * v).exp()).copysign(v)
        };
        for (&v, &g) in x.as_slice::<f32>().iter().zip(&got) {
            let expected = 0.5 * v as f64 * (1.0 + erf(v as f64 / 2f64.sqrt()));
            assert!(
                (g as f64 - expected).abs() < 1e-6,
                "gelu({v}) = {g}, expected {expected}"
            );
        }
    }
}
