//! The trainer's step with the state it reads and writes, per parameter or flat.

use super::StatePacking;
use crate::distributed::{DataParallel, Reduce};
use crate::error::{Error, Result};
use crate::flat::FlatStep;
use crate::optim::Optimizer;
use crate::state::TrainState;
use crate::step::{Loss, MetricsLoss, StepMetrics, StepOptions, TrainStep};
use crate::tree::Tree;
use mlx_rs::Array;
use std::cell::OnceCell;

/// A training step and the state it owns.
pub(crate) enum Stepper<P: Tree<Array>, O: Optimizer> {
    /// One array per parameter and optimizer state array.
    PerParameter {
        step: TrainStep<P, O>,
        state: TrainState<P, O>,
    },
    /// Packed flat; the [`TrainState`] of views is made when asked for, once per step.
    Flat {
        step: FlatStep<P, O>,
        flat: Vec<Array>,
        unpacked: OnceCell<TrainState<P, O>>,
    },
}

impl<P, O> Stepper<P, O>
where
    P: Tree<Array> + Clone + 'static,
    P::Of<Option<O::Leaf>>: Clone + 'static,
    O: Optimizer,
{
    /// The step over `state`, laid out as `packing` says.
    pub(crate) fn new(
        state: TrainState<P, O>,
        optimizer: O,
        loss: impl Loss<P> + Clone,
        options: StepOptions,
        packing: StatePacking,
        parallel: Option<&DataParallel>,
    ) -> Result<Self> {
        if flat_wanted(packing, parallel)? {
            let step = FlatStep::data_parallel(
                &state,
                optimizer.clone(),
                loss.clone(),
                options,
                parallel,
            )?;
            if let Some(flat) = Self::flat(step, &state, &optimizer, packing, parallel)? {
                return Ok(flat);
            }
        }
        Ok(Stepper::PerParameter {
            step: TrainStep::data_parallel(&state, optimizer, loss, options, parallel)?,
            state,
        })
    }

    /// The step of a loss that reads `frozen` leaves besides the parameters and reports
    /// `metrics` values after itself ([`TrainStep::data_parallel_with_frozen`]), laid out as
    /// `packing` says; per parameter where the model has buffers, which a flat step does not
    /// write.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn with_frozen(
        state: TrainState<P, O>,
        optimizer: O,
        frozen: Vec<Array>,
        loss: impl MetricsLoss<P> + Clone,
        metrics: usize,
        options: StepOptions,
        packing: StatePacking,
        parallel: Option<&DataParallel>,
    ) -> Result<Self> {
        if flat_wanted(packing, parallel)? {
            let step = FlatStep::data_parallel_with_frozen(
                &state,
                optimizer.clone(),
                frozen.clone(),
                loss.clone(),
                metrics,
                options,
                parallel,
            )?;
            if let Some(flat) = Self::flat(step, &state, &optimizer, packing, parallel)? {
                return Ok(flat);
            }
        }
        Ok(Stepper::PerParameter {
            step: TrainStep::data_parallel_with_frozen(
                &state, optimizer, frozen, loss, metrics, options, parallel,
            )?,
            state,
        })
    }

    /// The flat stepper over `state` where `step` could be made; where it could not, `None` to
    /// fall back to per-parameter state, or the reason when `packing` or `parallel`'s reduction
    /// during the backward pass asked for flat.
    fn flat(
        step: Option<FlatStep<P, O>>,
        state: &TrainState<P, O>,
        optimizer: &O,
        packing: StatePacking,
        parallel: Option<&DataParallel>,
    ) -> Result<Option<Self>> {
        let overlap = parallel.is_some_and(|parallel| {
            matches!(parallel.reduce, Reduce::Overlap { .. }) && packing != StatePacking::Flat
        });
        match step {
            Some(step) => {
                let flat = step.pack(state)?;
                Ok(Some(Stepper::Flat {
                    step,
                    flat,
                    unpacked: OnceCell::new(),
                }))
            }
            None if packing == StatePacking::Flat || overlap => Err(Error::Config(format!(
                "the state of `{}` cannot be packed flat: its update is not elementwise, the \
                 model has nothing to train or it has buffers; {}",
                optimizer.name(),
                if overlap {
                    "sum the gradients in the step or after it"
                } else {
                    "use per-parameter state"
                }
            ))),
            None => Ok(None),
        }
    }

    /// The state after the last step.
    pub(crate) fn state(&self) -> &TrainState<P, O> {
        match self {
            Stepper::PerParameter { state, .. } => state,
            Stepper::Flat {
                step,
                flat,
                unpacked,
            } => unpacked.get_or_init(|| {
                step.unpack(flat)
                    .expect("a flat state unpacks by the layout that packed it")
            }),
        }
    }

    /// Changes the state through `change` (on a flat state: unpacked, changed, packed again).
    pub(crate) fn change_state<R>(
        &mut self,
        change: impl FnOnce(&mut TrainState<P, O>) -> Result<R>,
    ) -> Result<R> {
        match self {
            Stepper::PerParameter { state, .. } => change(state),
            Stepper::Flat {
                step,
                flat,
                unpacked,
            } => {
                let mut state = step.unpack(flat)?;
                let result = change(&mut state)?;
                *flat = step.pack(&state)?;
                unpacked.take();
                Ok(result)
            }
        }
    }

    /// Runs one step (lazily: nothing is evaluated here).
    pub(crate) fn step(&mut self, lr: f32, batch: &[Array]) -> Result<StepMetrics> {
        match self {
            Stepper::PerParameter { step, state } => step.step(state, lr, batch),
            Stepper::Flat {
                step,
                flat,
                unpacked,
            } => {
                unpacked.take();
                step.step(flat, lr, batch)
            }
        }
    }

    /// How many times the step has been traced.
    pub(crate) fn traces(&self) -> usize {
        match self {
            Stepper::PerParameter { step, .. } => step.traces(),
            Stepper::Flat { step, .. } => step.traces(),
        }
    }

    /// Whether the state is packed flat.
    pub(crate) fn is_flat(&self) -> bool {
        matches!(self, Stepper::Flat { .. })
    }
}

/// Whether `packing` asks for the flat state in this run: `Auto` on CUDA, with a sharded
/// optimizer state or with the gradients summed during the backward pass, where the gradients are
/// summed over the ranks inside the step or during it (the flat step sums them there only).
fn flat_wanted(packing: StatePacking, parallel: Option<&DataParallel>) -> Result<bool> {
    let shard = parallel.is_some_and(|parallel| parallel.shard_optimizer);
    let reduce = parallel.map_or(Reduce::InStep, |parallel| parallel.reduce);
    let overlap = matches!(reduce, Reduce::Overlap { .. });
    let flat = match packing {
        StatePacking::Auto => {
            ((crate::cuda::available() || shard) && reduce == Reduce::InStep) || overlap
        }
        StatePacking::Flat => true,
        StatePacking::PerParameter => false,
    };
    if shard && !flat {
        return Err(Error::Config(
            "a sharded optimizer state is a flat one: it needs the flat state packing \
             and the gradients summed in the step"
                .into(),
        ));
    }
    if overlap && !flat {
        return Err(Error::Config(
            "the gradients are summed during the backward pass in buckets of the flat state: \
             it needs the flat state packing"
                .into(),
        ));
    }
    if flat && reduce == Reduce::AfterStep {
        return Err(Error::Config(
            "a flat state sums the gradients over the ranks inside its step or during it".into(),
        ));
    }
    Ok(flat)
}
