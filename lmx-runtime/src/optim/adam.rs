//! Adam and AdamW (decoupled weight decay), as MLX defines them.

use super::{constant, Optimizer, StepScalars};
use crate::arrays::Arrays;
use crate::error::Result;
use mlx_rs::Array;

/// Adam's state for one parameter: the first and second moments.
#[derive(Clone, Debug)]
pub struct AdamLeaf {
    /// Running mean of gradients.
    pub m: Array,
    /// Running mean of squared gradients.
    pub v: Array,
}

impl Arrays for AdamLeaf {
    fn push_arrays(&self, out: &mut Vec<Array>) {
        out.push(self.m.clone());
        out.push(self.v.clone());
    }

    fn rebuild_from(&self, arrays: &mut dyn Iterator<Item = Array>) -> Self {
        let m = arrays.next().expect("the caller checked the array count");
        let v = arrays.next().expect("the caller checked the array count");
        AdamLeaf { m, v }
    }

    fn array_count(&self) -> usize {
        2
    }
}

/// Adam: `m = b1 m + (1-b1) g`, `v = b2 v + (1-b2) g²`, `p -= lr m̂ / (sqrt(v̂) + eps)`.
///
/// With `bias_correction` off (MLX's default, and lmx's), `m̂ = m` and `v̂ = v`; with it on,
/// `m̂ = m / (1 - b1^t)` and `v̂ = v / (1 - b2^t)` as in PyTorch.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Adam {
    /// Decay of the first moment.
    pub beta1: f32,
    /// Decay of the second moment.
    pub beta2: f32,
    /// Added to the denominator.
    pub eps: f32,
    /// Whether the moments are divided by `1 - beta^t`.
    pub bias_correction: bool,
}

impl Default for Adam {
    fn default() -> Self {
        Adam {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            bias_correction: false,
        }
    }
}

impl Adam {
    /// The Adam direction for one parameter and the new moments.
    fn direction(&self, grad: &Array, state: &AdamLeaf, step: &Array) -> Result<(Array, AdamLeaf)> {
        let (b1, b2) = (constant(self.beta1, grad)?, constant(self.beta2, grad)?);
        let m = state
            .m
            .multiply(&b1)?
            .add(grad.multiply(constant(1.0 - self.beta1, grad)?)?)?;
        let v = state
            .v
            .multiply(&b2)?
            .add(grad.square()?.multiply(constant(1.0 - self.beta2, grad)?)?)?;
        let (m_hat, v_hat) = if self.bias_correction {
            let one = Array::from_f32(1.0);
            let c1 = one.subtract(Array::from_f32(self.beta1).power(step)?)?;
            let c2 = one.subtract(Array::from_f32(self.beta2).power(step)?)?;
            (
                m.divide(c1.as_dtype(m.dtype())?)?,
                v.divide(c2.as_dtype(v.dtype())?)?,
            )
        } else {
            (m.clone(), v.clone())
        };
        let direction = m_hat.divide(v_hat.sqrt()?.add(constant(self.eps, grad)?)?)?;
        Ok((direction, AdamLeaf { m, v }))
    }
}

fn zeros_like(param: &Array) -> Result<Array> {
    Ok(mlx_rs::ops::zeros_like(param)?)
}

impl Optimizer for Adam {
    type Leaf = AdamLeaf;

    fn name(&self) -> &'static str {
        "adam"
    }

    fn elementwise(&self) -> bool {
        true
    }

    fn init(&self, param: &Array) -> Result<AdamLeaf> {
        Ok(AdamLeaf {
            m: zeros_like(param)?,
            v: zeros_like(param)?,
        })
    }

    fn update(
        &self,
        param: &Array,
        grad: &Array,
        state: &AdamLeaf,
        scalars: StepScalars<'_>,
        _decay: bool,
    ) -> Result<(Array, AdamLeaf)> {
        let (direction, state) = self.direction(grad, state, scalars.step)?;
        let lr = scalars.lr.as_dtype(param.dtype())?;
        Ok((param.subtract(lr.multiply(direction)?)?, state))
    }
}

/// AdamW: Adam with decoupled weight decay, `p = p (1 - lr wd) - lr m̂ / (sqrt(v̂) + eps)`,
/// the decay applied only to leaves whose mask says so.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AdamW {
    /// The Adam part.
    #[serde(flatten)]
    pub adam: Adam,
    /// Decoupled weight decay.
    pub weight_decay: f32,
}

impl Default for AdamW {
    fn default() -> Self {
        AdamW {
            adam: Adam::default(),
            weight_decay: 0.01,
        }
    }
}

impl Optimizer for AdamW {
    type Leaf = AdamLeaf;

    fn name(&self) -> &'static str {
        "adamw"
    }

    fn elementwise(&self) -> bool {
        true
    }

    fn init(&self, param: &Array) -> Result<AdamLeaf> {
        self.adam.init(param)
    }

    fn update(
        &self,
        param: &Array,
        grad: &Array,
        state: &AdamLeaf,
        scalars: StepScalars<'_>,
        decay: bool,
    ) -> Result<(Array, AdamLeaf)> {
        let lr = scalars.lr.as_dtype(param.dtype())?;
        let decayed = if decay && self.weight_decay != 0.0 {
            let keep = constant(1.0, param)?
                .subtract(lr.multiply(constant(self.weight_decay, param)?)?)?;
            param.multiply(keep)?
        } else {
            param.clone()
        };
        let (direction, state) = self.adam.direction(grad, state, scalars.step)?;
        Ok((decayed.subtract(lr.multiply(direction)?)?, state))
    }
}
