//! Stochastic gradient descent with momentum, dampening, Nesterov momentum and weight decay, as
//! MLX defines it.

use super::{constant, Optimizer, StepScalars};
use crate::arrays::Arrays;
use crate::error::{Error, Result};
use mlx_rs::Array;

/// SGD's state for one parameter: the velocity, kept only when momentum is on.
#[derive(Clone, Debug)]
pub struct SgdLeaf {
    /// The momentum buffer (`None` without momentum).
    pub velocity: Option<Array>,
}

impl Arrays for SgdLeaf {
    fn push_arrays(&self, out: &mut Vec<Array>) {
        self.velocity.push_arrays(out);
    }

    fn rebuild_from(&self, arrays: &mut dyn Iterator<Item = Array>) -> Self {
        SgdLeaf {
            velocity: self.velocity.rebuild_from(arrays),
        }
    }
}

/// SGD: `g' = g + wd p` (coupled weight decay, on leaves whose mask says so),
/// `v = momentum v + (1 - dampening) g'`, `p -= lr (g' + momentum v)` with Nesterov momentum and
/// `p -= lr v` without; with `momentum = 0`, `p -= lr g'` and no state is kept.
///
/// The velocity starts at zero, so with dampening 0 the first step's velocity is the gradient,
/// as in PyTorch.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Sgd {
    /// Momentum factor (0 turns momentum off).
    pub momentum: f32,
    /// Dampening of the gradient added to the velocity.
    pub dampening: f32,
    /// Nesterov momentum (needs `momentum > 0` and `dampening = 0`).
    pub nesterov: bool,
    /// L2 penalty added to the gradient.
    pub weight_decay: f32,
}

impl Default for Sgd {
    fn default() -> Self {
        Sgd {
            momentum: 0.0,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        }
    }
}

impl Sgd {
    /// Checks that the settings make sense together.
    pub fn validate(&self) -> Result<()> {
        if self.nesterov && (self.momentum <= 0.0 || self.dampening != 0.0) {
            return Err(Error::Config(
                "SGD with Nesterov momentum needs momentum > 0 and dampening 0".into(),
            ));
        }
        Ok(())
    }
}

impl Optimizer for Sgd {
    type Leaf = SgdLeaf;

    fn name(&self) -> &'static str {
        "sgd"
    }

    fn elementwise(&self) -> bool {
        true
    }

    fn init(&self, param: &Array) -> Result<SgdLeaf> {
        self.validate()?;
        let velocity = if self.momentum > 0.0 {
            Some(mlx_rs::ops::zeros_like(param)?)
        } else {
            None
        };
        Ok(SgdLeaf { velocity })
    }

    fn update(
        &self,
        param: &Array,
        grad: &Array,
        state: &SgdLeaf,
        scalars: StepScalars<'_>,
        decay: bool,
    ) -> Result<(Array, SgdLeaf)> {
        let lr = scalars.lr.as_dtype(param.dtype())?;
        let grad = if decay && self.weight_decay != 0.0 {
            grad.add(param.multiply(constant(self.weight_decay, param)?)?)?
        } else {
            grad.clone()
        };
        let Some(velocity) = &state.velocity else {
            return Ok((param.subtract(lr.multiply(&grad)?)?, state.clone()));
        };
        let momentum = constant(self.momentum, param)?;
        let added = if self.dampening != 0.0 {
            grad.multiply(constant(1.0 - self.dampening, param)?)?
        } else {
            grad.clone()
        };
        let velocity = velocity.multiply(&momentum)?.add(added)?;
        let direction = if self.nesterov {
            grad.add(velocity.multiply(&momentum)?)?
        } else {
            velocity.clone()
        };
        let param = param.subtract(lr.multiply(direction)?)?;
        Ok((
            param,
            SgdLeaf {
                velocity: Some(velocity),
            },
        ))
    }
}
