//! Adafactor (Shazeer & Stern, 2018, "Adafactor: Adaptive Learning Rates with Sublinear Memory
//! Cost"), as MLX defines it.

use super::{constant, Optimizer, StepScalars};
use crate::arrays::Arrays;
use crate::error::{Error, Result};
use mlx_rs::ops::{maximum, minimum, zeros};
use mlx_rs::Array;

/// Adafactor's second-moment estimate for one parameter.
#[derive(Clone, Debug)]
pub enum SecondMoment {
    /// For parameters of two or more dimensions: running means of the squared gradient over the
    /// last axis (`row`, shape `shape[..-1]`) and over the second-to-last axis (`col`, shape
    /// `shape[..-2] + shape[-1]`).
    Factored {
        /// Row statistics.
        row: Array,
        /// Column statistics.
        col: Array,
    },
    /// For scalars and vectors: the running mean of the squared gradient itself.
    Full(Array),
}

/// Adafactor's state for one parameter.
#[derive(Clone, Debug)]
pub struct AdafactorLeaf {
    /// The second-moment estimate (factored or not by the parameter's rank).
    pub second: SecondMoment,
    /// The first moment of the scaled update, kept only when `beta1` is set.
    pub first: Option<Array>,
}

impl Arrays for AdafactorLeaf {
    fn push_arrays(&self, out: &mut Vec<Array>) {
        match &self.second {
            SecondMoment::Factored { row, col } => {
                out.push(row.clone());
                out.push(col.clone());
            }
            SecondMoment::Full(v) => out.push(v.clone()),
        }
        self.first.push_arrays(out);
    }

    fn rebuild_from(&self, arrays: &mut dyn Iterator<Item = Array>) -> Self {
        let mut next = || arrays.next().expect("the caller checked the array count");
        let second = match &self.second {
            SecondMoment::Factored { .. } => {
                let row = next();
                let col = next();
                SecondMoment::Factored { row, col }
            }
            SecondMoment::Full(_) => SecondMoment::Full(next()),
        };
        let first = self.first.as_ref().map(|_| next());
        AdafactorLeaf { second, first }
    }
}

/// Adafactor, with MLX's defaults and update rule. For the `t`-th update of a parameter `p` with
/// gradient `g`:
///
/// - step size `rho = min(1e-2, 1/sqrt(t))` (`1e-6 t` instead of `1e-2` with `warmup_init`)
///   when `relative_step` is on; otherwise the learning rate the trainer passes in, so that a
///   schedule drives it without retracing. With `relative_step` on the trainer's rate is ignored.
/// - `alpha = max(eps_scale, rms(p)) rho` with `scale_parameter`, else `rho`.
/// - `beta2 = 1 - t^decay_rate`; `u = g² + eps_square`.
/// - Factored (≥ 2 dimensions): `R = beta2 R + (1 - beta2) mean(u, -1)`,
///   `C = beta2 C + (1 - beta2) mean(u, -2)`, `U = g / sqrt((R / mean(R, -1)) ⊗ C)`;
///   otherwise `V = beta2 V + (1 - beta2) u`, `U = g / sqrt(V)`.
/// - `U = alpha U / max(1, rms(U) / clip_threshold)`; with `beta1`, `M = beta1 M + (1 - beta1) U`
///   and `U = M`.
/// - `p = p - wd alpha p - U` (the decay only on leaves whose mask says so).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Adafactor {
    /// Added to the squared gradient (MLX's `eps[0]`).
    pub eps_square: f32,
    /// Lower bound of the parameter scale (MLX's `eps[1]`).
    pub eps_scale: f32,
    /// The update's RMS is clipped to this.
    pub clip_threshold: f32,
    /// Exponent of the second moment's decay, `beta2 = 1 - t^decay_rate`.
    pub decay_rate: f32,
    /// Decay of the first moment; `None` keeps no first moment.
    pub beta1: Option<f32>,
    /// Weight decay, scaled by the step size `alpha`.
    pub weight_decay: f32,
    /// Scale the step size by the parameter's RMS.
    pub scale_parameter: bool,
    /// Use Adafactor's own step size `min(1e-2, 1/sqrt(t))` instead of the trainer's rate.
    pub relative_step: bool,
    /// With `relative_step`, ramp the step size as `1e-6 t` instead of starting at `1e-2`.
    pub warmup_init: bool,
}

impl Default for Adafactor {
    fn default() -> Self {
        Adafactor {
            eps_square: 1e-30,
            eps_scale: 1e-3,
            clip_threshold: 1.0,
            decay_rate: -0.8,
            beta1: None,
            weight_decay: 0.0,
            scale_parameter: true,
            relative_step: true,
            warmup_init: false,
        }
    }
}

/// The root mean square of all elements of `x`.
fn rms(x: &Array) -> Result<Array> {
    Ok(x.square()?.mean(None)?.sqrt()?)
}

/// `beta state + (1 - beta) value`, with `one_minus` = `1 - beta`.
fn ema(state: &Array, value: &Array, beta: &Array, one_minus: &Array) -> Result<Array> {
    Ok(state.multiply(beta)?.add(value.multiply(one_minus)?)?)
}

impl Adafactor {
    /// The step size `alpha` for this update.
    fn step_size(&self, param: &Array, scalars: StepScalars<'_>) -> Result<Array> {
        let rho = if self.relative_step {
            let start = if self.warmup_init {
                scalars.step.multiply(Array::from_f32(1e-6))?
            } else {
                Array::from_f32(1e-2)
            };
            minimum(start, scalars.step.rsqrt()?)?
        } else {
            scalars.lr.clone()
        };
        let rho = rho.as_dtype(param.dtype())?;
        if self.scale_parameter {
            Ok(maximum(constant(self.eps_scale, param)?, rms(param)?)?.multiply(rho)?)
        } else {
            Ok(rho)
        }
    }

    /// The preconditioned gradient `U` and the new second moment.
    fn precondition(
        &self,
        grad: &Array,
        second: &SecondMoment,
        step: &Array,
    ) -> Result<(Array, SecondMoment)> {
        let beta2 = constant(1.0, grad)?.subtract(
            step.power(Array::from_f32(self.decay_rate))?
                .as_dtype(grad.dtype())?,
        )?;
        let one_minus = constant(1.0, grad)?.subtract(&beta2)?;
        let squared = grad.square()?.add(constant(self.eps_square, grad)?)?;
        match second {
            SecondMoment::Factored { row, col } => {
                let row = ema(row, &squared.mean_axis(-1, None)?, &beta2, &one_minus)?;
                let col = ema(col, &squared.mean_axis(-2, None)?, &beta2, &one_minus)?;
                let row_factor = row.divide(row.mean_axis(-1, true)?)?.rsqrt()?;
                let col_factor = col.rsqrt()?;
                let scale = row_factor
                    .expand_dims(-1)?
                    .multiply(col_factor.expand_dims(-2)?)?;
                Ok((scale.multiply(grad)?, SecondMoment::Factored { row, col }))
            }
            SecondMoment::Full(v) => {
                let v = ema(v, &squared, &beta2, &one_minus)?;
                Ok((v.rsqrt()?.multiply(grad)?, SecondMoment::Full(v)))
            }
        }
    }
}

impl Optimizer for Adafactor {
    type Leaf = AdafactorLeaf;

    fn name(&self) -> &'static str {
        "adafactor"
    }

    fn init(&self, param: &Array) -> Result<AdafactorLeaf> {
        let shape = param.shape();
        let second = if shape.len() >= 2 {
            let row = zeros::<f32>(&shape[..shape.len() - 1])?.as_dtype(param.dtype())?;
            let mut col_shape = shape[..shape.len() - 2].to_vec();
            col_shape.push(shape[shape.len() - 1]);
            let col = zeros::<f32>(&col_shape)?.as_dtype(param.dtype())?;
            SecondMoment::Factored { row, col }
        } else {
            SecondMoment::Full(mlx_rs::ops::zeros_like(param)?)
        };
        let first = match self.beta1 {
            Some(_) => Some(mlx_rs::ops::zeros_like(param)?),
            None => None,
        };
        Ok(AdafactorLeaf { second, first })
    }

    fn update(
        &self,
        param: &Array,
        grad: &Array,
        state: &AdafactorLeaf,
        scalars: StepScalars<'_>,
        decay: bool,
    ) -> Result<(Array, AdafactorLeaf)> {
        let alpha = self.step_size(param, scalars)?;
        let (update, second) = self.precondition(grad, &state.second, scalars.step)?;
        let clip = maximum(
            constant(1.0, grad)?,
            rms(&update)?.divide(constant(self.clip_threshold, grad)?)?,
        )?;
        let update = alpha.multiply(update.divide(clip)?)?;
        let (update, first) = match (self.beta1, &state.first) {
            (Some(beta1), Some(m)) => {
                let m = ema(
                    m,
                    &update,
                    &constant(beta1, grad)?,
                    &constant(1.0 - beta1, grad)?,
                )?;
                (m.clone(), Some(m))
            }
            (None, None) => (update, None),
            _ => {
                return Err(Error::Layout(
                    "Adafactor's first moment does not match its beta1 setting".into(),
                ))
            }
        };
        let param = if decay && self.weight_decay != 0.0 {
            param.subtract(param.multiply(alpha.multiply(constant(self.weight_decay, param)?)?)?)?
        } else {
            param.clone()
        };
        Ok((param.subtract(update)?, AdafactorLeaf { second, first }))
    }
}
