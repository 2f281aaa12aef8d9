//! Ops that `.lmx` models use beyond the core layers: attention with a window or an additive
//! bias (ALiBi), ALiBi and sinusoidal tables, top-k routing helpers, static indexing, and scalars
//! that take their operand's precision. Generated code calls these by name; each is a pure
//! function of arrays, so it traces into a compiled step like the core layers.

use super::scalar;
use crate::error::{Error, Result};
use crate::model::Context;
use mlx_rs::fast::{self, ScaledDotProductAttentionMask};
use mlx_rs::{ops, Array, Dtype};

/// `value` as a scalar array that keeps `like`'s precision: `like`'s dtype when that is a
/// floating type or when `value` is integral, float32 otherwise.
pub fn literal(value: f64, like: &Array) -> Result<Array> {
    let dtype = like.dtype();
    let keeps = matches!(
        dtype,
        Dtype::Float16 | Dtype::Bfloat16 | Dtype::Float32 | Dtype::Float64
    ) || value.fract() == 0.0;
    let dtype = if keeps { dtype } else { Dtype::Float32 };
    scalar(value as f32, dtype)
}

/// `x` cut into `N` equal parts along `axis`.
pub fn split<const N: usize>(x: &Array, axis: i32) -> Result<[Array; N]> {
    let parts = x.split_equal(N as i32, axis)?;
    let found = parts.len();
    parts
        .try_into()
        .map_err(|_| Error::Layout(format!("split into {N} parts gave {found}")))
}

/// Softmax along `axis`, computed in float32 precision.
pub fn softmax(x: &Array, axis: i32) -> Result<Array> {
    Ok(ops::softmax_axis(x, axis, true)?)
}

/// Log-softmax along `axis`.
pub fn log_softmax(x: &Array, axis: i32) -> Result<Array> {
    Ok(mlx_rs::nn::log_softmax(x, axis)?)
}

/// `max(x, 0)`.
pub fn relu(x: &Array) -> Result<Array> {
    Ok(mlx_rs::nn::relu(x)?)
}

/// `log(1 + exp(x))`.
pub fn softplus(x: &Array) -> Result<Array> {
    Ok(mlx_rs::nn::softplus(x)?)
}

/// The `k` largest values along the last axis and their indices (in no particular order).
/// Gradients reach `x` through the values; the indices are constants to differentiation (MLX
/// cannot differentiate a gather with respect to its indices, as mlx-lm's routers also stop them).
pub fn top_k(x: &Array, k: i32) -> Result<(Array, Array)> {
    let last = x.ndim() as i32 - 1;
    let width = x.shape()[x.ndim() - 1];
    let order = mlx_rs::stop_gradient(&ops::argpartition_axis(x.negative()?, k - 1, last)?)?;
    let indices = order.take_axis(Array::arange::<_, i32>(None, k.min(width), None)?, last)?;
    let values = x.take_along_axis(&indices, last)?;
    Ok((values, indices))
}

/// Float32 one-hot vectors of width `n` for integer `indices`: `[...] -> [..., n]`.
pub fn one_hot(indices: &Array, n: i32) -> Result<Array> {
    let classes = Array::arange::<_, i32>(None, n, None)?;
    Ok(indices
        .expand_dims(-1)?
        .eq(&classes)?
        .as_dtype(Dtype::Float32)?)
}

/// Rotary position embedding over the whole last axis of `[B, heads, T, head_dim]`, positions
/// starting at `offset`, an int32 scalar (the half-split layout of LLaMA's weights;
/// [`super::rope`]).
pub fn rotary(x: &Array, base: f32, offset: &Array) -> Result<Array> {
    let dims = x.shape()[x.ndim() - 1];
    super::rope(x, dims, base, offset)
}

/// `cap * tanh(x / cap)`: values squashed smoothly into `(-cap, cap)` (Gemma 2's attention and
/// final-logit soft-capping), in `x`'s precision.
pub fn softcap(x: &Array, cap: f32) -> Result<Array> {
    let cap = literal(f64::from(cap), x)?;
    Ok(ops::tanh(&x.divide(&cap)?)?.multiply(&cap)?)
}

/// `x` converted to float32.
pub fn as_float(x: &Array) -> Result<Array> {
    Ok(x.as_dtype(Dtype::Float32)?)
}

/// `x` with no gradient flowing back through it.
pub fn stop_gradient(x: &Array) -> Result<Array> {
    Ok(mlx_rs::stop_gradient(x)?)
}

/// Where a forward pass's positions start, and how many keys its attention sees: what
/// position-dependent builtins (RoPE, learned and sinusoidal positions, ALiBi) read from it.
///
/// The offset is an array, not a host integer, so that a traced decode step (one trace for
/// every token of a shape bucket) reads it as an input instead of freezing one value.
#[derive(Clone, Debug)]
pub struct Positions {
    /// The position of the call's first token, an int32 scalar: 0 outside generation, the
    /// number of tokens already cached during it.
    pub offset: Array,
    /// How many keys each attention call sees: the tokens before this call and its own or, in a
    /// traced decode step, the cache's capacity (the slots past the call's last token masked).
    pub keys: i32,
    /// In a batch whose rows start at different slots (left-padded prompts, rows that joined a
    /// running batch): each row's first slot, `[B]` int32. The offset counts slots; a row's
    /// absolute positions ([`arange`], [`sinusoidal`]) count from its own first slot, so that it
    /// reads the position table as alone. (Relative positions, RoPE's and ALiBi's, see only
    /// differences of slots.)
    pub rows: Option<Array>,
}

/// Int32 positions `0 .. len`, after `start`'s offset when given: `[len]`, or `[B, len]` for a
/// batch of rows that start at different slots, each row's counted from its first slot (the
/// padding before it at position 0: it is masked, any row of the table would do).
pub fn arange(start: Option<&Positions>, len: i32) -> Result<Array> {
    let Some(start) = start else {
        return Ok(Array::arange::<_, i32>(None, len, None)?);
    };
    let slots = positions_after(&start.offset, len)?;
    match &start.rows {
        Some(rows) => Ok(ops::maximum(
            slots
                .reshape(&[1, len])?
                .subtract(rows.reshape(&[-1, 1])?)?,
            Array::from_int(0),
        )?),
        None => Ok(slots),
    }
}

/// Int32 positions `offset .. offset + len` for an int32 scalar `offset`.
pub fn positions_after(offset: &Array, len: i32) -> Result<Array> {
    Ok(Array::arange::<_, i32>(None, len, None)?.add(offset)?)
}

/// ALiBi slopes of `heads` heads as MPT computes them (maximum bias 8): `2^(-8 i / n)` for the
/// next power of two `n`, interleaved when `heads` is not a power of two.
pub fn alibi_slopes(heads: i32) -> Vec<f32> {
    let padded = (heads.max(1) as u32).next_power_of_two() as i32;
    let all: Vec<f32> = (1..=padded)
        .map(|i| 2f32.powf(-(i as f32) * 8.0 / padded as f32))
        .collect();
    if padded == heads {
        return all;
    }
    let odd = all.iter().skip(1).step_by(2);
    let even = all.iter().step_by(2);
    odd.chain(even).take(heads as usize).copied().collect()
}

/// The ALiBi bias of the `len` queries after `start`'s offset over the `start.keys` keys at
/// positions `0 ..`: `[heads, len, keys]`, `slope_h * (j - i)` for query `i` and key `j`.
/// Without `start` (training) the bias is `[heads, len, len]`.
pub fn alibi(heads: i32, start: Option<&Positions>, len: i32) -> Result<Array> {
    let slopes = Array::from_slice(&alibi_slopes(heads), &[heads, 1, 1]);
    let total = start.map_or(len, |start| start.keys);
    let keys = Array::arange::<_, f32>(None, total as f32, None)?;
    let queries = arange(start, len)?.as_dtype(Dtype::Float32)?;
    let distance = keys
        .reshape(&[1, total])?
        .subtract(queries.reshape(&[len, 1])?)?;
    Ok(slopes.multiply(distance)?)
}

/// Sinusoidal position table `[len, dim]` for the `len` positions after `start`'s offset (from 0
/// without it): sines in the first half of the features, cosines in the second, frequencies
/// `10000^(-2i/dim)`.
pub fn sinusoidal(start: Option<&Positions>, len: i32, dim: i32) -> Result<Array> {
    let half = dim / 2;
    let positions = arange(start, len)?.as_dtype(Dtype::Float32)?;
    let exponents = Array::arange::<_, f32>(None, half as f32, None)?
        .multiply(Array::from_f32(-(10000f32.ln()) / half.max(1) as f32))?;
    // `[len, half]`, or `[B, len, half]` for rows counted from their own first slots.
    let angles = positions
        .expand_dims(-1)?
        .multiply(ops::exp(exponents)?.reshape(&[1, half])?)?;
    Ok(ops::concatenate(
        &[ops::sin(&angles)?, ops::cos(&angles)?],
        -1,
    )?)
}

/// One subscript of a static index expression.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Subscript {
    /// `...`: every remaining leading axis.
    Ellipsis,
    /// `i`: one position (negative counts from the end); the axis is dropped.
    At(i32),
    /// `a:b` with either end open (negative counts from the end).
    Range(Option<i32>, Option<i32>),
}

/// `x[subscripts]` with static subscripts, as NumPy reads them.
pub fn index(x: &Array, subscripts: &[Subscript]) -> Result<Array> {
    let rank = x.ndim();
    let explicit = subscripts
        .iter()
        .filter(|s| **s != Subscript::Ellipsis)
        .count();
    let mut axes = Vec::with_capacity(rank);
    for subscript in subscripts {
        match subscript {
            Subscript::Ellipsis => axes.extend(std::iter::repeat_n(
                Subscript::Range(None, None),
                rank.saturating_sub(explicit),
            )),
            other => axes.push(*other),
        }
    }
    let mut out = x.clone();
    let mut axis = 0i32;
    for subscript in axes {
        let size = out.shape()[axis as usize];
        let resolve = |i: i32| {
            if i < 0 {
                (i + size).max(0)
            } else {
                i.min(size)
            }
        };
        match subscript {
            Subscript::At(i) => {
                out = out.take_axis(Array::from_int(resolve(i)), axis)?;
            }
            Subscript::Range(start, end) => {
                let (start, end) = (start.map_or(0, resolve), end.map_or(size, resolve));
                if (start, end) != (0, size) {
                    out = slice_axis(&out, axis, start, end.max(start))?;
                }
                axis += 1;
            }
            Subscript::Ellipsis => {}
        }
    }
    Ok(out)
}

/// `x`'s positions `start..end` along `axis`: MLX's slice, a view of `x` that launches no kernel
/// (a gather of the positions would be one, a decoded token's every layer where a model splits a
/// fused product so, as phi3 does), which decoding's kernels can read where it lies
/// (`nn::view_rows`).
fn slice_axis(x: &Array, axis: i32, start: i32, end: i32) -> Result<Array> {
    use mlx_rs::ops::indexing::{ArrayIndex, ArrayIndexOp, TryIndexOp};
    let mut ranges: Vec<ArrayIndexOp> = (0..axis).map(|_| (..).index_op()).collect();
    ranges.push((start..end).index_op());
    Ok(x.try_index(&ranges[..])?)
}

/// How an attention call masks and scales its scores.
#[derive(Clone, Copy, Debug)]
pub struct AttentionOptions<'a> {
    /// Each query sees only itself and earlier keys.
    pub causal: bool,
    /// The factor applied to `q k^T` (`1/sqrt(head_dim)` when `None`).
    pub scale: Option<f32>,
    /// A query sees only keys fewer than `window` positions away.
    pub window: Option<i32>,
    /// An additive bias broadcast against the scores `[B, heads, T_q, T_k]` (ALiBi).
    pub bias: Option<&'a Array>,
    /// The scaled scores are soft-capped to `(-cap, cap)` before the mask and softmax
    /// (Gemma 2's `attn_logit_softcapping`).
    pub softcap: Option<f32>,
}

/// Attention of layer `layer` over `[B, heads, T, head_dim]` queries, keys and values.
///
/// Plain causal attention goes through [`Context::attend`] (a scale other than `1/sqrt(head_dim)`
/// is folded into the queries). Attention with a window, a bias or without the causal mask runs
/// MLX's fused kernel with an explicit mask over every key the queries see: during generation the
/// cached keys and this call's ([`Context::keys_values`]), the queries being the last positions.
/// A bias must then cover those keys: `[.., T_q, T_k]` (see [`alibi`]'s `start`). Soft-capped
/// scores have no fused kernel: that attention is computed in its parts ([`softcapped_attention`]).
pub fn attend(
    ctx: &mut Context,
    layer: usize,
    q: &Array,
    k: &Array,
    v: &Array,
    options: AttentionOptions<'_>,
) -> Result<Array> {
    let head_dim = q.shape()[q.ndim() - 1] as f32;
    let scale = options.scale.unwrap_or(1.0 / head_dim.sqrt());
    if options.causal
        && options.window.is_none()
        && options.bias.is_none()
        && options.softcap.is_none()
    {
        let factor = scale * head_dim.sqrt();
        if (factor - 1.0).abs() <= 1e-6 {
            return ctx.attend(layer, q, k, v);
        }
        return ctx.attend(layer, &q.multiply(literal(f64::from(factor), q)?)?, k, v);
    }
    let (k, v, key_positions) = match options.window {
        Some(window) => ctx.windowed_keys_values(layer, k, v, window)?,
        None => {
            let (k, v) = ctx.keys_values(layer, k, v)?;
            (k, v, None)
        }
    };
    let first = ctx.query_start(q.dim(2), k.dim(2));
    let mut mask = attention_mask(q, &k, &first, key_positions.as_ref(), &options)?;
    // Rows of a batch that start at different slots hide their padding as well (a ring's keys
    // come with their positions, which the mask above went by).
    let padding = match key_positions {
        Some(_) => None,
        None => ctx.padding_mask(q.dim(2), k.dim(2))?,
    };
    if let Some(padding) = padding {
        let minus_inf = Array::from_f32(f32::NEG_INFINITY).as_dtype(q.dtype())?;
        let open = mask.unwrap_or(literal(0.0, q)?);
        mask = Some(ops::select(&padding, &open, &minus_inf)?);
    }
    if let Some(cap) = options.softcap {
        return softcapped_attention(q, &k, &v, scale, cap, mask.as_ref());
    }
    let mask = mask.as_ref().map(ScaledDotProductAttentionMask::Array);
    Ok(fast::scaled_dot_product_attention(
        q, &k, &v, scale, mask, None,
    )?)
}

/// `softmax(softcap(scale q k^T, cap) + mask) v` over `[B, heads, T, head_dim]` inputs, keys and
/// values with fewer heads shared by groups of query heads, the softmax in float32 precision
/// (as transformers' eager attention of Gemma 2 computes it).
pub fn softcapped_attention(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    cap: f32,
    mask: Option<&Array>,
) -> Result<Array> {
    let (b, heads, q_len) = (q.shape()[0], q.shape()[1], q.shape()[2]);
    let kv_heads = k.shape()[1];
    let groups = heads / kv_heads;
    // Query heads `g * groups .. (g + 1) * groups` share key head `g`: a group axis lets the
    // keys broadcast instead of being repeated.
    let q = q.reshape(&[b, kv_heads, groups, q_len, q.shape()[3]])?;
    let (k, v) = (k.expand_dims(2)?, v.expand_dims(2)?);
    let scores = q
        .multiply(literal(f64::from(scale), &q)?)?
        .matmul(&k.swap_axes(-1, -2)?)?;
    let mut scores = softcap(&scores, cap)?;
    if let Some(mask) = mask {
        scores = scores.add(mask)?;
    }
    let weights = ops::softmax_axis(&scores, -1, true)?;
    let out = weights.matmul(&v)?;
    Ok(out.reshape(&[b, heads, q_len, v.shape()[4]])?)
}

/// The additive mask `[T_q, T_k]` (plus the bias) of `options`, `None` when nothing is masked;
/// the queries are at the positions from `first` (an int32 scalar) on, the keys at
/// `key_positions` (`[T_k]`, a negative one hidden) or else at `0 .. T_k`.
fn attention_mask(
    q: &Array,
    k: &Array,
    first: &Array,
    key_positions: Option<&Array>,
    options: &AttentionOptions<'_>,
) -> Result<Option<Array>> {
    let (q_len, k_len) = (q.shape()[2], k.shape()[2]);
    let rows = positions_after(first, q_len)?.reshape(&[q_len, 1])?;
    let cols = match key_positions {
        Some(positions) => positions.reshape(&[1, k_len])?,
        None => Array::arange::<_, i32>(None, k_len, None)?.reshape(&[1, k_len])?,
    };
    let ahead = cols.subtract(&rows)?;
    let mut visible: Option<Array> = None;
    let mut restrict = |condition: Array| -> Result<()> {
        visible = Some(match visible.take() {
            Some(v) => v.logical_and(&condition)?,
            None => condition,
        });
        Ok(())
    };
    if key_positions.is_some() {
        restrict(cols.ge(Array::from_int(0))?)?;
    }
    if options.causal {
        restrict(ahead.le(Array::from_int(0))?)?;
    }
    if let Some(window) = options.window {
        restrict(ahead.gt(Array::from_int(-window))?)?;
        if !options.causal {
            restrict(ahead.lt(Array::from_int(window))?)?;
        }
    }
    let blocked = match visible {
        Some(visible) => {
            let zero = literal(0.0, q)?;
            let minus_inf = Array::from_f32(f32::NEG_INFINITY).as_dtype(q.dtype())?;
            Some(ops::select(&visible, &zero, &minus_inf)?)
        }
        None => None,
    };
    Ok(match (blocked, options.bias) {
        (Some(mask), Some(bias)) => Some(mask.add(bias.as_dtype(q.dtype())?)?),
        (None, Some(bias)) => Some(bias.as_dtype(q.dtype())?),
        (mask, None) => mask,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cap * tanh(x / cap)` against the formula in float64, in float32 and bfloat16, and its
    /// gradient `1 - tanh(x / cap)^2` against a central difference.
    #[test]
    fn softcap_follows_its_formula_and_keeps_the_precision() {
        let values = [-400.0f32, -30.0, -1.5, 0.0, 0.25, 29.0, 1e4];
        let cap = 30.0f32;
        let x = Array::from_slice(&values, &[values.len() as i32]);
        let y = softcap(&x, cap).unwrap();
        assert_eq!(y.dtype(), Dtype::Float32);
        for (got, v) in y.as_slice::<f32>().iter().zip(values) {
            let want = f64::from(cap) * (f64::from(v) / f64::from(cap)).tanh();
            assert!(
                (f64::from(*got) - want).abs() < 1e-4,
                "{v}: {got} against {want}"
            );
            assert!(got.abs() < cap + 1e-3);
        }
        let half = softcap(&x.as_dtype(Dtype::Bfloat16).unwrap(), cap).unwrap();
        assert_eq!(half.dtype(), Dtype::Bfloat16);

        let mut grad =
            mlx_rs::transforms::grad(|x: &Array| softcap(x, cap).unwrap().sum(None).unwrap());
        let g = grad(&x).unwrap();
        let h = 1e-2f64;
        for (got, v) in g.as_slice::<f32>().iter().zip(values) {
            let f = |t: f64| f64::from(cap) * (t / f64::from(cap)).tanh();
            let want = (f(f64::from(v) + h) - f(f64::from(v) - h)) / (2.0 * h);
            assert!(
                (f64::from(*got) - want).abs() < 1e-3,
                "{v}: {got} against {want}"
            );
        }
    }
}
