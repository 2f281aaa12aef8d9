//! A run's objective in place of its declared step's loss: a loss over the trained parameters
//! and frozen models (DPO's reference, a distillation teacher), whose leaves are inputs of the
//! compiled step and of validation, with no gradients and no optimizer state.

use crate::error::Result;
use crate::model::LanguageModel;
use crate::train::Precision;
use mlx_rs::{Array, Dtype};
use std::rc::Rc;

type Params<M> = <M as LanguageModel>::Params;
type Config<M> = <M as LanguageModel>::Config;

/// `(params, config, frozen, batch, key) -> loss`: `frozen` holds the objective's frozen leaves
/// in the order [`Objective::frozen`] gives them; `key` is `None` in validation (dropout off).
pub type ObjectiveLoss<M> =
    dyn Fn(&Params<M>, &Config<M>, &[Array], &[Array], Option<&Array>) -> Result<Array>;

/// A loss over model `M`'s parameters that reads frozen models.
#[derive(Clone)]
pub struct Objective<M: LanguageModel> {
    /// The objective's name, as runs and errors name it (`dpo`, `distill`).
    pub name: &'static str,
    /// Every frozen model's leaves, in the order the loss reads them.
    pub frozen: Vec<Array>,
    /// The loss.
    pub loss: Rc<ObjectiveLoss<M>>,
    /// Whether the loss is a mean over the batch's kept targets (distillation), so that
    /// accumulated micro-batches and validation batches are weighed by their kept targets as
    /// the plain loss's are; a mean over rows (DPO's pairs) weighs them equally.
    pub mean_over_targets: bool,
}

impl<M: LanguageModel> Objective<M> {
    /// The frozen leaves as the run computes with them: floating-point leaves in `precision`'s
    /// compute dtype, cast once here rather than in every step.
    pub(crate) fn frozen_for(&self, precision: Precision) -> Result<Vec<Array>> {
        let dtype = precision.compute_dtype();
        self.frozen
            .iter()
            .map(|leaf| {
                let float = matches!(
                    leaf.dtype(),
                    Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16 | Dtype::Float64
                );
                Ok(if float && leaf.dtype() != dtype {
                    leaf.as_dtype(dtype)?
                } else {
                    leaf.clone()
                })
            })
            .collect()
    }
}
