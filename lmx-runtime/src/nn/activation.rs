//! Elementwise activations, each compiled once per thread as MLX's Python activations are.
//!
//! Called eagerly (generation, an eager step), an activation runs as one fused kernel instead of
//! one kernel per operation; inside a step that is being traced, MLX inlines it like any other
//! code, so the compiled step is the same either way.

use super::scalar;
use crate::error::{Error, Result};
use mlx_rs::error::Exception;
use mlx_rs::transforms::compile::compile;
use mlx_rs::{ops, Array};
use std::cell::RefCell;
use std::thread::LocalKey;

type Compiled = Box<dyn FnMut(&Array) -> std::result::Result<Array, Exception>>;

/// Where a thread keeps one compiled activation.
type Slot = LocalKey<RefCell<Option<Compiled>>>;

thread_local! {
    static GELU: RefCell<Option<Compiled>> = const { RefCell::new(None) };
    static GELU_TANH: RefCell<Option<Compiled>> = const { RefCell::new(None) };
    static SILU: RefCell<Option<Compiled>> = const { RefCell::new(None) };
}

/// `body(x)` through the shapeless compilation kept in `slot` (made on first use).
fn fused(slot: &'static Slot, body: fn(&Array) -> Result<Array>, x: &Array) -> Result<Array> {
    slot.with(|cell| {
        let mut compiled = cell.borrow_mut();
        let run = compiled.get_or_insert_with(|| {
            let pure = move |x: &Array| body(x).map_err(Error::into_exception);
            Box::new(compile(pure, true))
        });
        run(x).map_err(Error::from)
    })
}

/// GELU with the exact error function: `x (1 + erf(x/sqrt 2)) / 2`, in the order MLX's `nn.gelu`
/// computes it, so that the backward pass keeps the same intermediates.
pub fn gelu(x: &Array) -> Result<Array> {
    fused(&GELU, gelu_ops, x)
}

fn gelu_ops(x: &Array) -> Result<Array> {
    let dtype = x.dtype();
    let erf = ops::erf(x.multiply(scalar(std::f32::consts::FRAC_1_SQRT_2, dtype)?)?)?;
    Ok(x.multiply(erf.add(scalar(1.0, dtype)?)?)?
        .multiply(scalar(0.5, dtype)?)?)
}

/// GELU's tanh approximation, as GPT-2 trained with it (`gelu_new`).
pub fn gelu_tanh(x: &Array) -> Result<Array> {
    fused(&GELU_TANH, gelu_tanh_ops, x)
}

fn gelu_tanh_ops(x: &Array) -> Result<Array> {
    let dtype = x.dtype();
    let inner = x
        .add(
            x.power(scalar(3.0, dtype)?)?
                .multiply(scalar(0.044715, dtype)?)?,
        )?
        .multiply(scalar((2.0 / std::f32::consts::PI).sqrt(), dtype)?)?;
    let gate = ops::tanh(inner)?.add(scalar(1.0, dtype)?)?;
    Ok(x.multiply(gate)?.multiply(scalar(0.5, dtype)?)?)
}

/// SiLU (swish): `x sigmoid(x)`.
pub fn silu(x: &Array) -> Result<Array> {
    fused(&SILU, silu_ops, x)
}

fn silu_ops(x: &Array) -> Result<Array> {
    Ok(x.multiply(ops::sigmoid(x)?)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::Dtype;

    fn values() -> Array {
        Array::from_slice(&[-3.0f32, -1.0, -0.25, 0.0, 0.5, 2.0], &[2, 3])
    }

    #[test]
    fn fused_activations_agree_with_their_operations_at_every_shape_and_precision() {
        type Pair = (fn(&Array) -> Result<Array>, fn(&Array) -> Result<Array>);
        let pairs: [Pair; 3] = [
            (gelu, gelu_ops),
            (gelu_tanh, gelu_tanh_ops),
            (silu, silu_ops),
        ];
        for (fused, ops) in pairs {
            for x in [
                values(),
                values().reshape(&[6]).unwrap(),
                values().as_dtype(Dtype::Bfloat16).unwrap(),
            ] {
                let (a, b) = (fused(&x).unwrap(), ops(&x).unwrap());
                assert_eq!((a.shape(), a.dtype()), (b.shape(), b.dtype()));
                let (a, b) = (
                    a.as_dtype(Dtype::Float32).unwrap(),
                    b.as_dtype(Dtype::Float32).unwrap(),
                );
                let tolerance = if x.dtype() == Dtype::Bfloat16 {
                    1e-2
                } else {
                    1e-6
                };
                for (p, q) in a.as_slice::<f32>().iter().zip(b.as_slice::<f32>()) {
                    assert!(
                        (p - q).abs() <= tolerance * q.abs().max(1.0),
                        "{p} against {q}"
                    );
                }
            }
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
