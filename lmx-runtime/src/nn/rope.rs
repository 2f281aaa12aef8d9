//! Rotary position embeddings with scaled frequencies: linear position scaling (Gemma 3's global
//! layers), Llama 3's smooth per-frequency scaling, and YaRN (Peng et al., 2023).
//!
//! Each variant computes its per-pair periods `1 / inv_freq` on the host, exactly as
//! transformers' `ROPE_INIT_FUNCTIONS` compute `inv_freq`, and hands them to MLX's fused kernel
//! (its `freqs` are periods: the angle of pair `i` at position `p` is `p / freqs[i]`). The
//! periods depend on static settings only, so a compiled step holds them as a constant. The
//! position offset is an int32 scalar array (`fast::rope_dynamic`): a traced decode step reads
//! it as an input instead of freezing one value.

use crate::error::Result;
use mlx_rs::{fast, Array};

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

/// RoPE with MLX's fused kernel over the given periods.
fn rope_periods(x: &Array, dims: i32, periods: &[f64], offset: &Array) -> Result<Array> {
    let freqs: Vec<f32> = periods.iter().map(|&p| p as f32).collect();
    let freqs = Array::from_slice(&freqs, &[freqs.len() as i32]);
    Ok(fast::rope_dynamic(
        x, dims, false, None, 1.0, offset, &freqs,
    )?)
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
    Ok(fast::rope_dynamic(
        x,
        dims,
        false,
        base,
        1.0 / factor,
        offset,
        None,
    )?)
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
    rope_periods(
        x,
        dims,
        &llama3_periods(dims, f64::from(base), scaling),
        offset,
    )
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
    rope_periods(&x, dims, &periods, offset)
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
        let plain = super::super::rope(&x, 8, 10000.0, &Array::from_int(3))?;
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
