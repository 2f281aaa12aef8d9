//! Lion (Chen et al., 2023, "Symbolic Discovery of Optimization Algorithms"), as MLX defines it.

use super::{constant, Optimizer, StepScalars};
use crate::error::Result;
use mlx_rs::Array;

/// Lion: `c = b1 m + (1 - b1) g`, `m = b2 m + (1 - b2) g`, `p = p (1 - lr wd) - lr sign(c)`.
///
/// The state is the momentum `m` alone; decoupled weight decay applies to leaves whose mask says
/// so. Lion's updates have unit magnitude per coordinate, so its learning rate is usually 3-10x
/// smaller than AdamW's and its weight decay as much larger.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Lion {
    /// Interpolation between momentum and gradient for the update direction.
    pub beta1: f32,
    /// Decay of the momentum.
    pub beta2: f32,
    /// Decoupled weight decay.
    pub weight_decay: f32,
}

impl Default for Lion {
    fn default() -> Self {
        Lion {
            beta1: 0.9,
            beta2: 0.99,
            weight_decay: 0.0,
        }
    }
}

impl Optimizer for Lion {
    type Leaf = Array;

    fn name(&self) -> &'static str {
        "lion"
    }

    fn elementwise(&self) -> bool {
        true
    }

    fn init(&self, param: &Array) -> Result<Array> {
        Ok(mlx_rs::ops::zeros_like(param)?)
    }

    fn update(
        &self,
        param: &Array,
        grad: &Array,
        m: &Array,
        scalars: StepScalars<'_>,
        decay: bool,
    ) -> Result<(Array, Array)> {
        let lr = scalars.lr.as_dtype(param.dtype())?;
        let mix = |beta: f32| -> Result<Array> {
            Ok(m.multiply(constant(beta, grad)?)?
                .add(grad.multiply(constant(1.0 - beta, grad)?)?)?)
        };
        let direction = mlx_rs::ops::sign(mix(self.beta1)?)?;
        let next_m = mix(self.beta2)?;
        let param = if decay && self.weight_decay != 0.0 {
            let keep = constant(1.0, param)?
                .subtract(lr.multiply(constant(self.weight_decay, param)?)?)?;
            param.multiply(keep)?
        } else {
            param.clone()
        };
        Ok((param.subtract(lr.multiply(direction)?)?, next_m))
    }
}
