//! A linear layer of an activated input, `layer(f(x))` (GPT-2's MLP), or of a gated MLP's
//! product, `layer(f(gate) * up)` (LLaMA's SiLU, Gemma's GELU), and a linear layer whose output
//! is added to a residual stream, `x + layer(..)` (a pre-norm block's last projection): in
//! decoding, one launch of lmx's matrix-vector kernel that activates its input as it reads it
//! and adds the residual as it writes, so that neither the activation nor the sum is a kernel of
//! its own; everywhere else the activation, the layer and the sum, as written.

use super::decode_product::decode_product_of;
use super::{dropout, linear_in, swiglu, Activation, LinearParams};
use crate::error::Result;
use crate::model::Context;
use mlx_rs::Array;

/// What a linear layer multiplies: its input as it is, `f(x)`, or a gated MLP's `f(gate) * up`.
#[derive(Clone, Copy, Debug)]
pub enum LayerInput<'a> {
    Plain(&'a Array),
    Activated(Activation, &'a Array),
    Gated(Activation, &'a Array, &'a Array),
}

/// What a block's last linear layer adds its output to: the residual stream `x`, the output
/// first through dropout of probability `dropout` (on in a training step: GPT-2's
/// `x + dropout(attn(..), pdrop)`).
#[derive(Clone, Copy, Debug)]
pub struct Residual<'a> {
    pub x: &'a Array,
    pub dropout: f32,
}

impl<'a> Residual<'a> {
    /// `x`, the layer's output through dropout of probability `dropout` first.
    pub fn new(x: &'a Array, dropout: f32) -> Self {
        Residual { x, dropout }
    }
}

/// `residual.x + dropout(layer(input))`, or `layer(input)` without a residual, as [`linear_in`]
/// over the input computes the layer (an activated input through [`Activation::of`], a
/// SiLU-gated one through [`swiglu`]; an adapter's dropout on in a training step), then
/// [`dropout`], then MLX's sum; in decoding (no gradient taken, a CUDA GPU, a few rows, a plain
/// layer, no dropout drawn) through one launch, each value of an activated input computed in
/// float32 and rounded once to `x`'s dtype, as lmx's activation kernels compute it in training
/// (MLX's operations, which [`Activation::of`] takes in decoding, round after each step: within
/// that dtype's rounding).
pub fn linear_plus_in(
    params: &LinearParams,
    input: LayerInput<'_>,
    residual: Option<Residual<'_>>,
    ctx: &mut Context,
) -> Result<Array> {
    let drawn = residual.is_some_and(|r| r.dropout != 0.0 && ctx.draws());
    if !drawn {
        if let Some(y) = decode_product_of(params, input, residual.map(|r| r.x))? {
            return Ok(y);
        }
    }
    let y = match input {
        LayerInput::Plain(x) => linear_in(params, x, ctx)?,
        LayerInput::Activated(activation, x) => linear_in(params, &activation.of(x)?, ctx)?,
        LayerInput::Gated(activation, gate, up) => {
            let product = match activation {
                Activation::Silu => swiglu(gate, up)?,
                other => other.of(gate)?.multiply(up)?,
            };
            linear_in(params, &product, ctx)?
        }
    };
    Ok(match residual {
        Some(residual) => residual.x.add(&dropout(&y, residual.dropout, ctx)?)?,
        None => y,
    })
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

    /// Each form of input (as it is, activated, gated) with and without a residual is the
    /// layer of the activated input or of the gated product, plus the residual: the same arrays
    /// as the separate steps where a gradient may be taken (and on the CPU, where no kernel
    /// runs), and within bfloat16's rounding of them in decoding on CUDA, for a layer with a bias
    /// and one without, for each activation.
    #[test]
    fn the_layer_of_the_activated_input() {
        let (x, up, residual) = (
            normal(&[1, 1, 64]),
            normal(&[1, 1, 64]),
            normal(&[1, 1, 16]),
        );
        let tolerance = if cuda::available() { 0.02 } else { 0.0 };
        let activations = [Activation::Gelu, Activation::GeluTanh, Activation::Silu];
        for bias in [None, Some(normal(&[16]))] {
            let layer = LinearParams::new(normal(&[16, 64]), bias);
            let mut ctx = Context::evaluation();
            let inputs = std::iter::once(LayerInput::Plain(&x)).chain(
                activations
                    .into_iter()
                    .flat_map(|a| [LayerInput::Activated(a, &x), LayerInput::Gated(a, &x, &up)]),
            );
            for input in inputs {
                for residual in [None, Some(&residual)] {
                    // The separate steps: the activated input (or gated product), the layer,
                    // the sum.
                    let want = || {
                        let product = match input {
                            LayerInput::Plain(x) => x.clone(),
                            LayerInput::Activated(activation, x) => activation.of(x)?,
                            LayerInput::Gated(Activation::Silu, gate, up) => swiglu(gate, up)?,
                            LayerInput::Gated(other, gate, up) => other.of(gate)?.multiply(up)?,
                        };
                        let y = linear(&layer, &product)?;
                        Ok::<_, crate::Error>(match residual {
                            Some(residual) => residual.add(&y)?,
                            None => y,
                        })
                    };
                    let got = |ctx: &mut Context| {
                        let residual = residual.map(|x| Residual::new(x, 0.0));
                        linear_plus_in(&layer, input, residual, ctx)
                    };
                    let case = format!("{input:?} residual {}", residual.is_some());
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

    /// A residual's dropout is drawn from the pass's key as `residual + dropout(layer(x), p)`
    /// draws it (the same mask from the same key), and is off where the pass has no key.
    #[test]
    fn a_residuals_dropout_is_the_sums() {
        let (x, residual) = (normal(&[2, 3, 64]), normal(&[2, 3, 16]));
        let layer = LinearParams::new(normal(&[16, 64]), Some(normal(&[16])));
        let key = mlx_rs::random::key(7).unwrap();
        let input = LayerInput::Plain(&x);
        let plus = Some(Residual::new(&residual, 0.5));
        let got = linear_plus_in(&layer, input, plus, &mut Context::training(&key)).unwrap();
        let mut ctx = Context::training(&key);
        let y = linear_in(&layer, &x, &mut ctx).unwrap();
        let want = residual.add(dropout(&y, 0.5, &mut ctx).unwrap()).unwrap();
        assert_eq!(largest_difference(&got, &want), 0.0);
        let undropped = residual.add(&y).unwrap();
        assert!(largest_difference(&got, &undropped) > 0.0);
        let off = linear_plus_in(&layer, input, plus, &mut Context::evaluation()).unwrap();
        assert_eq!(largest_difference(&off, &undropped), 0.0);
    }
}
