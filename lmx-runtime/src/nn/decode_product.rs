//! Decoding's products: a few rows times the weights of one or more linear layers over one
//! input, through lmx's matrix-vector kernel ([`crate::cuda`]'s `matvec`) where it applies, so
//! that each weight is read once at the memory's speed and attention's query, key and value
//! projections (or a gated MLP's gate and up projections) are one launch.
//!
//! It applies on a CUDA GPU, to at most a handful of rows, where no gradient is taken
//! ([`without_gradients`](super::without_gradients): generation); everywhere else the layers take
//! their usual path. The outputs are the same products, accumulated in float32.

use super::custom_vjp::gradient_free;
use super::{LayerInput, LinearParams};
use crate::cuda;
use crate::error::Result;
use mlx_rs::Array;

/// `x @ w.T (+ b)` for each of `weights` (and `biases`) through one launch of the kernel, an
/// output per weight, or `None` where it does not apply: off CUDA, where a gradient may be
/// taken, for more rows or weights than the kernel takes, or operands it does not read.
pub(super) fn decode_product(
    x: &Array,
    weights: &[&Array],
    biases: Option<&[&Array]>,
) -> Result<Option<Vec<Array>>> {
    if !gradient_free() || !cuda::matvec_fits(x, weights, biases) || !cuda::available() {
        return Ok(None);
    }
    Ok(Some(cuda::matvec(x, weights, biases)?))
}

/// Each of `layers` applied to `x`, through one [`decode_product`], or `None` where that does not
/// apply, or the layers are quantized or adapted, or some have a bias and some none.
pub(super) fn decode_products(layers: &[&LinearParams], x: &Array) -> Result<Option<Vec<Array>>> {
    if !layers.iter().all(|layer| layer.is_plain()) {
        return Ok(None);
    }
    let weights: Vec<&Array> = layers.iter().map(|layer| &layer.weight).collect();
    let biases: Option<Vec<&Array>> = layers.iter().map(|layer| layer.bias.as_ref()).collect();
    if biases.is_none() && layers.iter().any(|layer| layer.bias.is_some()) {
        return Ok(None);
    }
    decode_product(x, &weights, biases.as_deref())
}

/// `residual + layer(input)` (without `residual` where none is given) through one launch of the
/// kernel, which activates an activated or gated input as it reads it, or `None` where it does
/// not apply: off CUDA, where a gradient may be taken, for a quantized or adapted layer, or
/// operands it does not read.
pub(super) fn decode_product_of(
    layer: &LinearParams,
    input: LayerInput<'_>,
    residual: Option<&Array>,
) -> Result<Option<Array>> {
    let (x, activation, up) = match input {
        LayerInput::Plain(x) => (x, None, None),
        LayerInput::Activated(activation, x) => (x, Some(activation), None),
        LayerInput::Gated(activation, gate, up) => (gate, Some(activation), Some(up)),
    };
    let one = cuda::OneLayer {
        x,
        activation,
        up,
        weight: &layer.weight,
        bias: layer.bias.as_ref(),
        residual,
    };
    if !layer.is_plain() || !gradient_free() || !one.fits() || !cuda::available() {
        return Ok(None);
    }
    Ok(Some(one.product()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::{linear, linears_in, without_gradients};
    use mlx_rs::Dtype;

    fn layer(features: i32, bias: bool) -> LinearParams {
        let normal = |shape: &[i32]| {
            mlx_rs::random::normal::<f32>(shape, None, None, None)
                .unwrap()
                .as_dtype(Dtype::Bfloat16)
                .unwrap()
        };
        LinearParams::new(normal(&[features, 64]), bias.then(|| normal(&[features])))
    }

    /// Where no gradient is taken on CUDA, a group of layers is one launch whose outputs are each
    /// layer's product (MLX's, to bfloat16's rounding); where one may be, or off CUDA, the kernel
    /// is not taken; nor for layers of which only some have a bias.
    #[test]
    fn the_kernel_only_where_no_gradient_is_taken_on_cuda() {
        let x = mlx_rs::random::normal::<f32>(&[1, 1, 64], None, None, None)
            .unwrap()
            .as_dtype(Dtype::Bfloat16)
            .unwrap();
        for bias in [false, true] {
            let layers = [layer(32, bias), layer(8, bias), layer(8, bias)];
            let group: Vec<&LinearParams> = layers.iter().collect();
            assert!(decode_products(&group, &x).unwrap().is_none());
            let free = without_gradients(|| decode_products(&group, &x)).unwrap();
            if !cuda::available() {
                assert!(free.is_none());
                continue;
            }
            let free = free.expect("the kernel on CUDA without gradients");
            let mut ctx = crate::model::Context::evaluation();
            let through = without_gradients(|| {
                linears_in([&layers[0], &layers[1], &layers[2]], &x, &mut ctx)
            })
            .unwrap();
            for ((got, via), layer) in free.iter().zip(&through).zip(&layers) {
                let want = linear(layer, &x).unwrap().as_dtype(Dtype::Float32).unwrap();
                for got in [got, via] {
                    let err = got
                        .as_dtype(Dtype::Float32)
                        .unwrap()
                        .subtract(&want)
                        .unwrap();
                    let err = err.abs().unwrap().max(None).unwrap().item_cast::<f32>();
                    let scale = want.abs().unwrap().max(None).unwrap().item_cast::<f32>();
                    assert!(
                        err <= 0.02 * scale.max(1.0),
                        "bias {bias}: {err} of {scale}"
                    );
                }
            }
        }
        let mixed = [layer(8, true), layer(8, false)];
        let free = without_gradients(|| decode_products(&[&mixed[0], &mixed[1]], &x)).unwrap();
        assert!(free.is_none());
    }
}
