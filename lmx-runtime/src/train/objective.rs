//! A run's objective in place of its declared step's loss: a loss over the trained parameters
//! and frozen models (DPO's reference, a distillation teacher), whose leaves are inputs of the
//! compiled step and of validation, with no gradients and no optimizer state.

use crate::error::{Error, Result};
use crate::model::{LanguageModel, TrainingStep};
use crate::train::Precision;
use crate::tree::{self, Tree};
use mlx_rs::{Array, Dtype};
use std::rc::Rc;

type Params<M> = <M as LanguageModel>::Params;
type Config<M> = <M as LanguageModel>::Config;

/// `(params, config, frozen, batch, key) -> [loss, metric...]`: `frozen` holds the objective's
/// frozen leaves in the order [`Objective::frozen`] gives them; `key` is `None` in validation
/// (dropout off); the metrics are scalars named by [`Objective::metrics`], computed with the
/// loss in the same compiled step and never differentiated.
pub type ObjectiveLoss<M> =
    dyn Fn(&Params<M>, &Config<M>, &[Array], &[Array], Option<&Array>) -> Result<Vec<Array>>;

/// A loss over model `M`'s parameters that reads frozen models.
#[derive(Clone)]
pub struct Objective<M: LanguageModel> {
    /// The objective's name, as runs and errors name it (`dpo`, `distill`).
    pub name: &'static str,
    /// Every frozen model's leaves, in the order the loss reads them.
    pub frozen: Vec<Array>,
    /// The loss, and its metrics.
    pub loss: Rc<ObjectiveLoss<M>>,
    /// The names of the metrics the loss returns after itself, as runs log them.
    pub metrics: &'static [&'static str],
    /// Whether the loss is a mean over the batch's kept targets (distillation), so that
    /// accumulated micro-batches and validation batches are weighed by their kept targets as
    /// the plain loss's are; a mean over rows (DPO's pairs) weighs them equally.
    pub mean_over_targets: bool,
}

impl<M: LanguageModel> Objective<M> {
    /// The objective of training step `S` over the frozen models it declares
    /// ([`TrainingStep::FROZEN`]), each a copy of `start` (the run's starting parameters), and
    /// with the metrics it reports ([`TrainingStep::METRICS`]) and the buffers it writes
    /// ([`TrainingStep::WRITES_BUFFERS`]): `S`'s
    /// [`loss_and_metrics`](TrainingStep::loss_and_metrics) over the trees rebuilt from the
    /// frozen inputs of the compiled step, a mean over kept targets as a step's loss is. `None`
    /// when the step declares none of these. The command line's objectives (`--step dpo`,
    /// `--teacher`) reach the compiled step the same way, through [`Objective`].
    pub fn declared<S: TrainingStep<Model = M>>(start: &M::Params) -> Option<Objective<M>> {
        if S::FROZEN.is_empty() && S::METRICS.is_empty() && !S::WRITES_BUFFERS {
            return None;
        }
        let buffers = match S::WRITES_BUFFERS {
            true => crate::buffers::count(start),
            false => 0,
        };
        let leaves = tree::flatten(start);
        let count = leaves.len();
        let frozen = S::FROZEN
            .iter()
            .flat_map(|_| leaves.iter().cloned())
            .collect();
        let template = start.clone();
        let loss = move |params: &M::Params,
                         config: &M::Config,
                         frozen: &[Array],
                         batch: &[Array],
                         key: Option<&Array>|
              -> Result<Vec<Array>> {
            if frozen.len() != count * S::FROZEN.len() {
                return Err(Error::Layout(format!(
                    "step `{}` declares {} frozen models of {count} leaves, was given {} arrays",
                    S::NAME,
                    S::FROZEN.len(),
                    frozen.len()
                )));
            }
            let trees = frozen
                .chunks(count.max(1))
                .map(|leaves| frozen_tree(&template, leaves))
                .collect::<Result<Vec<_>>>()?;
            let values = S::loss_and_metrics(params, config, &trees, batch, key)?;
            if values.len() != S::METRICS.len() + 1 + buffers {
                return Err(Error::Layout(format!(
                    "step `{}` reports {} metrics and writes {buffers} buffers, its loss \
                     returned {} values",
                    S::NAME,
                    S::METRICS.len(),
                    values.len()
                )));
            }
            Ok(values)
        };
        Some(Objective {
            name: S::NAME,
            frozen,
            loss: Rc::new(loss),
            metrics: S::METRICS,
            mean_over_targets: true,
        })
    }

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

/// A tree shaped as `template` over `leaves` (a frozen model's inputs of the step).
pub(crate) fn frozen_tree<P: Tree<Array>>(template: &P, leaves: &[Array]) -> Result<P> {
    let count = tree::leaf_count(template);
    if leaves.len() != count {
        return Err(Error::Layout(format!(
            "a frozen model of {count} leaves was given {} arrays",
            leaves.len()
        )));
    }
    let mut leaves = leaves.iter().cloned();
    Ok(template.map_same(&mut |_| leaves.next().expect("counted above")))
}
