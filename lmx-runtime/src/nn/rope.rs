//! Rotary position embeddings: plain, and with scaled frequencies: linear position scaling
//! (Gemma 3's global layers), Llama 3's smooth per-frequency scaling, and YaRN (Peng et al., 2023).
//!
//! Each scaled variant computes its per-pair periods `1 / inv_freq` on the host, exactly as
//! transformers' `ROPE_INIT_FUNCTIONS` compute `inv_freq`. The periods depend on static settings
//! only, so a compiled step holds them as a constant. The position offset is an int32 array (one
//! value, or one per row): a traced decode step reads it as an input instead of freezing one
//! value. On a CUDA GPU the rotation is lmx's kernel ([`crate::cuda`]), with its gradient the
//! rotation back; elsewhere MLX's fused kernel (`fast::rope_dynamic`, whose `freqs` are periods).
//! In decoding on CUDA, attention may rotate a rotated query itself as it reads it (`deferred`).

use super::custom_vjp::{self, WithGradient};
use super::deferred;
use super::resident;
use crate::cuda;
use crate::error::{Error, Result};
use mlx_rs::{fast, ops, Array};

/// The rotated width: `dims` when given, else the whole last axis of `x`.
fn rotated(x: &Array, dims: Option<i32>) -> i32 {
    dims.unwrap_or(x.shape()[x.ndim() - 1])
}

/// The standard periods `base^(2i / dims)`, `i` in `0 .. dims / 2`.
fn periods(dims: i32, base: f64) -> Vec<f64> {
    (0..dims / 2)
        .map(|i| base.powf(2.0 * f64::from(i) / f64::from(dims)))
        .collect()
}

/// How fast each pair of a rotation turns with the position.
enum Rates<'a> {
    /// `scale / base^(2i / dims)`.
    Base { base: f32, scale: f32 },
    /// `1 / periods[i]`.
    Periods(&'a [f64]),
}

impl Rates<'_> {
    /// Each pair's angle per position, in float32, in device memory (every launch of the
    /// rotation and of decode attention reads it).
    fn per_pair(&self, dims: i32) -> Result<Array> {
        let rates: Vec<f32> = match self {
            Rates::Base { base, scale } => periods(dims, f64::from(*base))
                .iter()
                .map(|period| (f64::from(*scale) / period) as f32)
                .collect(),
            Rates::Periods(periods) => periods.iter().map(|period| (1.0 / period) as f32).collect(),
        };
        resident::device_constant(&rates)
    }
}

/// The rotation through lmx's CUDA kernel, its gradient the rotation back.
#[derive(Clone, PartialEq)]
struct Rotation;

impl WithGradient for Rotation {
    const NAME: &'static str = "RoPE";

    /// `inputs`: `x`, the offset and each pair's rate.
    fn forward(&self, inputs: &[Array]) -> Result<Vec<Array>> {
        let [x, offset, rates] = inputs else {
            return Err(arity(inputs.len()));
        };
        Ok(vec![cuda::rope(x, offset, rates, true)?])
    }

    /// A rotation's transpose turns the other way; the offset and the rates get zeros.
    fn vjp(&self, primals: &[Array], cotangents: &[Array]) -> Result<Vec<Array>> {
        let ([x, offset, rates], Some(dy)) = (primals, cotangents.first()) else {
            return Err(arity(primals.len()));
        };
        let dx = cuda::rope(&dy.as_dtype(x.dtype())?, offset, rates, false)?;
        Ok(vec![dx, ops::zeros_like(offset)?, ops::zeros_like(rates)?])
    }
}

fn arity(count: usize) -> Error {
    Error::Layout(format!(
        "RoPE takes [x, offset, rates] and one cotangent, got {count} arrays"
    ))
}

/// The first `dims` features of `x` (`[B, heads, T, head_dim]`) rotated pair by pair, the
/// non-traditional half-split layout of LLaMA's HF weights: feature `i` with `i + dims / 2`.
fn rotate(x: &Array, dims: i32, rates: Rates, offset: &Array) -> Result<Array> {
    if cuda::available() && cuda::rope_fits(x, dims, offset) {
        let inputs = [x.clone(), offset.clone(), rates.per_pair(dims)?];
        let y = custom_vjp::apply(&Rotation, &inputs)?
            .pop()
            .ok_or_else(|| Error::Layout("RoPE returned nothing".into()))?;
        deferred::remember_rope(&y, x, offset, &inputs[2]);
        return Ok(y);
    }
    Ok(match rates {
        Rates::Base { base, scale } => {
            fast::rope_dynamic(x, dims, false, base, scale, offset, None)?
        }
        Rates::Periods(periods) => {
            let freqs: Vec<f32> = periods.iter().map(|&p| p as f32).collect();
            let freqs = Array::from_slice(&freqs, &[freqs.len() as i32]);
            fast::rope_dynamic(x, dims, false, None, 1.0, offset, &freqs)?
        }
    })
}

/// Rotary position embedding of the first `dims` features of `[B, heads, T, head_dim]`, positions
/// starting at `offset` (an int32 scalar, or one per row). The offset is an array so that a
/// traced decode step does not depend on its value.
pub fn rope(x: &Array, dims: i32, base: f32, offset: &Array) -> Result<Array> {
    rotate(x, dims, Rates::Base { base, scale: 1.0 }, offset)
}

/// RoPE of the first `dims` features (all when `None`) with positions divided by `factor`
/// (transformers' `"linear"` rope type; `factor = 1` is plain RoPE).
pub fn rope_linear(
    x: &Array,
    dims: Option<i32>,
    base: f32,
    factor: f32,
    offset: &Array,
) -> Result<Array> {
    let dims = rotated(x, dims);
    let scale = 1.0 / factor;
    rotate(x, dims, Rates::Base { base, scale }, offset)
}

/// Llama 3's frequency scaling (`rope_type: "llama3"`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Llama3Scaling {
    /// How much longer the extended context is (`factor`).
    pub factor: f64,
    /// Wavelengths above `original_ctx / low_freq_factor` are interpolated by `factor`.
    pub low_freq_factor: f64,
    /// Wavelengths below `original_ctx / high_freq_factor` are kept.
    pub high_freq_factor: f64,
    /// The context the model was first trained at (`original_max_position_embeddings`).
    pub original_ctx: f64,
}

/// The periods of Llama 3's scaled RoPE (transformers' `_compute_llama3_parameters`).
pub fn llama3_periods(dims: i32, base: f64, s: Llama3Scaling) -> Vec<f64> {
    let low_wavelen = s.original_ctx / s.low_freq_factor;
    let high_wavelen = s.original_ctx / s.high_freq_factor;
    periods(dims, base)
        .into_iter()
        .map(|period| {
            let inv_freq = 1.0 / period;
            let wavelen = 2.0 * std::f64::consts::PI / inv_freq;
            let scaled = if wavelen > low_wavelen {
                inv_freq / s.factor
            } else {
                inv_freq
            };
            let medium = (high_wavelen..=low_wavelen).contains(&wavelen);
            let inv_freq = if medium {
                let smooth = (s.original_ctx / wavelen - s.low_freq_factor)
                    / (s.high_freq_factor - s.low_freq_factor);
                (1.0 - smooth) * scaled / s.factor + smooth * scaled
            } else {
                scaled
            };
            1.0 / inv_freq
        })
        .collect()
}

/// RoPE with Llama 3's scaled frequencies over the first `dims` features (all when `None`).
pub fn rope_llama3(
    x: &Array,
    dims: Option<i32>,
    base: f32,
    scaling: Llama3Scaling,
    offset: &Array,
) -> Result<Array> {
    let dims = rotated(x, dims);
    let periods = llama3_periods(dims, f64::from(base), scaling);
    rotate(x, dims, Rates::Periods(&periods), offset)
}

/// YaRN's frequency scaling (`rope_type: "yarn"`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct YarnScaling {
    /// How much longer the extended context is (`factor`).
    pub factor: f64,
    /// The context the model was first trained at (`original_max_position_embeddings`).
    pub original_ctx: f64,
    /// Pairs turning more than `beta_fast` times over the original context are kept.
    pub beta_fast: f64,
    /// Pairs turning fewer than `beta_slow` times are interpolated by `factor`.
    pub beta_slow: f64,
    /// `mscale` of DeepSeek's variant (with `mscale_all_dim`); 1 otherwise.
    pub mscale: f64,
    /// `mscale_all_dim` of DeepSeek's variant; 0 (unset) otherwise.
    pub mscale_all_dim: f64,
}

/// `0.1 * mscale * ln(factor) + 1` above a factor of 1 (transformers' `get_mscale`).
fn yarn_mscale(factor: f64, mscale: f64) -> f64 {
    if factor <= 1.0 {
        1.0
    } else {
        0.1 * mscale * factor.ln() + 1.0
    }
}

impl YarnScaling {
    /// The factor applied to the rotated features (transformers' `attention_factor`, which
    /// multiplies `cos` and `sin`).
    pub fn attention_factor(&self) -> f64 {
        if self.mscale != 0.0 && self.mscale_all_dim != 0.0 {
            yarn_mscale(self.factor, self.mscale) / yarn_mscale(self.factor, self.mscale_all_dim)
        } else {
            yarn_mscale(self.factor, 1.0)
        }
    }

    /// The periods of YaRN over `dims` rotated features (transformers'
    /// `_compute_yarn_parameters`, with its default truncation of the ramp's ends).
    pub fn periods(&self, dims: i32, base: f64) -> Vec<f64> {
        let d = f64::from(dims);
        let correction = |rotations: f64| {
            d * (self.original_ctx / (rotations * 2.0 * std::f64::consts::PI)).ln()
                / (2.0 * base.ln())
        };
        let low = correction(self.beta_fast).floor().max(0.0);
        let mut high = correction(self.beta_slow).ceil().min(d - 1.0);
        if low == high {
            high += 0.001;
        }
        periods(dims, base)
            .into_iter()
            .enumerate()
            .map(|(i, period)| {
                let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                let extrapolation = 1.0 - ramp;
                let inv_freq = (1.0 / (self.factor * period)) * (1.0 - extrapolation)
                    + (1.0 / period) * extrapolation;
                1.0 / inv_freq
            })
            .collect()
    }
}

/// RoPE with YaRN's scaled frequencies over the first `dims` features (all when `None`), the
/// rotated features multiplied by its attention factor.
pub fn rope_yarn(
    x: &Array,
    dims: Option<i32>,
    base: f32,
    scaling: YarnScaling,
    offset: &Array,
) -> Result<Array> {
    let width = x.shape()[x.ndim() - 1];
    let dims = rotated(x, dims);
    let factor = scaling.attention_factor();
    let x = if (factor - 1.0).abs() < 1e-12 {
        x.clone()
    } else if dims == width {
        x.multiply(super::literal(factor, x)?)?
    } else {
        let [head, tail] = [
            super::index(x, &rotary_part(0, dims))?,
            super::index(x, &rotary_part(dims, width))?,
        ];
        mlx_rs::ops::concatenate(&[head.multiply(super::literal(factor, x)?)?, tail], -1)?
    };
    let periods = scaling.periods(dims, f64::from(base));
    rotate(&x, dims, Rates::Periods(&periods), offset)
}

/// `[..., start:end]`.
fn rotary_part(start: i32, end: i32) -> [super::Subscript; 2] {
    [
        super::Subscript::Ellipsis,
        super::Subscript::Range(Some(start), Some(end)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::nn::without_gradients;
    use mlx_rs::error::Exception;
    use mlx_rs::transforms::{compile::compile, value_and_grad_with_argnums};
    use mlx_rs::Dtype;

    /// `x` (`[B, H, T, D]`, row-major) rotated in float64 on the host: pair `i` (features `i` and
    /// `i + D / 2`) at position `t + offsets[b]` by that times `rates[i]`, back when `sign` is -1.
    fn rotated_f64(
        x: &[f64],
        shape: [usize; 4],
        offsets: &[i32],
        rates: &[f64],
        sign: f64,
    ) -> Vec<f64> {
        let [rows, heads, length, width] = shape;
        let half = width / 2;
        let mut y = vec![0.0; x.len()];
        for b in 0..rows {
            let offset = offsets[if offsets.len() == 1 { 0 } else { b }];
            for h in 0..heads {
                for t in 0..length {
                    let row = ((b * heads + h) * length + t) * width;
                    for i in 0..half {
                        let angle = sign * (t as f64 + f64::from(offset)) * rates[i];
                        let (s, c) = angle.sin_cos();
                        let (a, e) = (x[row + i], x[row + i + half]);
                        y[row + i] = a * c - e * s;
                        y[row + i + half] = a * s + e * c;
                    }
                }
            }
        }
        y
    }

    fn values_f64(a: &Array) -> Vec<f64> {
        // A flat copy: `as_slice` reads only row-contiguous arrays, not a transposed view.
        let a = a.as_dtype(Dtype::Float32).unwrap().reshape(&[-1]).unwrap();
        a.as_slice::<f32>().iter().map(|&v| f64::from(v)).collect()
    }

    /// Largest gap relative to the larger of 1 and the expected value.
    fn gap(got: &[f64], want: &[f64]) -> f64 {
        assert_eq!(got.len(), want.len());
        got.iter()
            .zip(want)
            .map(|(g, w)| (g - w).abs() / w.abs().max(1.0))
            .fold(0.0, f64::max)
    }

    /// How far a rotation may be from float64, relative to the larger of 1 and the expected
    /// value: in bfloat16 lmx's kernel rounds once from float32 (half a unit in the last place,
    /// 2^-8 relative); MLX's CPU kernel rounds the sines and cosines to bfloat16 first.
    fn tolerance(dtype: Dtype) -> f64 {
        match dtype {
            Dtype::Float32 => 2e-5,
            _ if cuda::available() => 4.5e-3,
            _ => 2e-2,
        }
    }

    /// Plain, linear, Llama 3 and YaRN rotations against float64 on the host: a contiguous input,
    /// the model's transposed view of `[B, T, H, D]`, an input read with a stride along its
    /// features, one whose first value is not 16-byte aligned, head counts that do and do not fill
    /// a thread's heads, one offset and one per row, float32 and bfloat16. On a CUDA GPU this is
    /// lmx's kernel (tests/gpu.sh), elsewhere MLX's.
    #[test]
    fn rotations_match_float64() -> Result<()> {
        let llama3 = Llama3Scaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_ctx: 16.0,
        };
        let yarn = YarnScaling {
            factor: 4.0,
            original_ctx: 16.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            mscale: 1.0,
            mscale_all_dim: 0.0,
        };
        for dtype in [Dtype::Float32, Dtype::Bfloat16] {
            for (case, [rows, heads, length, width]) in [[2, 3, 5, 8], [2, 8, 6, 16], [1, 5, 7, 12]]
                .into_iter()
                .enumerate()
            {
                let key = mlx_rs::random::key(case as u64)?;
                let normal = |shape: &[i32]| -> Result<Array> {
                    Ok(mlx_rs::random::normal::<f32>(shape, None, None, &key)?.as_dtype(dtype)?)
                };
                let size = rows * heads * length * width;
                // Four layouts of logical [B, H, T, D] values, made in `dtype` so that no cast
                // makes them contiguous.
                let layouts: [Array; 4] = [
                    normal(&[rows, heads, length, width])?,
                    normal(&[rows, length, heads, width])?.transpose_axes(&[0, 2, 1, 3])?,
                    normal(&[rows, heads, width, length])?.transpose_axes(&[0, 1, 3, 2])?,
                    super::super::index(
                        &normal(&[size + 1])?,
                        &[super::super::Subscript::Range(Some(1), None)],
                    )?
                    .reshape(&[rows, heads, length, width])?,
                ];
                for (layout, x) in layouts.iter().enumerate() {
                    let exact = values_f64(x);
                    let shape = [rows, heads, length, width].map(|n| n as usize);
                    let check = |got: Array, want: Vec<f64>, what: &str| {
                        assert_eq!(got.dtype(), dtype);
                        assert!(
                            gap(&values_f64(&got), &want) < tolerance(dtype),
                            "{dtype:?} case {case} layout {layout} {what}"
                        );
                    };
                    let rates_of = |periods: Vec<f64>| -> Vec<f64> {
                        periods.iter().map(|p| 1.0 / p).collect()
                    };
                    let plain = rates_of(periods(width, 10000.0));
                    let per_row = Array::from_slice(&[3, 40][..rows as usize], &[rows]);
                    check(
                        rope(x, width, 10000.0, &per_row)?,
                        rotated_f64(&exact, shape, &[3, 40], &plain, 1.0),
                        "plain",
                    );
                    let quarter: Vec<f64> = plain.iter().map(|r| r / 4.0).collect();
                    check(
                        rope_linear(x, None, 10000.0, 4.0, &Array::from_int(9))?,
                        rotated_f64(&exact, shape, &[9], &quarter, 1.0),
                        "linear",
                    );
                    check(
                        rope_llama3(x, None, 500000.0, llama3, &Array::from_int(2))?,
                        rotated_f64(
                            &exact,
                            shape,
                            &[2],
                            &rates_of(llama3_periods(width, 500000.0, llama3)),
                            1.0,
                        ),
                        "llama3",
                    );
                    // The attention factor scales the input in its own dtype before the
                    // rotation, as mlx-lm's YaRN does: the rotation is checked from there.
                    let factor = yarn.attention_factor();
                    let scaled = values_f64(&x.multiply(super::super::literal(factor, x)?)?);
                    check(
                        rope_yarn(x, None, 10000.0, yarn, &Array::from_int(5))?,
                        rotated_f64(
                            &scaled,
                            shape,
                            &[5],
                            &rates_of(yarn.periods(width, 10000.0)),
                            1.0,
                        ),
                        "yarn",
                    );
                }
            }
        }
        assert!(!cuda::available() || custom_vjp::is_made(&Rotation));
        Ok(())
    }

    /// The gradient of `sum(rope(x) * r)` is `r` rotated back, in float32 and bfloat16, eagerly
    /// and inside a compiled function, with the model's transposed layout; without gradients the
    /// value is the same.
    #[test]
    fn the_gradient_is_the_rotation_back() -> Result<()> {
        let [rows, heads, length, width] = [2, 6, 5, 16];
        let shape = [rows, heads, length, width].map(|n| n as usize);
        let rates: Vec<f64> = periods(width, 10000.0).iter().map(|p| 1.0 / p).collect();
        let offsets = Array::from_slice(&[1, 17], &[2]);
        for dtype in [Dtype::Float32, Dtype::Bfloat16] {
            let key = mlx_rs::random::key(11)?;
            let x = mlx_rs::random::normal::<f32>(&[rows, length, heads, width], None, None, &key)?
                .as_dtype(dtype)?
                .transpose_axes(&[0, 2, 1, 3])?;
            let r = mlx_rs::random::normal::<f32>(&[rows, heads, length, width], None, None, None)?
                .as_dtype(dtype)?;
            let objective = |args: &[Array]| -> std::result::Result<Vec<Array>, Exception> {
                let y = rope(&args[0], 16, 10000.0, &args[2]).map_err(Error::into_exception)?;
                Ok(vec![y.multiply(&args[1])?.sum(false)?, y])
            };
            let args = [x.clone(), r.clone(), offsets.clone()];
            let (values, grads) = value_and_grad_with_argnums(objective, &[0])(&args)?;
            let want = rotated_f64(&values_f64(&r), shape, &[1, 17], &rates, -1.0);
            assert_eq!(grads[0].dtype(), dtype);
            assert!(
                gap(&values_f64(&grads[0]), &want) < tolerance(dtype),
                "{dtype:?}"
            );
            let forward = rotated_f64(&values_f64(&x), shape, &[1, 17], &rates, 1.0);
            assert!(
                gap(&values_f64(&values[1]), &forward) < tolerance(dtype),
                "{dtype:?}"
            );

            let in_compiled = move |args: &[Array]| -> std::result::Result<Vec<Array>, Exception> {
                Ok(value_and_grad_with_argnums(objective, &[0])(args)?.1)
            };
            let compiled = compile(in_compiled, false)(&args)?;
            assert!(
                gap(&values_f64(&compiled[0]), &want) < tolerance(dtype),
                "{dtype:?}"
            );
            let free = without_gradients(|| rope(&x, 16, 10000.0, &offsets))?;
            assert!(
                gap(&values_f64(&free), &forward) < tolerance(dtype),
                "{dtype:?}"
            );
        }
        assert!(!cuda::available() || custom_vjp::is_made(&Rotation));
        Ok(())
    }

    /// Relative agreement: transformers computes its `inv_freq` in float32.
    fn assert_close(got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() <= 1e-6 * w.abs(), "{got:?} against {want:?}");
        }
    }

    /// Against transformers' `_compute_llama3_parameters` for 16 features, base 500000, factor
    /// 8, bands 1 and 4 over 8192 positions (`1 / inv_freq`): kept, smoothed and interpolated.
    #[test]
    fn llama3_periods_match_transformers() {
        let scaling = Llama3Scaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_ctx: 8192.0,
        };
        let want = [
            1.0,
            5.156692334,
            26.59147965,
            137.1240815,
            1905.320719,
            29170.6576,
            150424.1283,
            775690.9888,
        ];
        assert_close(&llama3_periods(16, 500000.0, scaling), &want);
    }

    /// Against transformers' `_compute_yarn_parameters` for 16 features, base 10000, factor 4
    /// over 4096 positions; its attention factor `0.1 ln 4 + 1`, and 1 for DeepSeek's equal
    /// `mscale` and `mscale_all_dim`.
    #[test]
    fn yarn_periods_and_attention_factor_match_transformers() {
        let scaling = YarnScaling {
            factor: 4.0,
            original_ctx: 4096.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            mscale: 1.0,
            mscale_all_dim: 0.0,
        };
        let want = [
            1.0,
            3.162277681,
            9.999999851,
            38.92034041,
            160.0000095,
            722.8062761,
            3999.99981,
            12649.10983,
        ];
        assert_close(&scaling.periods(16, 10000.0), &want);
        assert!((scaling.attention_factor() - 1.138629436111989).abs() < 1e-12);
        let deepseek = YarnScaling {
            factor: 40.0,
            mscale: 0.707,
            mscale_all_dim: 0.707,
            ..scaling
        };
        assert_eq!(deepseek.attention_factor(), 1.0);
    }

    /// Linear scaling by `f` rotates position `p` as plain RoPE rotates `p / f`; YaRN's partial
    /// form scales the rotated features only and leaves the rest as they were.
    #[test]
    fn linear_scaling_divides_positions_and_partial_yarn_keeps_the_tail() -> Result<()> {
        let key = mlx_rs::random::key(3)?;
        let x = mlx_rs::random::normal::<f32>(&[1, 2, 1, 8], None, None, &key)?;
        let scaled = rope_linear(&x, None, 10000.0, 4.0, &Array::from_int(12))?;
        let plain = rope(&x, 8, 10000.0, &Array::from_int(3))?;
        let gap = scaled
            .subtract(&plain)?
            .abs()?
            .max(None)?
            .item_exact::<f32>();
        assert!(gap < 1e-5, "{gap}");

        let scaling = YarnScaling {
            factor: 4.0,
            original_ctx: 4096.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            mscale: 1.0,
            mscale_all_dim: 0.0,
        };
        let y = rope_yarn(&x, Some(4), 10000.0, scaling, &Array::from_int(0))?;
        let tail = |a: &Array| super::super::index(a, &rotary_part(4, 8));
        assert!(tail(&y)?.eq_values(&tail(&x)?)?);
        // At position 0 nothing turns: the rotated features are only scaled.
        let head = |a: &Array| super::super::index(a, &rotary_part(0, 4));
        let factor = scaling.attention_factor() as f32;
        let want = head(&x)?.multiply(Array::from_f32(factor))?;
        let gap = head(&y)?
            .subtract(&want)?
            .abs()?
            .max(None)?
            .item_exact::<f32>();
        assert!(gap < 1e-6, "{gap}");
        Ok(())
    }
}
