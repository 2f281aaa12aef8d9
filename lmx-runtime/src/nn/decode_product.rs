//! Decoding's products: a few rows times the weights of one or more linear layers over one
//! input, through lmx's matrix-vector kernel ([`crate::cuda`]'s `matvec`) where it applies, so
//! that each weight is read once at the memory's speed and attention's query, key and value
//! projections (or a gated MLP's gate and up projections) are one launch.
//!
//! It applies on a CUDA GPU, to at most a handful of rows, where no gradient is taken
//! ([`without_gradients`](super::without_gradients): generation); everywhere else the layers take
//! their usual path. The outputs are the same products, accumulated in float32.

use super::custom_vjp::gradient_free;
use super::{deferred, LayerInput, LinearParams};
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
    let outputs = decode_product(x, &weights, biases.as_deref())?;
    if let (Some(outputs), None) = (&outputs, &biases) {
        deferred::remember_products(outputs, x, &weights);
    }
    Ok(outputs)
}

/// `residual + layer(input)` (without `residual` where none is given) through one launch of the
/// kernel, which activates an activated or gated input as it reads it, or `None` where it does
/// not apply: off CUDA, where a gradient may be taken, for a quantized or adapted layer, or
/// operands it does not read. Where the input is gated and its gate and up are one product
/// group's outputs over a one-row RMS norm ([`deferred::normed_gated`]), the norm, the group and
/// this layer are one launch of [`cuda::GatedMlp`] instead.
pub(super) fn decode_product_of(
    layer: &LinearParams,
    input: LayerInput<'_>,
    residual: Option<&Array>,
) -> Result<Option<Array>> {
    if let (LayerInput::Gated(activation, gate, up), Some(residual)) = (input, residual) {
        if let Some(y) = gated_mlp(layer, activation, (gate, up), residual)? {
            return Ok(Some(y));
        }
    }
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

/// `residual + layer(f(gate) * up)` as one [`cuda::GatedMlp`] launch from the norm's input, where
/// [`deferred::normed_gated`] finds how `gate` and `up` were made and the kernel takes them.
fn gated_mlp(
    layer: &LinearParams,
    activation: super::Activation,
    (gate, up): (&Array, &Array),
    residual: &Array,
) -> Result<Option<Array>> {
    if !layer.is_plain() || layer.bias.is_some() || !gradient_free() {
        return Ok(None);
    }
    let Some(found) = deferred::normed_gated(gate, up) else {
        return Ok(None);
    };
    let mlp = cuda::GatedMlp {
        x: &found.input,
        norm: &found.norm,
        eps: found.eps,
        activation,
        gate: &found.gate,
        up: &found.up,
        down: &layer.weight,
        residual,
    };
    if !mlp.fits() {
        return Ok(None);
    }
    Ok(Some(mlp.apply()?))
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

    /// A pre-norm gated MLP written as its steps (the norm, the gate and up products as one
    /// group, the down product of the SiLU-gated input plus the residual) is, where no gradient is
    /// taken on CUDA, one launch of the fused kernel (its chain found), equal within the dtype's
    /// rounding to MLX's separate operations in float32 (and on the CPU, where no kernel runs,
    /// to the same steps); a gate and up over two norms' outputs, or over an input no norm made,
    /// are not fused.
    #[test]
    fn a_normed_gated_mlp_is_one_launch() {
        use crate::nn::{linear_plus_in, rms_norm, Activation, Residual, RmsNormParams};
        use crate::test_arrays::normal;
        let cuda = cuda::available();
        for (dtype, d, f, tolerance) in [
            (Dtype::Bfloat16, 64, 256, 0.02),
            (Dtype::Bfloat16, 2048, 5632, 0.02),
            (Dtype::Float32, 128, 352, 1e-4),
        ] {
            let scaled = |shape: &[i32], fan_in: i32| {
                normal(shape, Dtype::Float32)
                    .multiply(Array::from_f32((fan_in as f32).powf(-0.5)))
                    .unwrap()
                    .as_dtype(dtype)
                    .unwrap()
            };
            let x = normal(&[1, 1, d], dtype);
            let norm = RmsNormParams {
                weight: normal(&[d], Dtype::Float32)
                    .multiply(Array::from_f32(0.1))
                    .unwrap()
                    .add(Array::from_f32(1.0))
                    .unwrap()
                    .as_dtype(dtype)
                    .unwrap(),
            };
            let gate = LinearParams::new(scaled(&[f, d], d), None);
            let up = LinearParams::new(scaled(&[f, d], d), None);
            let down = LinearParams::new(scaled(&[d, f], f), None);
            let eps = 1e-5;
            let mut ctx = crate::model::Context::evaluation();
            let fused = without_gradients(|| -> Result<(Array, bool)> {
                let n = rms_norm(&norm, &x, eps)?;
                let [g, u] = linears_in([&gate, &up], &n, &mut ctx)?;
                let found = deferred::normed_gated(&g, &u).is_some();
                let input = LayerInput::Gated(Activation::Silu, &g, &u);
                let y = linear_plus_in(&down, input, Some(Residual::new(&x, 0.0)), &mut ctx)?;
                Ok((y, found))
            })
            .unwrap();
            assert_eq!(
                fused.1, cuda,
                "{dtype:?} {d} x {f}: the chain found only on CUDA"
            );
            // MLX's operations in float32 on the same (rounded) values.
            let f32 = |a: &Array| a.as_dtype(Dtype::Float32).unwrap();
            let n = mlx_rs::fast::rms_norm(f32(&x), Some(&f32(&norm.weight)), eps).unwrap();
            let g = n.matmul(f32(&gate.weight).t()).unwrap();
            let u = n.matmul(f32(&up.weight).t()).unwrap();
            let h = mlx_rs::nn::silu(&g).unwrap().multiply(&u).unwrap();
            let want = f32(&x)
                .add(h.matmul(f32(&down.weight).t()).unwrap())
                .unwrap();
            let err = f32(&fused.0).subtract(&want).unwrap().abs().unwrap();
            let err = err.max(None).unwrap().item_cast::<f32>();
            let scale = want.abs().unwrap().max(None).unwrap().item_cast::<f32>();
            assert!(
                err <= tolerance * scale.max(1.0),
                "{dtype:?} {d} x {f}: {err} of {scale}"
            );
            assert_eq!(fused.0.shape(), x.shape());

            // Gate and up over two norms' outputs, or over an input no norm made: not fused.
            let other = normal(&[1, 1, d], dtype);
            let unfused = without_gradients(|| -> Result<[bool; 2]> {
                let n = rms_norm(&norm, &x, eps)?;
                let m = rms_norm(&norm, &other, eps)?;
                let [g, _] = linears_in([&gate, &up], &n, &mut ctx)?;
                let [_, u] = linears_in([&gate, &up], &m, &mut ctx)?;
                let [gx, ux] = linears_in([&gate, &up], &x, &mut ctx)?;
                Ok([
                    deferred::normed_gated(&g, &u).is_some(),
                    deferred::normed_gated(&gx, &ux).is_some(),
                ])
            })
            .unwrap();
            assert_eq!(unfused, [false, false], "{dtype:?} {d} x {f}");
        }
    }
}
