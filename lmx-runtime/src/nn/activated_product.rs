//! A linear layer of an activated input, `layer(f(x))` (GPT-2's MLP), or of a gated MLP's
//! product, `layer(f(gate) * up)` (LLaMA's SiLU, Gemma's GELU): in decoding, one launch of lmx's
//! matrix-vector kernel that activates its input as it reads it, so the activation is no kernel
//! of its own; everywhere else the activation, then the layer, as written.

use super::decode_product::decode_product_of;
use super::{linear_in, swiglu, Activation, LinearParams};
use crate::error::Result;
use crate::model::Context;
use mlx_rs::Array;

/// `layer(activation(x))`, as [`linear_in`] over [`Activation::of`] computes it (an adapter's
/// dropout on in a training step); in decoding (no gradient taken, a CUDA GPU, a few rows, a
/// plain layer) through one launch, each activated value computed in float32 and rounded once
/// to `x`'s dtype, as lmx's activation kernels compute it in training (MLX's operations, which
/// [`Activation::of`] takes in decoding, round after each step: within that dtype's rounding).
pub fn activated_linear_in(
    params: &LinearParams,
    activation: Activation,
    x: &Array,
    ctx: &mut Context,
) -> Result<Array> {
    if let Some(y) = decode_product_of(params, activation, x, None)? {
        return Ok(y);
    }
    linear_in(params, &activation.of(x)?, ctx)
}

/// `layer(activation(gate) * up)` (a gated MLP's down projection), as [`linear_in`] over the
/// gated product computes it ([`swiglu`] for SiLU, else the activation, then the product); in
/// decoding through one launch, as [`activated_linear_in`].
pub fn gated_linear_in(
    params: &LinearParams,
    activation: Activation,
    gate: &Array,
    up: &Array,
    ctx: &mut Context,
) -> Result<Array> {
    if let Some(y) = decode_product_of(params, activation, gate, Some(up))? {
        return Ok(y);
    }
    let product = match activation {
        Activation::Silu => swiglu(gate, up)?,
        other => other.of(gate)?.multiply(up)?,
    };
    linear_in(params, &product, ctx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda;
    use crate::nn::{linear, without_gradients};
    use mlx_rs::Dtype;

    fn normal(shape: &[i32]) -> Array {
        mlx_rs::random::normal::<f32>(shape, None, None, None)
            .unwrap()
            .as_dtype(Dtype::Bfloat16)
            .unwrap()
    }

    /// The largest difference of `a` from `b`, relative to `b`'s largest magnitude (at least 1).
    fn largest_difference(a: &Array, b: &Array) -> f32 {
        let f32 = |x: &Array| x.as_dtype(Dtype::Float32).unwrap();
        let largest = |x: Array| x.abs().unwrap().max(None).unwrap().item_cast::<f32>();
        largest(f32(a).subtract(f32(b)).unwrap()) / largest(f32(b)).max(1.0)
    }

    /// Both calls are the layer of the activated input or of the gated product, for each
    /// activation: the same arrays where a gradient may be taken (and on the CPU, where no kernel
    /// runs), and within bfloat16's rounding of them in decoding on CUDA, for a layer with a bias
    /// and one without.
    #[test]
    fn the_layer_of_the_activated_input() {
        let (x, up) = (normal(&[1, 1, 64]), normal(&[1, 1, 64]));
        let tolerance = if cuda::available() { 0.02 } else { 0.0 };
        for bias in [None, Some(normal(&[16]))] {
            let layer = LinearParams::new(normal(&[16, 64]), bias);
            let mut ctx = Context::evaluation();
            for activation in [Activation::Gelu, Activation::GeluTanh, Activation::Silu] {
                for up in [None, Some(&up)] {
                    // The two steps: the activated input (or gated product), then the layer.
                    let want = || {
                        let input = match (up, activation) {
                            (None, _) => activation.of(&x)?,
                            (Some(up), Activation::Silu) => swiglu(&x, up)?,
                            (Some(up), other) => other.of(&x)?.multiply(up)?,
                        };
                        linear(&layer, &input)
                    };
                    let got = |ctx: &mut Context| match up {
                        None => activated_linear_in(&layer, activation, &x, ctx),
                        Some(up) => gated_linear_in(&layer, activation, &x, up, ctx),
                    };
                    let case = format!("{activation:?} gated {}", up.is_some());
                    let (want_now, got_now) = (want().unwrap(), got(&mut ctx).unwrap());
                    assert_eq!(largest_difference(&got_now, &want_now), 0.0, "{case}");
                    let (want, got) =
                        without_gradients(|| Ok::<_, crate::Error>((want()?, got(&mut ctx)?)))
                            .unwrap();
                    assert!(largest_difference(&got, &want) <= tolerance, "{case}");
                }
            }
        }
    }
}
