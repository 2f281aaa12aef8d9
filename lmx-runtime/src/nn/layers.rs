//! Layers: parameter structs and the pure functions that apply them.

use super::extra::literal;
use super::{deferred, padded_product, quantized_product};
use crate::cuda::{NormKind, Weight};
use crate::error::Result;
use crate::model::Context;
use mlx_rs::fast::{self, ScaledDotProductAttentionMask};
use mlx_rs::{ops, random, Array, Dtype};

/// A linear map `y = x W^T + b` with `weight: [out, in]` and an optional `bias: [out]`.
///
/// Quantized (mlx-lm's `QuantizedLinear` layout), `weight` holds the packed `uint32` values of
/// `[out, in]` and `scales`, `biases` the per-group affine parameters; with a low-rank adapter
/// (mlx-lm's `LoRALinear` names), `lora_a: [in, rank]` and `lora_b: [rank, out]` add
/// `scale * (x A) B` to the output. With a magnitude `m: [out]` as well the adapter is DoRA's
/// (mlx-lm's `DoRALinear`): each output row of `W + scale (A B)^T` is normalised to length 1 and
/// scaled by its `m`, the bias added after.
#[derive(Clone, Debug, PartialEq, lmx_macros::Tree)]
#[lmx(runtime = "crate", layer = linear)]
pub struct LinearParams<T = Array> {
    #[lmx(role = weight)]
    pub weight: T,
    #[lmx(role = bias)]
    pub bias: Option<T>,
    #[lmx(role = quantization)]
    pub scales: Option<T>,
    #[lmx(role = quantization)]
    pub biases: Option<T>,
    #[lmx(role = adapter)]
    pub lora_a: Option<T>,
    #[lmx(role = adapter)]
    pub lora_b: Option<T>,
    #[lmx(role = adapter)]
    pub m: Option<T>,
    /// How `weight` is quantized, when it is.
    #[lmx(skip)]
    pub quantization: Option<Quantization>,
    /// The adapter's settings, when there is one.
    #[lmx(skip)]
    pub lora: Option<LoraSettings>,
}

impl<T> LinearParams<T> {
    /// A plain linear layer: neither quantized nor adapted.
    pub fn new(weight: T, bias: Option<T>) -> Self {
        LinearParams {
            weight,
            bias,
            scales: None,
            biases: None,
            lora_a: None,
            lora_b: None,
            m: None,
            quantization: None,
            lora: None,
        }
    }
}

/// An embedding table `weight: [vocab, dim]`; quantized as a linear layer's weight is.
#[derive(Clone, Debug, PartialEq, lmx_macros::Tree)]
#[lmx(runtime = "crate", layer = embedding)]
pub struct EmbeddingParams<T = Array> {
    #[lmx(role = embedding)]
    pub weight: T,
    #[lmx(role = quantization)]
    pub scales: Option<T>,
    #[lmx(role = quantization)]
    pub biases: Option<T>,
    /// How `weight` is quantized, when it is.
    #[lmx(skip)]
    pub quantization: Option<Quantization>,
}

impl<T> EmbeddingParams<T> {
    /// A plain embedding table.
    pub fn new(weight: T) -> Self {
        EmbeddingParams {
            weight,
            scales: None,
            biases: None,
            quantization: None,
        }
    }
}

/// A quantized layer's parts: the packed weight, its per-group scales and offsets, and how it
/// is packed. The one reading of "is this layer quantized", for the layers, fusing and checks.
pub struct Packed<'a, T> {
    pub weight: &'a T,
    pub scales: &'a T,
    pub biases: &'a T,
    pub quantization: Quantization,
}

impl<'a, T> Packed<'a, T> {
    pub(crate) fn of(
        weight: &'a T,
        scales: &'a Option<T>,
        biases: &'a Option<T>,
        quantization: Option<Quantization>,
    ) -> Option<Self> {
        match (scales, biases, quantization) {
            (Some(scales), Some(biases), Some(quantization)) => Some(Packed {
                weight,
                scales,
                biases,
                quantization,
            }),
            _ => None,
        }
    }
}

impl<T> LinearParams<T> {
    /// The layer's packed parts, when it is quantized.
    pub fn packed(&self) -> Option<Packed<'_, T>> {
        Packed::of(&self.weight, &self.scales, &self.biases, self.quantization)
    }

    /// Whether the layer is a plain product: neither quantized nor adapted (LoRA or DoRA).
    pub fn is_plain(&self) -> bool {
        self.packed().is_none() && self.lora_a.is_none() && self.m.is_none()
    }
}

impl<T> EmbeddingParams<T> {
    /// The table's packed parts, when it is quantized.
    pub fn packed(&self) -> Option<Packed<'_, T>> {
        Packed::of(&self.weight, &self.scales, &self.biases, self.quantization)
    }
}

/// MLX's affine quantization of a weight: `bits` per value, one scale and offset per
/// `group_size` values of a row (mlx-lm's `quantization` entry in config.json).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Quantization {
    pub group_size: i32,
    pub bits: i32,
}

/// A low-rank adapter's settings (mlx-lm's `lora_parameters`): the output added is
/// `scale * (dropout(x) A) B`.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LoraSettings {
    pub scale: f32,
    pub dropout: f32,
}

/// Layer normalisation with a scale `weight: [dim]` and an optional shift `bias: [dim]`.
#[derive(Clone, Debug, PartialEq, lmx_macros::Tree)]
#[lmx(runtime = "crate")]
pub struct LayerNormParams<T = Array> {
    #[lmx(role = norm)]
    pub weight: T,
    #[lmx(role = norm)]
    pub bias: Option<T>,
}

/// RMS normalisation with a scale `weight: [dim]`.
#[derive(Clone, Debug, PartialEq, lmx_macros::Tree)]
#[lmx(runtime = "crate")]
pub struct RmsNormParams<T = Array> {
    #[lmx(role = norm)]
    pub weight: T,
}

/// `x W^T + b`, with a bias in one fused `addmm` as `mlx.nn.Linear` computes it (on the CPU, BLAS
/// then adds the bias in the product's own pass, and picks its faster small-matrix kernels for a
/// single token), and `W`'s gradient made in `W`'s own layout (see `linear_grad`).
///
/// A quantized weight multiplies with MLX's `quantized_matmul`; an adapter adds its low-rank
/// term to whichever product the base gives (DoRA's then rescales the rows). The adapter's
/// dropout is not applied: [`linear_in`] applies it in a training step.
pub fn linear(params: &LinearParams, x: &Array) -> Result<Array> {
    adapted(params, x, x)
}

/// [`linear`] inside a forward pass: an adapter with a dropout probability sees its input
/// through [`dropout`], whose mask is drawn from `ctx`'s key, so only in a training step (as
/// mlx-lm's `LoRALinear` in training mode); evaluation, validation and generation compute
/// [`linear`].
pub fn linear_in(params: &LinearParams, x: &Array, ctx: &mut Context) -> Result<Array> {
    match params.lora {
        Some(lora) if lora.dropout > 0.0 && params.lora_a.is_some() => {
            let dropped = dropout(x, lora.dropout, ctx)?;
            adapted(params, x, &dropped)
        }
        _ => linear(params, x),
    }
}

/// The layer over `x`, its adapter (if any) over `adapter_x`.
fn adapted(params: &LinearParams, x: &Array, adapter_x: &Array) -> Result<Array> {
    let (Some(a), Some(b), Some(lora)) = (&params.lora_a, &params.lora_b, params.lora) else {
        return base(params, x, params.bias.as_ref());
    };
    let low = ops::matmul(&ops::matmul(adapter_x, a)?, b)?;
    let low = ops::multiply(&low, &literal(f64::from(lora.scale), &low)?)?;
    let Some(m) = &params.m else {
        return Ok(ops::add(&base(params, x, params.bias.as_ref())?, &low)?);
    };
    // DoRA (mlx-lm's `DoRALinear.__call__`): the rows' norms of the adapted weight are a
    // constant of the gradient, so only the direction's numerator and `m` learn through them.
    let y = ops::add(&base(params, x, None)?, &low)?;
    let norms = mlx_rs::stop_gradient(&dora_row_norms(params, a, b, lora.scale)?)?;
    let y = ops::multiply(&ops::divide(m, &norms)?.as_dtype(x.dtype())?, &y)?;
    Ok(match &params.bias {
        Some(bias) => ops::add(&y, bias)?,
        None => y,
    })
}

/// The dense weight of a layer: its packed one dequantized.
pub(crate) fn dense_weight(params: &LinearParams) -> Result<Array> {
    match params.packed() {
        Some(p) => p.dequantized(),
        None => Ok(params.weight.clone()),
    }
}

impl<'a> Packed<'a, Array> {
    /// The packed weight as decoding's kernels read it.
    pub(crate) fn weight_rows(&self) -> Weight<'a> {
        Weight::Affine {
            packed: self.weight,
            scales: self.scales,
            biases: self.biases,
            bits: self.quantization.bits,
            group_size: self.quantization.group_size,
        }
    }

    /// The packed weight's values, dequantized (in the scales' dtype, as MLX gives them).
    pub(crate) fn dequantized(&self) -> Result<Array> {
        Ok(ops::dequantize(
            self.weight,
            self.scales,
            self.biases,
            self.quantization.group_size,
            self.quantization.bits,
        )?)
    }
}

/// The L2 norm of each row of `w` (MLX's `linalg.norm(w, axis=1)`): DoRA's magnitudes.
pub(crate) fn row_norms(w: &Array) -> Result<Array> {
    Ok(mlx_rs::linalg::norm_l2(
        w,
        mlx_rs::linalg::NormOptions {
            axes: 1.into(),
            keep_dims: false,
        },
    )?)
}

/// The row norms of the adapted weight `W + scale (A B)^T`, in the weight's dtype.
pub(crate) fn dora_row_norms(
    params: &LinearParams,
    a: &Array,
    b: &Array,
    scale: f32,
) -> Result<Array> {
    row_norms(&adapted_weight(&dense_weight(params)?, a, b, scale)?)
}

/// `W + scale (A B)^T` in `W`'s dtype, as mlx-lm's adapters fuse.
pub(crate) fn adapted_weight(w: &Array, a: &Array, b: &Array, scale: f32) -> Result<Array> {
    let scaled = ops::multiply(b.t(), Array::from_f32(scale))?;
    let delta = ops::matmul(&scaled, a.t())?;
    Ok(ops::add(w, &delta.as_dtype(w.dtype())?)?)
}

/// The base layer's product with `bias` added.
fn base(params: &LinearParams, x: &Array, bias: Option<&Array>) -> Result<Array> {
    match params.packed() {
        Some(packed) => quantized_product::quantized_linear(x, &packed, bias),
        None => padded_product::linear(x, &params.weight, bias),
    }
}

/// The rows of the table for integer `ids`: `[...] -> [..., dim]`; the table's gradient is summed
/// in float32 (`embedding_grad`). A packed table's rows are dequantized: on MLX's CUDA backend
/// by one kernel of lmx's where it takes the table and ids (`cuda::PackedRows::of`: 4 or 8 bits,
/// groups of 32, 64 or 128, 32-bit ids), with MLX's values.
pub fn embedding(params: &EmbeddingParams, ids: &Array) -> Result<Array> {
    match params.packed() {
        Some(packed) => {
            let table = packed.weight_rows();
            if crate::cuda::available() {
                if let Some(lookup) = crate::cuda::PackedRows::of(&table, ids) {
                    return lookup.apply();
                }
            }
            let rows = |a: &Array| a.take_axis(ids, 0);
            let q = packed.quantization;
            Ok(ops::dequantize(
                rows(packed.weight)?,
                rows(packed.scales)?,
                &rows(packed.biases)?,
                q.group_size,
                q.bits,
            )?)
        }
        None => super::embedding_grad::lookup(&params.weight, ids),
    }
}

/// `x` projected on the embedding table, as a tied output head: `[..., dim] -> [..., vocab]`.
pub fn embedding_as_linear(params: &EmbeddingParams, x: &Array) -> Result<Array> {
    match params.packed() {
        Some(packed) => quantized_product::quantized_linear(x, &packed, None),
        None => padded_product::linear(x, &params.weight, None),
    }
}

/// Layer normalisation over the last axis: MLX's fused kernel, whose gradient on MLX's CUDA
/// backend is lmx's own (one pass, float32 sums for the scale's and shift's gradients).
pub fn layer_norm(params: &LayerNormParams, x: &Array, eps: f32) -> Result<Array> {
    let y = super::layer_norm_grad::layer_norm(x, &params.weight, params.bias.as_ref(), eps)?;
    let norm = (NormKind::Layer, &params.weight, params.bias.as_ref());
    deferred::remember_norm(&y, x, norm, eps);
    Ok(y)
}

/// RMS normalisation over the last axis (MLX's fused kernel).
pub fn rms_norm(params: &RmsNormParams, x: &Array, eps: f32) -> Result<Array> {
    let y = fast::rms_norm(x, Some(&params.weight), eps)?;
    deferred::remember_norm(&y, x, (NormKind::Rms, &params.weight, None), eps);
    Ok(y)
}

/// RMS normalisation scaled by `offset + weight` rather than `weight`, as Gemma's norms are
/// (`offset = 1`; its checkpoints store `weight` alone).
pub fn rms_norm_with_offset(
    params: &RmsNormParams,
    x: &Array,
    eps: f32,
    offset: f32,
) -> Result<Array> {
    let scale = params
        .weight
        .add(literal(f64::from(offset), &params.weight)?)?;
    let y = fast::rms_norm(x, Some(&scale), eps)?;
    deferred::remember_norm(&y, x, (NormKind::Rms, &scale, None), eps);
    Ok(y)
}

/// Dropout: each element of `x` zeroed with probability `p` and the rest scaled by `1 / (1 - p)`,
/// with a mask drawn from `ctx`'s key. Where `ctx` has no key (evaluation, generation) or `p` is
/// 0, `x` passes through unchanged.
pub fn dropout(x: &Array, p: f32, ctx: &mut Context) -> Result<Array> {
    if !(0.0..1.0).contains(&p) {
        return Err(crate::error::Error::Layout(format!(
            "dropout needs a probability in [0, 1), not {p}"
        )));
    }
    if p == 0.0 {
        return Ok(x.clone());
    }
    let Some(key) = ctx.next_key()? else {
        return Ok(x.clone());
    };
    let keep = random::bernoulli(&Array::from_f32(1.0 - p), x.shape(), &key)?;
    let scale = literal(f64::from(1.0 / (1.0 - p)), x)?;
    Ok(ops::select(&keep, &x.multiply(&scale)?, &literal(0.0, x)?)?)
}

/// Splits `[B, T, heads * head_dim]` into heads: `[B, heads, T, head_dim]`.
pub fn split_heads(x: &Array, heads: i32) -> Result<Array> {
    let shape = x.shape();
    let (b, t) = (shape[0], shape[1]);
    Ok(x.reshape(&[b, t, heads, -1])?
        .transpose_axes(&[0, 2, 1, 3])?)
}

/// Merges heads back: `[B, heads, T, head_dim] -> [B, T, heads * head_dim]`.
pub fn merge_heads(x: &Array) -> Result<Array> {
    let shape = x.shape();
    let (b, t) = (shape[0], shape[2]);
    Ok(x.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, t, -1])?)
}

/// Which positions a query may attend to.
#[derive(Clone, Copy, Debug)]
pub enum AttentionMask<'a> {
    /// Every earlier position and itself.
    Causal,
    /// An additive (or boolean) mask broadcast against `[B, heads, T_q, T_k]`.
    Array(&'a Array),
    /// No mask: every query sees every key.
    None,
}

/// Fused scaled dot-product attention over `[B, heads, T, head_dim]` queries, keys and values.
/// Keys and values may have fewer heads than queries (grouped-query attention).
pub fn attention(q: &Array, k: &Array, v: &Array, mask: AttentionMask<'_>) -> Result<Array> {
    let head_dim = q.shape()[q.ndim() - 1];
    let scale = (head_dim as f32).powf(-0.5);
    let mask = match mask {
        AttentionMask::Causal => Some(ScaledDotProductAttentionMask::Causal),
        AttentionMask::Array(mask) => Some(ScaledDotProductAttentionMask::Array(mask)),
        AttentionMask::None => None,
    };
    Ok(fast::scaled_dot_product_attention(
        q, k, v, scale, mask, None,
    )?)
}

/// A scalar of `dtype`, for arithmetic that keeps its operand's precision.
///
/// Floating and `int32` scalars are made directly in their type, with no conversion in the
/// graph: a compiled step inlines them as constants, and an eager one launches no kernel for them.
pub fn scalar(value: f32, dtype: Dtype) -> Result<Array> {
    Ok(match dtype {
        Dtype::Float32 => Array::from_f32(value),
        Dtype::Bfloat16 => Array::from_slice(&[half::bf16::from_f32(value)], &[]),
        Dtype::Float16 => Array::from_slice(&[half::f16::from_f32(value)], &[]),
        Dtype::Int32 if value.fract() == 0.0 => Array::from_int(value as i32),
        other => Array::from_f32(value).as_dtype(other)?,
    })
}

/// Positions `0..len` as int32.
pub fn positions(len: i32) -> Result<Array> {
    Ok(Array::arange::<_, i32>(None, len, None)?)
}

/// Initialisers: every one takes the random key it consumes.
pub mod init {
    use super::*;
    pub use crate::nn::switch::init_experts as experts;

    /// Normal samples with standard deviation `std`.
    pub fn normal(shape: &[i32], std: f32, key: &Array) -> Result<Array> {
        Ok(random::normal::<f32>(shape, None, std, key)?)
    }

    /// Uniform samples in `[-bound, bound)`.
    pub fn uniform(shape: &[i32], bound: f32, key: &Array) -> Result<Array> {
        Ok(random::uniform::<_, f32>(-bound, bound, shape, key)?)
    }

    /// Zeros.
    pub fn zeros(shape: &[i32]) -> Result<Array> {
        Ok(Array::zeros::<f32>(shape)?)
    }

    /// Ones.
    pub fn ones(shape: &[i32]) -> Result<Array> {
        Ok(Array::ones::<f32>(shape)?)
    }

    /// A linear layer as MLX initialises it: uniform in `±1/sqrt(in)`, bias too.
    pub fn linear(input: i32, output: i32, bias: bool, keys: &mut Keys) -> Result<LinearParams> {
        let bound = (input as f32).powf(-0.5);
        let weight = uniform(&[output, input], bound, &keys.next()?)?;
        let bias = if bias {
            Some(uniform(&[output], bound, &keys.next()?)?)
        } else {
            None
        };
        Ok(LinearParams::new(weight, bias))
    }

    /// `linear` with a low-rank adapter of `rank` (none for 0) whose output is scaled by
    /// `scale`, initialised as mlx-lm's `LoRALinear` (`lora::attach`): a `.lmx` layer's
    /// `linear(.., lora_rank = r, lora_scale = s)`.
    pub fn with_adapter(
        mut linear: LinearParams,
        rank: i32,
        scale: f32,
        keys: &mut Keys,
    ) -> Result<LinearParams> {
        if rank == 0 {
            return Ok(linear);
        }
        let parameters = crate::lora::LoraParameters {
            rank,
            scale,
            ..Default::default()
        };
        crate::lora::check(&parameters)?;
        crate::lora::adapt(
            &mut linear,
            &parameters,
            keys,
            crate::lora::FineTuneType::Lora,
        )?;
        Ok(linear)
    }

    /// A linear layer with weights normal with standard deviation `std` and a zero bias, as
    /// GPT-2 initialises them; a `std` of 0 is MLX's initialisation ([`linear`]).
    pub fn linear_normal(
        input: i32,
        output: i32,
        bias: bool,
        std: f32,
        keys: &mut Keys,
    ) -> Result<LinearParams> {
        if std == 0.0 {
            return linear(input, output, bias, keys);
        }
        let weight = normal(&[output, input], std, &keys.next()?)?;
        let bias = if bias { Some(zeros(&[output])?) } else { None };
        Ok(LinearParams::new(weight, bias))
    }

    /// An embedding normal with standard deviation `std`, as GPT-2 initialises them; a `std` of 0
    /// is MLX's initialisation ([`embedding`]).
    pub fn embedding_normal(
        vocab: i32,
        dim: i32,
        std: f32,
        keys: &mut Keys,
    ) -> Result<EmbeddingParams> {
        if std == 0.0 {
            return embedding(vocab, dim, keys);
        }
        Ok(EmbeddingParams::new(normal(
            &[vocab, dim],
            std,
            &keys.next()?,
        )?))
    }

    /// An embedding as MLX initialises it: normal with standard deviation `1/sqrt(dim)`.
    pub fn embedding(vocab: i32, dim: i32, keys: &mut Keys) -> Result<EmbeddingParams> {
        Ok(EmbeddingParams::new(normal(
            &[vocab, dim],
            (dim as f32).powf(-0.5),
            &keys.next()?,
        )?))
    }

    /// A layer norm: ones and, with a bias, zeros.
    pub fn layer_norm(dim: i32, bias: bool) -> Result<LayerNormParams> {
        Ok(LayerNormParams {
            weight: ones(&[dim])?,
            bias: if bias { Some(zeros(&[dim])?) } else { None },
        })
    }

    /// An RMS norm: ones.
    pub fn rms_norm(dim: i32) -> Result<RmsNormParams> {
        Ok(RmsNormParams {
            weight: ones(&[dim])?,
        })
    }

    /// An RMS norm scaled by `offset + weight`: `1 - offset` everywhere, so that it starts as
    /// the identity scale (zeros for Gemma's `offset = 1`, as Hugging Face initialises it).
    pub fn rms_norm_with_offset(dim: i32, offset: f32) -> Result<RmsNormParams> {
        Ok(RmsNormParams {
            weight: Array::full::<f32>(&[dim], Array::from_f32(1.0 - offset))?,
        })
    }

    /// A stream of independent random keys split from one seed key.
    pub struct Keys {
        key: Array,
    }

    impl Keys {
        /// Keys derived from `seed`.
        pub fn from_seed(seed: u64) -> Result<Keys> {
            Ok(Keys {
                key: random::key(seed)?,
            })
        }

        /// The next key. (Not `Iterator::next`: splitting a key can fail.)
        #[allow(clippy::should_implement_trait)]
        pub fn next(&mut self) -> Result<Array> {
            let (carry, sub) = random::split(&self.key, 2)?;
            self.key = carry;
            Ok(sub)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ones() -> Array {
        Array::ones::<f32>(&[200, 100]).unwrap()
    }

    #[test]
    fn dropout_zeroes_about_p_of_the_elements_and_scales_the_rest() {
        let mut ctx = Context::training(&random::key(7).unwrap());
        let first = dropout(&ones(), 0.25, &mut ctx).unwrap();
        let values = first.as_slice::<f32>();
        let zeros = values.iter().filter(|&&v| v == 0.0).count() as f64 / values.len() as f64;
        assert!(
            (zeros - 0.25).abs() < 0.02,
            "{zeros} of the elements dropped"
        );
        assert!(values
            .iter()
            .all(|&v| v == 0.0 || (v - 1.0 / 0.75).abs() < 1e-6));

        let second = dropout(&ones(), 0.25, &mut ctx).unwrap();
        assert_ne!(
            second.as_slice::<f32>(),
            values,
            "each call draws a new mask"
        );
        let mut again = Context::training(&random::key(7).unwrap());
        let replayed = dropout(&ones(), 0.25, &mut again).unwrap();
        assert_eq!(
            replayed.as_slice::<f32>(),
            values,
            "the same key, the same mask"
        );
    }

    #[test]
    fn dropout_without_a_key_or_with_p_zero_is_the_identity() {
        let x = ones();
        let evaluated = dropout(&x, 0.5, &mut Context::evaluation()).unwrap();
        assert_eq!(evaluated.as_slice::<f32>(), x.as_slice::<f32>());
        let mut ctx = Context::training(&random::key(0).unwrap());
        let off = dropout(&x, 0.0, &mut ctx).unwrap();
        assert_eq!(off.as_slice::<f32>(), x.as_slice::<f32>());
        let message = dropout(&x, 1.0, &mut ctx).unwrap_err().to_string();
        assert!(message.contains("[0, 1), not 1"), "{message}");
    }
}
