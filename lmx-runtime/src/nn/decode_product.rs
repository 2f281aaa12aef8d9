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
use crate::cuda::{self, HeldWeight, Weight};
use crate::error::Result;
use mlx_rs::Array;

/// `x @ w.T (+ b)` for each of `weights` (and `biases`) through one launch of the kernel, an
/// output per weight, or `None` where it does not apply: off CUDA, where a gradient may be
/// taken, for more rows or weights than the kernel takes, or operands it does not read. Where
/// `x` is a remembered one-row norm's output ([`deferred::normed`]), the launch normalises the
/// norm's input itself, and the norm is not computed (unless something else reads it). The
/// outputs are remembered for an MLP block's kernel ([`deferred::remember_products`]).
pub(super) fn decode_product(
    x: &Array,
    weights: &[Weight],
    biases: Option<&[&Array]>,
) -> Result<Option<Vec<Array>>> {
    if !gradient_free() || !cuda::matvec_fits(x, weights, biases) || !cuda::available() {
        return Ok(None);
    }
    let normed = deferred::normed(x)
        .filter(|(input, norm)| cuda::normed_matvec_fits(input, norm, weights, biases));
    let outputs = match normed {
        Some((input, norm)) => cuda::normed_matvec(&input, &norm, weights, biases)?,
        None => cuda::matvec(x, weights, biases)?,
    };
    deferred::remember_products(&outputs, x, weights, biases);
    Ok(Some(outputs))
}

/// The weight of a layer's base product as the kernels read it: its values, or its packed ones.
pub(super) fn base_weight(layer: &LinearParams) -> Weight<'_> {
    match layer.packed() {
        Some(packed) => packed.weight_rows(),
        None => Weight::Dense(&layer.weight),
    }
}

/// The weight of a layer that is its product alone (not adapted: LoRA or DoRA), as the kernels
/// read it.
fn unadapted_weight(layer: &LinearParams) -> Option<Weight<'_>> {
    (layer.lora_a.is_none() && layer.m.is_none()).then(|| base_weight(layer))
}

/// Each of `layers` applied to `x`, through one [`decode_product`], or `None` where that does not
/// apply, or some layers are adapted, or have another form of weight than the rest, or some have
/// a bias and some none.
pub(super) fn decode_products(layers: &[&LinearParams], x: &Array) -> Result<Option<Vec<Array>>> {
    let Some(weights) = layers
        .iter()
        .map(|layer| unadapted_weight(layer))
        .collect::<Option<Vec<_>>>()
    else {
        return Ok(None);
    };
    let biases: Option<Vec<&Array>> = layers.iter().map(|layer| layer.bias.as_ref()).collect();
    if biases.is_none() && layers.iter().any(|layer| layer.bias.is_some()) {
        return Ok(None);
    }
    decode_product(x, &weights, biases.as_deref())
}

/// `residual + layer(input)` (without `residual` where none is given) through one launch of the
/// kernel, which activates an activated or gated input as it reads it, or `None` where it does
/// not apply: off CUDA, where a gradient may be taken, for an adapted layer, or operands it does
/// not read. Where the layer is an MLP's down projection over a remembered norm's output
/// ([`mlp_block`]), the norm, the MLP's first products and this layer are one launch of
/// [`cuda::MlpBlock`] instead (with the projection that made the norm's input, where there is
/// one); a projection with a residual is remembered for it ([`deferred::remember_projected`]).
pub(super) fn decode_product_of(
    layer: &LinearParams,
    input: LayerInput<'_>,
    residual: Option<&Array>,
) -> Result<Option<Array>> {
    let Some(weight) = unadapted_weight(layer) else {
        return Ok(None);
    };
    if let Some(residual) = residual {
        if let Some(y) = mlp_block(layer, weight, input, residual)? {
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
        weight,
        bias: layer.bias.as_ref(),
        residual,
    };
    if !gradient_free() || !one.fits() || !cuda::available() {
        return Ok(None);
    }
    let y = one.product()?;
    if let (LayerInput::Plain(x), Some(residual)) = (input, residual) {
        deferred::remember_projected(&y, x, (weight, layer.bias.as_ref()), residual);
    }
    Ok(Some(y))
}

/// `residual + layer(mlp(norm(h)))` as one [`cuda::MlpBlock`] launch from the norm's input `h`,
/// where [`BlockChain::of`] finds how the input was made and the kernel takes it: led by the
/// projection that made `h` where there is one, else from `h`.
fn mlp_block(
    layer: &LinearParams,
    down: Weight<'_>,
    input: LayerInput<'_>,
    residual: &Array,
) -> Result<Option<Array>> {
    if !gradient_free() {
        return Ok(None);
    }
    let Some(chain) = BlockChain::of(input, residual) else {
        return Ok(None);
    };
    for led in [true, false] {
        if let Some(block) = chain.block(layer, down, residual, led) {
            if block.fits() {
                return Ok(Some(block.apply()?));
            }
        }
    }
    Ok(None)
}

/// How an MLP's down projection's input was made, where one block kernel may compute it all:
/// `f(gate(n)) * up(n)` ([`deferred::normed_gated`]) or `f(fc(n) + b)`
/// ([`deferred::normed_product`]) of `n = norm(h)`, and `h` a projection's sum
/// ([`deferred::projected`]) where the down projection adds to `h` itself.
struct BlockChain {
    activation: super::Activation,
    h: Array,
    norm: cuda::RowNorm,
    first: FirstLayers,
    projection: Option<deferred::Projection>,
}

/// The MLP's first layers as remembered, held for [`cuda::FirstProducts`].
enum FirstLayers {
    Gated { gate: HeldWeight, up: HeldWeight },
    Plain { fc: HeldWeight, bias: Option<Array> },
}

impl BlockChain {
    /// The chain that made the down projection's `input`, whose output is added to `residual`.
    fn of(input: LayerInput<'_>, residual: &Array) -> Option<BlockChain> {
        let (activation, h, norm, first) = match input {
            LayerInput::Gated(activation, gate, up) => {
                let found = deferred::normed_gated(gate, up)?;
                let first = FirstLayers::Gated {
                    gate: found.gate,
                    up: found.up,
                };
                (activation, found.input, found.norm, first)
            }
            LayerInput::Activated(activation, x) => {
                let found = deferred::normed_product(x)?;
                let first = FirstLayers::Plain {
                    fc: found.weight,
                    bias: found.bias,
                };
                (activation, found.input, found.norm, first)
            }
            LayerInput::Plain(_) => return None,
        };
        let projection = deferred::projected(&h).filter(|_| deferred::same_array(&h, residual));
        Some(BlockChain {
            activation,
            h,
            norm,
            first,
            projection,
        })
    }

    /// The block computing it with `layer` (of the weight `down`) as its down projection: `led`,
    /// from the projection's input (none where no projection made `h`); else from `h`, the
    /// down projection's output added to `residual`.
    fn block<'a>(
        &'a self,
        layer: &'a LinearParams,
        down: Weight<'a>,
        residual: &'a Array,
        led: bool,
    ) -> Option<cuda::MlpBlock<'a>> {
        let input = match (&self.projection, led) {
            (Some(p), true) => cuda::BlockInput::Projected {
                x: &p.x,
                weight: p.weight.weight(),
                bias: p.bias.as_ref(),
                residual: &p.residual,
            },
            (None, true) => return None,
            (_, false) => cuda::BlockInput::Row {
                x: &self.h,
                residual,
            },
        };
        let first = match &self.first {
            FirstLayers::Gated { gate, up } => cuda::FirstProducts::Gated {
                gate: gate.weight(),
                up: up.weight(),
            },
            FirstLayers::Plain { fc, bias } => cuda::FirstProducts::Plain {
                fc: fc.weight(),
                bias: bias.as_ref(),
            },
        };
        Some(cuda::MlpBlock {
            input,
            norm: &self.norm,
            activation: self.activation,
            first,
            down,
            down_bias: layer.bias.as_ref(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::{linear, linears_in, without_gradients};
    use mlx_rs::Dtype;

    /// A norm layer's function of its input.
    type NormFn<'a> = Box<dyn Fn(&Array) -> Result<Array> + 'a>;

    /// A layer of the weight `w` and the bias `bias`, its weight packed as `packing` says.
    fn packed_as(
        w: Array,
        bias: Option<Array>,
        packing: Option<crate::nn::Quantization>,
    ) -> LinearParams {
        let Some(q) = packing else {
            return LinearParams::new(w, bias);
        };
        let (packed, scales, biases) = mlx_rs::ops::quantize(&w, q.group_size, q.bits).unwrap();
        LinearParams {
            scales: Some(scales),
            biases: Some(biases),
            quantization: Some(q),
            ..LinearParams::new(packed, bias)
        }
    }

    /// The layer's weight in float32 (a packed one as MLX dequantizes it).
    fn dense_f32(layer: &LinearParams) -> Array {
        let f32 = |a: &Array| a.as_dtype(Dtype::Float32).unwrap();
        match layer.packed() {
            Some(p) => {
                let q = p.quantization;
                let (s, b) = (f32(p.scales), f32(p.biases));
                mlx_rs::ops::dequantize(p.weight, &s, &b, q.group_size, q.bits).unwrap()
            }
            None => f32(&layer.weight),
        }
    }

    /// Values of `dtype` near 1 (a norm's scale): `1 + 0.1 z`, `z` standard normal.
    fn near_one(shape: &[i32], dtype: Dtype) -> Array {
        crate::test_arrays::normal(shape, Dtype::Float32)
            .multiply(Array::from_f32(0.1))
            .unwrap()
            .add(Array::from_f32(1.0))
            .unwrap()
            .as_dtype(dtype)
            .unwrap()
    }

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

    /// Where no gradient is taken on CUDA, products over a one-row norm's output (RMS, layer
    /// norm with and without a shift; one layer (of 96 features, and of 4 as a router, fewer warps
    /// than a block's) and a group of three, with and without biases,
    /// dense and packed in 4 bits by 64; bfloat16 and float32; GPT-2's and TinyLlama's widths,
    /// and rows of more than one vector a thread, 4,096 and 2,112 wide; a row of mean far from
    /// zero, a row off 16 bytes, and a row of tiny variance, whose norm epsilon dominates)
    /// normalise the norm's input in their own launch (the norm found and the kernel taking it),
    /// and equal, within the dtype's rounding, MLX's norm and products in float32 on the same
    /// values; off CUDA nothing is remembered and the layers' usual path gives the same.
    #[test]
    fn products_over_a_norm_normalise_its_input() {
        use crate::nn::{layer_norm, rms_norm, LayerNormParams, Quantization, RmsNormParams};
        use crate::test_arrays::normal;
        let cuda = cuda::available();
        let four = Some(Quantization {
            group_size: 64,
            bits: 4,
        });
        let f32 = |a: &Array| a.as_dtype(Dtype::Float32).unwrap();
        #[derive(Clone, Copy, Debug)]
        enum Row {
            /// Values around 3: the layer norm's mean matters, as a residual stream's can.
            Offset,
            /// The same, starting 2 or 4 bytes into its buffer: not on a 16-byte boundary.
            Unaligned,
            /// Values around 0 of variance 1e-6, under epsilon's 1e-5.
            Flat,
        }
        for (dtype, d, tolerance, packing, row) in [
            (Dtype::Bfloat16, 768, 0.02, None, Row::Offset),
            (Dtype::Bfloat16, 2048, 0.02, None, Row::Offset),
            (Dtype::Float32, 136, 1e-4, None, Row::Offset),
            (Dtype::Bfloat16, 2048, 0.02, four, Row::Offset),
            (Dtype::Bfloat16, 4096, 0.02, None, Row::Offset),
            (Dtype::Bfloat16, 2112, 0.02, None, Row::Unaligned),
            (Dtype::Float32, 136, 1e-4, None, Row::Flat),
            (Dtype::Bfloat16, 768, 0.02, None, Row::Flat),
        ] {
            let near_one = |shape: &[i32]| near_one(shape, dtype);
            let small = |shape: &[i32]| {
                let scaled = normal(shape, Dtype::Float32).multiply(Array::from_f32(0.1));
                scaled.unwrap().as_dtype(dtype).unwrap()
            };
            let offset = |width: i32| {
                normal(&[1, 1, width], Dtype::Float32)
                    .add(Array::from_f32(3.0))
                    .unwrap()
                    .as_dtype(dtype)
                    .unwrap()
            };
            let x = match row {
                Row::Offset => offset(d),
                Row::Unaligned => {
                    use mlx_rs::ops::indexing::IndexOp;
                    offset(d + 8).index((.., .., 1..d + 1))
                }
                Row::Flat => normal(&[1, 1, d], Dtype::Float32)
                    .multiply(Array::from_f32(1e-3))
                    .unwrap()
                    .as_dtype(dtype)
                    .unwrap(),
            };
            let eps = 1e-5;
            let layer = |features: i32, bias: bool| {
                let w = normal(&[features, d], Dtype::Float32)
                    .multiply(Array::from_f32((d as f32).powf(-0.5)))
                    .unwrap()
                    .as_dtype(dtype)
                    .unwrap();
                packed_as(w, bias.then(|| small(&[features])), packing)
            };
            let weight = near_one(&[d]);
            let shift = small(&[d]);
            let rms = RmsNormParams {
                weight: weight.clone(),
            };
            let shifted = LayerNormParams {
                weight: weight.clone(),
                bias: Some(shift.clone()),
            };
            let unshifted = LayerNormParams {
                weight: weight.clone(),
                bias: None,
            };
            // Each norm's name, the layer function, and MLX's norm in float32.
            let norms: [(&str, NormFn, Array); 3] = [
                (
                    "rms",
                    Box::new(|x| rms_norm(&rms, x, eps)),
                    mlx_rs::fast::rms_norm(f32(&x), Some(&f32(&weight)), eps).unwrap(),
                ),
                (
                    "layer",
                    Box::new(|x| layer_norm(&unshifted, x, eps)),
                    mlx_rs::fast::layer_norm(f32(&x), Some(&f32(&weight)), None, eps).unwrap(),
                ),
                (
                    "shifted layer",
                    Box::new(|x| layer_norm(&shifted, x, eps)),
                    mlx_rs::fast::layer_norm(f32(&x), Some(&f32(&weight)), Some(&f32(&shift)), eps)
                        .unwrap(),
                ),
            ];
            for (name, norm, n_want) in &norms {
                // A router's few features: fewer warps than a block's.
                let groups = [
                    (&[96][..], false),
                    (&[64, 16, 16][..], true),
                    (&[4][..], false),
                ];
                for (features, bias) in groups {
                    let layers: Vec<LinearParams> =
                        features.iter().map(|&f| layer(f, bias)).collect();
                    let group: Vec<&LinearParams> = layers.iter().collect();
                    let case = format!("{dtype:?} {d} {packing:?} {row:?} {name} {features:?}");
                    let (outputs, found) = without_gradients(|| -> Result<_> {
                        let n = norm(&x)?;
                        let found = deferred::normed(&n).is_some_and(|(input, norm)| {
                            let weights: Vec<Weight> =
                                group.iter().map(|l| base_weight(l)).collect();
                            let biases: Option<Vec<&Array>> =
                                group.iter().map(|l| l.bias.as_ref()).collect();
                            cuda::normed_matvec_fits(&input, &norm, &weights, biases.as_deref())
                        });
                        let outputs = match decode_products(&group, &n)? {
                            Some(outputs) => outputs,
                            None => group.iter().map(|l| linear(l, &n)).collect::<Result<_>>()?,
                        };
                        Ok((outputs, found))
                    })
                    .unwrap();
                    assert_eq!(found, cuda, "{case}: the norm found and taken only on CUDA");
                    if packing.is_some() && !cuda {
                        // MLX's CPU `quantized_matmul` sums in bfloat16: not this test's subject.
                        continue;
                    }
                    for (got, layer) in outputs.iter().zip(&layers) {
                        let mut want = n_want.matmul(dense_f32(layer).t()).unwrap();
                        if let Some(b) = &layer.bias {
                            want = want.add(f32(b)).unwrap();
                        }
                        assert_eq!(got.shape(), want.shape(), "{case}");
                        let err = f32(got).subtract(&want).unwrap().abs().unwrap();
                        let err = err.max(None).unwrap().item_cast::<f32>();
                        let scale = want.abs().unwrap().max(None).unwrap().item_cast::<f32>();
                        assert!(
                            err <= tolerance * scale.max(1.0),
                            "{case}: {err} of {scale}"
                        );
                    }
                }
            }
        }
    }

    /// A pre-norm MLP block written as its steps is, where no gradient is taken on CUDA, one
    /// launch of the block's kernel (its chain found and taken), equal within the dtype's
    /// rounding to MLX's separate operations in float32 (and on the CPU, where no kernel runs,
    /// to the same steps): a gated MLP (an RMS norm, the gate and up products as one group, the
    /// down product of the SiLU-gated input plus the residual) and a plain one (a layer norm
    /// with a shift, one product with a bias, the down product of its tanh-GELU with a bias plus
    /// the residual), each from the residual stream, or led by attention's output projection
    /// and its residual sum (`h = x + o(a)`, with a bias in the plain block), which the down
    /// product adds to; dense or quantized (4 bits by 64 in bfloat16, 8 bits by 32 in float32:
    /// the reference multiplies the weights MLX dequantizes). The layer's output is the block
    /// launch's, value for value; a down projection that adds to another row than the norm's
    /// input is not led by the projection. A gate and up over two norms' outputs, or over an
    /// input no norm made, are not found.
    #[test]
    fn an_mlp_block_is_one_launch() {
        use crate::nn::{
            layer_norm, linear_plus_in, rms_norm, Activation, LayerNormParams, Quantization,
            Residual, RmsNormParams,
        };
        use crate::test_arrays::normal;
        let cuda = cuda::available();
        let four = Some(Quantization {
            group_size: 64,
            bits: 4,
        });
        let eight = Some(Quantization {
            group_size: 32,
            bits: 8,
        });
        let f32 = |a: &Array| a.as_dtype(Dtype::Float32).unwrap();
        // TinyLlama's gated block and GPT-2's plain one at their sizes, and small ones.
        let large = |gated: bool| if gated { (2048, 5632) } else { (768, 3072) };
        for gated in [true, false] {
            let (d_large, f_large) = large(gated);
            for led in [false, true] {
                for (dtype, d, f, tolerance, packing) in [
                    (Dtype::Bfloat16, 64, 256, 0.02, None),
                    (Dtype::Bfloat16, d_large, f_large, 0.02, None),
                    (Dtype::Float32, 128, 352, 1e-4, None),
                    // Without a projection a 4-bit block of 64 (a projection's quarters of
                    // it are no whole chunks, so a led one is 128).
                    (Dtype::Bfloat16, if led { 128 } else { 64 }, 256, 0.02, four),
                    (Dtype::Bfloat16, d_large, f_large, 0.02, four),
                    (Dtype::Float32, 128, 384, 1e-4, eight),
                ] {
                    let case = format!("gated {gated} led {led} {dtype:?} {d} x {f} {packing:?}");
                    let scaled = |shape: &[i32], fan_in: i32| {
                        normal(shape, Dtype::Float32)
                            .multiply(Array::from_f32((fan_in as f32).powf(-0.5)))
                            .unwrap()
                            .as_dtype(dtype)
                            .unwrap()
                    };
                    let near_one = || near_one(&[d], dtype);
                    // The plain block has biases everywhere, as GPT-2's; the gated none.
                    let layer = |shape: &[i32], fan_in: i32| {
                        let bias = (!gated).then(|| scaled(&shape[..1], 4));
                        packed_as(scaled(shape, fan_in), bias, packing)
                    };
                    let (x, a) = (normal(&[1, 1, d], dtype), normal(&[1, 1, d], dtype));
                    let o = layer(&[d, d], d);
                    let (gate, up) = (layer(&[f, d], d), layer(&[f, d], d));
                    let down = layer(&[d, f], f);
                    let rms = RmsNormParams { weight: near_one() };
                    let ln = LayerNormParams {
                        weight: near_one(),
                        bias: Some(scaled(&[d], 4)),
                    };
                    let eps = 1e-5;
                    let activation = if gated {
                        Activation::Silu
                    } else {
                        Activation::GeluTanh
                    };
                    let mut ctx = crate::model::Context::evaluation();
                    let fused = without_gradients(|| -> Result<(Array, bool)> {
                        let h = if led {
                            let r = Some(Residual::new(&x, 0.0));
                            linear_plus_in(&o, LayerInput::Plain(&a), r, &mut ctx)?
                        } else {
                            x.clone()
                        };
                        let input = if gated {
                            linears_in([&gate, &up], &rms_norm(&rms, &h, eps)?, &mut ctx)?
                        } else {
                            let p = linear(&gate, &layer_norm(&ln, &h, eps)?)?;
                            [p.clone(), p]
                        };
                        let input = if gated {
                            LayerInput::Gated(activation, &input[0], &input[1])
                        } else {
                            LayerInput::Activated(activation, &input[0])
                        };
                        // The chain found, from `h` (led by the projection that made it where
                        // one leads), and the kernel taking it: its launch's output is the
                        // layer's, value for value. A down projection adding to another row
                        // than `h` is not led.
                        let chain = BlockChain::of(input, &h);
                        let block = chain.as_ref().and_then(|chain| {
                            let block = chain.block(&down, base_weight(&down), &h, led)?;
                            (deferred::same_array(&chain.h, &h) && block.fits()).then_some(block)
                        });
                        let direct = block.map(|block| block.apply()).transpose()?;
                        // Evaluated apart: two launches of one ticketed kernel in one evaluation
                        // would share its control block (`cuda::tasks`).
                        if let Some(direct) = &direct {
                            mlx_rs::transforms::eval([direct])?;
                        }
                        let residual = Some(Residual::new(&h, 0.0));
                        let y = linear_plus_in(&down, input, residual, &mut ctx)?;
                        if let Some(direct) = &direct {
                            assert!(y.eq_values(direct)?, "{case}: not the block's launch");
                        }
                        let other = BlockChain::of(input, &a).is_some_and(|chain| {
                            chain.block(&down, base_weight(&down), &a, true).is_some()
                        });
                        assert!(!other, "{case}: led into another residual");
                        Ok((y, direct.is_some()))
                    })
                    .unwrap();
                    assert_eq!(fused.1, cuda, "{case}: the chain found only on CUDA");
                    if packing.is_some() && !cuda {
                        // Off CUDA a packed layer is MLX's `quantized_matmul`, whose CPU kernel
                        // sums in the input's dtype (bfloat16's too coarse for this bound): not
                        // this test's subject.
                        continue;
                    }
                    // MLX's operations in float32 on the same (rounded) values.
                    let product = |input: &Array, layer: &LinearParams| {
                        let y = input.matmul(dense_f32(layer).t()).unwrap();
                        match &layer.bias {
                            Some(b) => y.add(f32(b)).unwrap(),
                            None => y,
                        }
                    };
                    let h = if led {
                        f32(&x).add(product(&f32(&a), &o)).unwrap()
                    } else {
                        f32(&x)
                    };
                    let inner = if gated {
                        let n = mlx_rs::fast::rms_norm(&h, Some(&f32(&rms.weight)), eps).unwrap();
                        let g = product(&n, &gate);
                        mlx_rs::nn::silu(&g)
                            .unwrap()
                            .multiply(product(&n, &up))
                            .unwrap()
                    } else {
                        let bias = ln.bias.as_ref().map(f32);
                        let n = mlx_rs::fast::layer_norm(
                            &h,
                            Some(&f32(&ln.weight)),
                            bias.as_ref(),
                            eps,
                        )
                        .unwrap();
                        Activation::GeluTanh.of(&product(&n, &gate)).unwrap()
                    };
                    let want = h.add(product(&inner, &down)).unwrap();
                    let err = f32(&fused.0).subtract(&want).unwrap().abs().unwrap();
                    let err = err.max(None).unwrap().item_cast::<f32>();
                    let scale = want.abs().unwrap().max(None).unwrap().item_cast::<f32>();
                    assert!(
                        err <= tolerance * scale.max(1.0),
                        "{case}: {err} of {scale}"
                    );
                    assert_eq!(fused.0.shape(), x.shape(), "{case}");
                }
            }
        }

        // Gate and up over two norms' outputs, or over an input no norm made: not found.
        let dtype = Dtype::Bfloat16;
        let (x, other) = (normal(&[1, 1, 64], dtype), normal(&[1, 1, 64], dtype));
        let norm = RmsNormParams {
            weight: normal(&[64], dtype),
        };
        let (gate, up) = (layer(256, false), layer(256, false));
        let mut ctx = crate::model::Context::evaluation();
        let unfused = without_gradients(|| -> Result<[bool; 2]> {
            let n = rms_norm(&norm, &x, 1e-5)?;
            let m = rms_norm(&norm, &other, 1e-5)?;
            let [g, _] = linears_in([&gate, &up], &n, &mut ctx)?;
            let [_, u] = linears_in([&gate, &up], &m, &mut ctx)?;
            let [gx, ux] = linears_in([&gate, &up], &x, &mut ctx)?;
            Ok([
                deferred::normed_gated(&g, &u).is_some(),
                deferred::normed_gated(&gx, &ux).is_some(),
            ])
        })
        .unwrap();
        assert_eq!(unfused, [false, false]);
    }
}
