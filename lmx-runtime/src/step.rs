//! The training step as a pure function over a declared state, compiled once.
//!
//! [`TrainStep`] builds the function `[state..., lr, batch...] -> [state'..., loss, grad_norm]`
//! from a loss over the parameter tree, an [`Optimizer`] and the clip norm, and hands it to
//! MLX's `compile`. Every array it reads arrives as an input and every array it changes leaves as
//! an output, so MLX never sees a captured or mutated array, and the state's layout is fixed before
//! the first trace: the step is traced exactly once however the learning rate changes. The same
//! function runs uncompiled in eager mode, for debugging, with the same numbers.
//!
//! With gradient accumulation over `k` micro-batches, two functions are compiled instead: the
//! micro-step `[params..., micro-batch..., key] -> [grads..., loss]`, run `k` times, and the update
//! `[state..., lr, grads...] -> [state'..., grad_norm]` over the mean gradient.

use crate::arrays::Arrays;
use crate::clip;
use crate::distributed::{self, DataParallel, Group, Reduce};
use crate::error::{Error, Result};
use crate::optim::{DecayScope, Optimizer, StepScalars};
use crate::state::{StateTemplate, TrainState};
use crate::tree::{self, LeafRole, Tree};
use mlx_rs::error::Exception;
use mlx_rs::transforms::{async_eval, compile::compile, value_and_grad_with_argnums};
use mlx_rs::{random, Array};
use std::cell::Cell;
use std::rc::Rc;

/// A loss over a parameter tree: `(params, batch, key) -> scalar loss`.
pub trait Loss<P>: Fn(&P, &[Array], &Array) -> Result<Array> + 'static {}

impl<P, F: Fn(&P, &[Array], &Array) -> Result<Array> + 'static> Loss<P> for F {}

/// A loss that also reads frozen models: `(params, frozen, batch, key) -> scalar loss`, where
/// `frozen` holds the leaves of every frozen tree, in the order given to
/// [`TrainStep::with_frozen`] (rebuild a tree with [`tree::rebuild`]).
pub trait FrozenLoss<P>: Fn(&P, &[Array], &[Array], &Array) -> Result<Array> + 'static {}

impl<P, F: Fn(&P, &[Array], &[Array], &Array) -> Result<Array> + 'static> FrozenLoss<P> for F {}

/// A loss over frozen models that also reports metrics of its own:
/// `(params, frozen, batch, key) -> [loss, metric...]`, every value a scalar. The metrics are
/// computed in the same compiled step as the loss, without gradients (DPO's reward margin and
/// preference accuracy).
pub trait MetricsLoss<P>:
    Fn(&P, &[Array], &[Array], &Array) -> Result<Vec<Array>> + 'static
{
}

impl<P, F: Fn(&P, &[Array], &[Array], &Array) -> Result<Vec<Array>> + 'static> MetricsLoss<P>
    for F
{
}

/// `(params, batch, key) -> [loss, metric...]`, the form every step function differentiates.
pub(crate) type ValuesFn<P> = dyn Fn(&P, &[Array], &Array) -> Result<Vec<Array>>;

/// How the step is run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepOptions {
    /// Clip gradients to this global norm (graph-only clipping); `None` leaves them.
    pub clip_norm: Option<f32>,
    /// Compile the step with MLX (`false`: eager, for debugging).
    pub compile: bool,
    /// Micro-batches per update: the batch is split along its first axis into this many parts and
    /// their gradients averaged before one update.
    pub accumulation: usize,
    /// Which parameters weight decay applies to.
    pub decay: DecayScope,
    /// The batch input that holds the target ids, if one does. An accumulated step then weighs
    /// each micro-batch's mean loss and gradients by its count of kept targets (those that are
    /// not negative, see [`IGNORE_TARGET`](crate::nn::IGNORE_TARGET)), so that the update is the
    /// one of the whole batch's mean over its kept targets, however unevenly prompt masking and
    /// padding spread them. With equal counts every weight is exactly 1: the plain mean.
    pub targets: Option<usize>,
}

impl Default for StepOptions {
    fn default() -> Self {
        StepOptions {
            clip_norm: Some(1.0),
            compile: true,
            accumulation: 1,
            decay: DecayScope::Weights,
            targets: None,
        }
    }
}

/// What one step reports, as lazy arrays: evaluate them with the state at the step's boundary.
#[derive(Clone, Debug)]
pub struct StepMetrics {
    /// The loss before the update (the mean over micro-batches).
    pub loss: Array,
    /// The global gradient norm before clipping.
    pub grad_norm: Array,
    /// The loss's own metrics ([`TrainStep::with_frozen_metrics`]), averaged over
    /// micro-batches as the loss is.
    pub metrics: Vec<Array>,
    /// Every array the step produced (the next state, the loss, the gradient norm, the
    /// metrics): what the evaluation boundary evaluates.
    pub outputs: Vec<Array>,
    /// What to hand to the device before `outputs`, stage after stage, each with its own
    /// `async_eval`: a flat step that sums its gradients during the backward pass
    /// ([`Reduce::Overlap`]) hands them over bucket by bucket, each bucket's sum on a stream of
    /// its own. Empty for every other step. Evaluating `outputs` alone computes the same
    /// numbers, without the overlap (MLX's host then waits for each bucket).
    pub stages: Stages,
}

/// Groups of arrays to hand to the device one after another ([`StepMetrics::stages`]).
pub type Stages = Vec<Vec<Array>>;

impl StepMetrics {
    /// Hands the stages to the device, one after another, and lets go of them: an array a stage
    /// held is then the next stage's to overwrite (MLX reuses the buffer of an input nothing else
    /// holds, as a bucket's sum does its gradient's).
    pub fn hand_over_stages(&mut self) -> Result<()> {
        for stage in std::mem::take(&mut self.stages) {
            async_eval(&stage)?;
        }
        Ok(())
    }
}

pub(crate) type PureFn = Box<dyn FnMut(&[Array]) -> std::result::Result<Vec<Array>, Exception>>;

/// Wraps a pure function over arrays, compiled or not.
pub(crate) fn prepare(
    body: impl Fn(&[Array]) -> Result<Vec<Array>> + 'static,
    compiled: bool,
) -> PureFn {
    let pure = move |inputs: &[Array]| body(inputs).map_err(Error::into_exception);
    if compiled {
        Box::new(compile(pure, false))
    } else {
        Box::new(pure)
    }
}

/// A compiled (or eager) training step over a [`TrainState`].
pub struct TrainStep<P: Tree<Array>, O: Optimizer> {
    mode: Mode,
    template: StateTemplate<P, O>,
    traces: Rc<Cell<usize>>,
    trainable: usize,
    targets: Option<usize>,
    /// The frozen models' leaves: inputs of every call of the compiled step, ahead of the batch,
    /// never differentiated and never updated.
    frozen: Vec<Array>,
    /// The ranks whose gradients an accumulated step averages between its functions.
    group: Option<Group>,
    /// How many metrics the loss reports beside itself.
    metrics: usize,
}

/// A step's compiled functions, per-parameter ([`TrainStep`]) or flat
/// ([`FlatStep`](crate::flat::FlatStep)).
pub(crate) enum Mode {
    /// Loss, gradients and update in one function.
    Fused(PureFn),
    /// `micro` per micro-batch, then `apply`.
    Accumulate {
        micro: PureFn,
        apply: PureFn,
        parts: usize,
    },
}

impl<P, O> TrainStep<P, O>
where
    P: Tree<Array> + Clone + 'static,
    P::Of<Option<O::Leaf>>: Clone + 'static,
    O: Optimizer,
{
    /// The step for states laid out like `state`.
    ///
    /// # Errors
    /// When `options.accumulation` is zero.
    pub fn new(
        state: &TrainState<P, O>,
        optimizer: O,
        loss: impl Loss<P>,
        options: StepOptions,
    ) -> Result<Self> {
        Self::data_parallel(state, optimizer, loss, options, None)
    }

    /// The step of one rank of a data-parallel run (of a single process for `None`): each rank
    /// steps on its own part of the global batch and the gradients and loss are averaged over
    /// the ranks, inside the compiled step or between its functions as `parallel.reduce` says
    /// (with gradient accumulation always between).
    pub fn data_parallel(
        state: &TrainState<P, O>,
        optimizer: O,
        loss: impl Loss<P>,
        options: StepOptions,
        parallel: Option<&DataParallel>,
    ) -> Result<Self> {
        let values = move |params: &P, batch: &[Array], key: &Array| -> Result<Vec<Array>> {
            Ok(vec![loss(params, batch, key)?])
        };
        Self::with_values(state, optimizer, Rc::new(values), 0, options, parallel)
    }

    fn with_values(
        state: &TrainState<P, O>,
        optimizer: O,
        loss: Rc<ValuesFn<P>>,
        metrics: usize,
        options: StepOptions,
        parallel: Option<&DataParallel>,
    ) -> Result<Self> {
        let in_step = parallel.filter(|parallel| parallel.reduce == Reduce::InStep);
        let template = state.template();
        let traces = Rc::new(Cell::new(0));
        let specs: Vec<(bool, bool)> = state
            .specs()
            .into_iter()
            .map(|spec| (spec.trainable, options.decay.applies(&spec)))
            .collect();
        let trainable = specs.iter().filter(|(trainable, _)| *trainable).count();
        let buffers = state
            .specs()
            .iter()
            .map(|spec| spec.role == LeafRole::Buffer)
            .collect();
        let body = Rc::new(StepBody {
            template: template.clone(),
            specs,
            buffers,
            metrics,
            trainable,
            optimizer,
            loss,
            clip_norm: options.clip_norm,
            traces: traces.clone(),
            group: in_step.map(|parallel| parallel.group.clone()),
            targets: options.targets,
        });
        let fused = parallel.is_none() || in_step.is_some();
        let mode = match options.accumulation {
            0 => {
                return Err(Error::Config(
                    "gradient accumulation needs at least 1 micro-batch".into(),
                ))
            }
            1 if fused => Mode::Fused(prepare(move |inputs| body.fused(inputs), options.compile)),
            parts => {
                let micro_body = body.clone();
                Mode::Accumulate {
                    micro: prepare(move |inputs| micro_body.micro(inputs), options.compile),
                    apply: prepare(move |inputs| body.apply(inputs), options.compile),
                    parts,
                }
            }
        };
        Ok(TrainStep {
            mode,
            template,
            traces,
            trainable,
            targets: options.targets,
            frozen: Vec::new(),
            group: parallel.map(|parallel| parallel.group.clone()),
            metrics,
        })
    }

    /// The step of a loss that reads frozen models besides the trained parameters (DPO's and
    /// GRPO's reference, a distillation teacher): `frozen`, the leaves of those models, become
    /// inputs of the compiled step, like the batch, so MLX neither captures them as constants
    /// nor differentiates them, and the state holds no optimizer moments for them.
    ///
    /// # Errors
    /// As [`TrainStep::new`].
    pub fn with_frozen(
        state: &TrainState<P, O>,
        optimizer: O,
        frozen: Vec<Array>,
        loss: impl FrozenLoss<P>,
        options: StepOptions,
    ) -> Result<Self> {
        let values = move |params: &P, frozen: &[Array], batch: &[Array], key: &Array| {
            Ok(vec![loss(params, frozen, batch, key)?])
        };
        Self::with_frozen_metrics(state, optimizer, frozen, values, 0, options)
    }

    /// [`with_frozen`](Self::with_frozen) for a loss that reports `metrics` scalars of its own
    /// after the loss: the step returns them after the gradient norm, in
    /// [`StepMetrics::metrics`]. A loss may return after its metrics the next value of every
    /// buffer leaf of the parameters ([`crate::buffers`], in traversal order), which the step
    /// writes into the state after the update (with accumulation, their mean over the
    /// micro-batches, weighed as the loss).
    ///
    /// # Errors
    /// As [`TrainStep::new`].
    pub fn with_frozen_metrics(
        state: &TrainState<P, O>,
        optimizer: O,
        frozen: Vec<Array>,
        loss: impl MetricsLoss<P>,
        metrics: usize,
        options: StepOptions,
    ) -> Result<Self> {
        Self::data_parallel_with_frozen(state, optimizer, frozen, loss, metrics, options, None)
    }

    /// [`with_frozen_metrics`](Self::with_frozen_metrics) on one rank of a data-parallel run
    /// (as [`data_parallel`](Self::data_parallel)): the gradients, the loss and its metrics are
    /// averaged over the ranks. Every rank holds the frozen models whole.
    ///
    /// # Errors
    /// As [`TrainStep::new`], and when the model has buffers: a step writes each buffer from its
    /// own batch's statistics (a routing bias from the step's expert loads), which no average of
    /// the ranks' values reproduces.
    pub fn data_parallel_with_frozen(
        state: &TrainState<P, O>,
        optimizer: O,
        frozen: Vec<Array>,
        loss: impl MetricsLoss<P>,
        metrics: usize,
        options: StepOptions,
        parallel: Option<&DataParallel>,
    ) -> Result<Self> {
        let count = frozen.len();
        let buffers = crate::buffers::count(&state.params);
        if parallel.is_some() && buffers > 0 {
            return Err(Error::Config(format!(
                "the model has {buffers} buffers, which a step writes from its own batch (a \
                 routing bias from the batch's expert loads): it does not train data-parallel"
            )));
        }
        let split = frozen_values(loss, count, metrics, buffers);
        let mut step =
            Self::with_values(state, optimizer, Rc::new(split), metrics, options, parallel)?;
        step.frozen = frozen;
        Ok(step)
    }

    /// Runs one step: `state` becomes the next state (lazily: nothing is evaluated here).
    pub fn step(
        &mut self,
        state: &mut TrainState<P, O>,
        lr: f32,
        batch: &[Array],
    ) -> Result<StepMetrics> {
        let n = self.template.layout().len();
        let mut inputs = state.flatten();
        inputs.push(Array::from_f32(lr));
        let (outputs, loss) = match &mut self.mode {
            Mode::Fused(fused) => {
                inputs.extend(self.frozen.iter().cloned());
                inputs.extend(batch.iter().cloned());
                let outputs = fused(&inputs)?;
                let loss = outputs.get(n).cloned();
                (outputs, loss)
            }
            Mode::Accumulate {
                micro,
                apply,
                parts,
            } => {
                let parts = *parts;
                let mut fixed = inputs[..self.template.layout().params].to_vec();
                fixed.extend(self.frozen.iter().cloned());
                let (grads, loss, mut metrics) = accumulate(
                    micro,
                    &fixed,
                    &state.key,
                    batch,
                    parts,
                    self.trainable,
                    self.targets,
                )?;
                // The micro-batches' buffer values, averaged as the metrics are, follow the
                // metrics; the update writes them.
                let written = metrics.split_off(self.metrics.min(metrics.len()));
                let mut values = vec![loss];
                values.extend(metrics);
                let (grads, mut values) =
                    across_ranks(self.group.as_ref(), self.targets, grads, values, batch)?;
                let loss = values.remove(0);
                inputs.extend(grads);
                inputs.extend(written);
                let mut outputs = apply(&inputs)?;
                outputs.insert(n, loss.clone());
                outputs.extend(values);
                (outputs, Some(loss))
            }
        };
        if outputs.len() != n + 2 + self.metrics {
            return Err(Error::Layout(format!(
                "the step returned {} arrays, expected {}",
                outputs.len(),
                n + 2 + self.metrics
            )));
        }
        *state = self.template.state(&outputs)?;
        let loss = loss.expect("checked the output count");
        Ok(StepMetrics {
            loss,
            grad_norm: outputs[n + 1].clone(),
            metrics: outputs[n + 2..].to_vec(),
            outputs,
            stages: Stages::new(),
        })
    }

    /// How many times the step's functions have been traced (compiled) or run (eager).
    pub fn traces(&self) -> usize {
        self.traces.get()
    }
}

/// `loss` as the function a step differentiates, `(params, frozen ++ batch, key) -> [loss,
/// metric...]`: its inputs the `count` frozen leaves, then the batch; it must return itself and
/// `metrics` metrics, and may add the next values of the model's `buffers` buffers.
pub(crate) fn frozen_values<P>(
    loss: impl MetricsLoss<P>,
    count: usize,
    metrics: usize,
    buffers: usize,
) -> impl Fn(&P, &[Array], &Array) -> Result<Vec<Array>> + 'static {
    move |params: &P, inputs: &[Array], key: &Array| {
        let (frozen, batch) = inputs.split_at(count);
        let values = loss(params, frozen, batch, key)?;
        let written = buffers > 0 && values.len() == metrics + 1 + buffers;
        if values.len() != metrics + 1 && !written {
            let buffers = match buffers {
                0 => String::new(),
                n => {
                    format!(" (and the next values of the model's {n} buffers, if it writes them)")
                }
            };
            return Err(Error::Layout(format!(
                "the loss returned {} values, expected itself and {metrics} metrics{buffers}",
                values.len()
            )));
        }
        Ok(values)
    }
}

/// Runs the micro-step `[fixed..., micro-batch..., key] -> [grads..., loss, metrics...]`
/// (`n_grads` arrays of gradients) over `parts` slices of `batch` and returns the mean gradients,
/// loss and metrics: the plain
/// mean, or with `targets` (the batch input of target ids) each micro-batch weighed by its share
/// of the kept targets. `fixed` is what every micro-step reads whole (the parameters, frozen
/// models); the micro-steps' keys come from `key`, the state's.
pub(crate) fn accumulate(
    micro: &mut PureFn,
    fixed: &[Array],
    key: &Array,
    batch: &[Array],
    parts: usize,
    n_grads: usize,
    targets: Option<usize>,
) -> Result<(Vec<Array>, Array, Vec<Array>)> {
    let micro_batches = split_batch(batch, parts)?;
    let weights = match targets {
        Some(index) => Some(kept_shares(&micro_batches, index)?),
        None => None,
    };
    // Micro-batch keys come from the half of the key that the update does not carry on.
    let mut keys = random::split(key, 2)?.1;
    let mut sums: Option<Vec<Array>> = None;
    let mut loss_sum = Array::from_f32(0.0);
    let mut metric_sums: Vec<Array> = Vec::new();
    for (part, micro_batch) in micro_batches.into_iter().enumerate() {
        let (carry, key) = random::split(&keys, 2)?;
        keys = carry;
        let mut inputs = fixed.to_vec();
        inputs.extend(micro_batch);
        inputs.push(key);
        let outputs = micro(&inputs)?;
        if outputs.len() < n_grads + 1 {
            return Err(Error::Layout(format!(
                "the micro-step returned {} arrays, expected at least {}",
                outputs.len(),
                n_grads + 1
            )));
        }
        let (grads, loss) = outputs.split_at(n_grads);
        let weigh = |value: &Array| -> Result<Array> {
            Ok(match &weights {
                Some(weights) => value.multiply(weights[part].as_dtype(value.dtype())?)?,
                None => value.clone(),
            })
        };
        loss_sum = loss_sum.add(weigh(&loss[0])?)?;
        let metrics = loss[1..].iter().map(weigh).collect::<Result<Vec<_>>>()?;
        metric_sums = match metric_sums.is_empty() {
            true => metrics,
            false => metric_sums
                .iter()
                .zip(metrics)
                .map(|(sum, metric)| Ok(sum.add(metric)?))
                .collect::<Result<_>>()?,
        };
        sums = Some(match sums {
            None => grads.iter().map(weigh).collect::<Result<_>>()?,
            Some(sums) => sums
                .iter()
                .zip(grads)
                .map(|(sum, grad)| Ok(sum.add(weigh(grad)?)?))
                .collect::<Result<_>>()?,
        });
    }
    let scale = Array::from_f32(1.0 / parts as f32);
    let grads = sums
        .unwrap_or_default()
        .iter()
        .map(|sum| Ok(sum.multiply(scale.as_dtype(sum.dtype())?)?))
        .collect::<Result<Vec<_>>>()?;
    let metrics = metric_sums
        .iter()
        .map(|sum| Ok(sum.multiply(&scale)?))
        .collect::<Result<Vec<_>>>()?;
    Ok((grads, loss_sum.multiply(&scale)?, metrics))
}

/// Each micro-batch's weight `parts * kept / total kept` (lazy float32 scalars), where `kept`
/// counts its non-negative targets in input `index`: the weighted mean of the micro-batches'
/// means is the whole batch's mean over its kept targets. Equal counts give exactly 1 (an
/// integer over itself); no kept target at all gives 0, not 0/0.
fn kept_shares(micro_batches: &[Vec<Array>], index: usize) -> Result<Vec<Array>> {
    let counts = micro_batches
        .iter()
        .map(|micro_batch| {
            let targets = micro_batch.get(index).ok_or_else(|| {
                Error::Layout(format!(
                    "the targets are batch input {index}, but the batch has {}",
                    micro_batch.len()
                ))
            })?;
            Ok(targets
                .ge(Array::from_int(0))?
                .as_dtype(mlx_rs::Dtype::Float32)?
                .sum(false)?)
        })
        .collect::<Result<Vec<_>>>()?;
    let mut total = Array::from_f32(0.0);
    for count in &counts {
        total = total.add(count)?;
    }
    let total = mlx_rs::ops::maximum(&total, Array::from_f32(1.0))?;
    let parts = Array::from_f32(micro_batches.len() as f32);
    counts
        .iter()
        .map(|count| Ok(count.multiply(&parts)?.divide(&total)?))
        .collect()
}

/// Splits every array of `batch` along axis 0 into `parts` equal slices.
fn split_batch(batch: &[Array], parts: usize) -> Result<Vec<Vec<Array>>> {
    let mut micro_batches = vec![Vec::with_capacity(batch.len()); parts];
    for array in batch {
        let rows = array.shape().first().copied().unwrap_or(0) as usize;
        if rows % parts != 0 {
            return Err(Error::Config(format!(
                "a batch of {rows} rows cannot be split into {parts} equal micro-batches"
            )));
        }
        for (micro_batch, slice) in micro_batches
            .iter_mut()
            .zip(array.split_equal(parts as i32, 0)?)
        {
            micro_batch.push(slice);
        }
    }
    Ok(micro_batches)
}

/// The pure step functions and what they need, captured by value.
struct StepBody<P: Tree<Array>, O: Optimizer> {
    template: StateTemplate<P, O>,
    /// (trainable, decay) per parameter leaf, in traversal order.
    specs: Vec<(bool, bool)>,
    optimizer: O,
    loss: Rc<ValuesFn<P>>,
    clip_norm: Option<f32>,
    traces: Rc<Cell<usize>>,
    /// The ranks the fused step averages its gradients and loss over.
    group: Option<Group>,
    /// The batch input of target ids, if the batch has one.
    targets: Option<usize>,
    /// Whether each parameter leaf is a buffer, in traversal order.
    buffers: Vec<bool>,
    /// How many metrics the loss reports beside itself (its buffers' values follow them).
    metrics: usize,
    /// How many leaves train.
    trainable: usize,
}

impl<P, O> StepBody<P, O>
where
    P: Tree<Array> + Clone + 'static,
    O: Optimizer,
{
    /// `[state..., lr, batch...] -> [state'..., loss, grad_norm, metrics...]`.
    fn fused(&self, inputs: &[Array]) -> Result<Vec<Array>> {
        self.count_trace();
        let n_state = self.template.layout().len();
        self.check_inputs(inputs, n_state + 1)?;
        let state = self.template.state(inputs)?;
        let (key, subkey) = random::split(&state.key, 2)?;
        let params = &inputs[..self.template.layout().params];
        let batch = &inputs[n_state + 1..];
        let (mut values, grads) = self.loss_and_grads(params, batch, &subkey)?;
        let written = values.split_off((1 + self.metrics).min(values.len()));
        let (grads, mut values) =
            across_ranks(self.group.as_ref(), self.targets, grads, values, batch)?;
        let loss = values.remove(0);
        let mut outputs = self.update(state, &inputs[n_state], grads, &written, key)?;
        outputs.insert(n_state, loss);
        outputs.extend(values);
        Ok(outputs)
    }

    /// `[params..., batch..., key] -> [grads..., loss, metrics...]`.
    fn micro(&self, inputs: &[Array]) -> Result<Vec<Array>> {
        self.count_trace();
        let n_params = self.template.layout().params;
        self.check_inputs(inputs, n_params + 1)?;
        let (batch, key) = inputs[n_params..].split_at(inputs.len() - n_params - 1);
        let (values, mut grads) = self.loss_and_grads(&inputs[..n_params], batch, &key[0])?;
        grads.extend(values);
        Ok(grads)
    }

    /// `[state..., lr, grads..., buffers...] -> [state'..., grad_norm]`, where `buffers` are
    /// the buffers' next values, if the loss wrote them.
    fn apply(&self, inputs: &[Array]) -> Result<Vec<Array>> {
        self.count_trace();
        let n_state = self.template.layout().len();
        self.check_inputs(inputs, n_state + 1 + self.trainable)?;
        let state = self.template.state(inputs)?;
        let (key, _) = random::split(&state.key, 2)?;
        let (grads, written) = inputs[n_state + 1..].split_at(self.trainable);
        self.update(state, &inputs[n_state], grads.to_vec(), written, key)
    }

    fn count_trace(&self) {
        self.traces.set(self.traces.get() + 1);
    }

    fn check_inputs(&self, inputs: &[Array], needed: usize) -> Result<()> {
        if inputs.len() < needed {
            return Err(Error::Layout(format!(
                "the step needs at least {needed} inputs, got {}",
                inputs.len()
            )));
        }
        Ok(())
    }

    /// Clips `grads`, applies the optimizer and writes the buffers' next values `written` (one
    /// per buffer leaf in traversal order, or none, which keeps them): `[state'..., grad_norm]`
    /// (no loss).
    fn update(
        &self,
        state: TrainState<P, O>,
        lr: &Array,
        grads: Vec<Array>,
        written: &[Array],
        key: Array,
    ) -> Result<Vec<Array>> {
        let buffers = self.buffers.iter().filter(|buffer| **buffer).count();
        if !written.is_empty() && written.len() != buffers {
            return Err(Error::Layout(format!(
                "the loss returned {} values after its {} metrics; the model has {buffers} buffers",
                written.len(),
                self.metrics
            )));
        }
        let mut written = written.iter();
        let (grads, grad_norm) = match self.clip_norm {
            Some(max_norm) => clip::clip_by_global_norm(&grads, max_norm)?,
            None => {
                let norm = clip::global_norm(&grads)?;
                (grads, norm)
            }
        };
        let step = state.step.add(Array::from_f32(1.0))?;
        let scalars = StepScalars { lr, step: &step };
        let mut grads = grads.into_iter();
        let mut next_params = Vec::with_capacity(self.specs.len());
        let mut next_opt = Vec::new();
        let mut opt_leaves = Vec::with_capacity(self.specs.len());
        state
            .opt
            .for_each(&mut |leaf| opt_leaves.push(leaf.clone()));
        for (((param, &(_, decay)), leaf), &buffer) in tree::flatten(&state.params)
            .iter()
            .zip(&self.specs)
            .zip(opt_leaves)
            .zip(&self.buffers)
        {
            match leaf {
                Some(leaf) => {
                    let grad = grads.next().ok_or_else(|| {
                        Error::Layout("fewer gradients than trainable leaves".into())
                    })?;
                    let (param, leaf) =
                        self.optimizer.update(param, &grad, &leaf, scalars, decay)?;
                    next_params.push(param);
                    leaf.push_arrays(&mut next_opt);
                }
                // A buffer takes the value the loss wrote, in its own dtype (a mixed-precision
                // step computes it from a bfloat16 copy).
                None if buffer => match written.next() {
                    Some(value) => next_params.push(value.as_dtype(param.dtype())?),
                    None => next_params.push(param.clone()),
                },
                None => next_params.push(param.clone()),
            }
        }
        let mut outputs = next_params;
        outputs.extend(next_opt);
        outputs.extend([step, key, grad_norm]);
        Ok(outputs)
    }

    /// The loss and its metrics, and the gradients of the trainable parameters, in traversal
    /// order.
    fn loss_and_grads(
        &self,
        params: &[Array],
        batch: &[Array],
        key: &Array,
    ) -> Result<(Vec<Array>, Vec<Array>)> {
        let trainable: Vec<bool> = self.specs.iter().map(|(trainable, _)| *trainable).collect();
        values_and_grads(&self.template, &*self.loss, &trainable, params, batch, key)
    }
}

/// The loss and its metrics (`[loss, metric...]`, MLX differentiating the first and stopping
/// the gradient of the others) at `params`, and the loss's gradients with respect to the leaves
/// that `trainable` marks, in traversal order.
pub(crate) fn values_and_grads<P, O, F>(
    template: &StateTemplate<P, O>,
    loss: &F,
    trainable: &[bool],
    params: &[Array],
    batch: &[Array],
    key: &Array,
) -> Result<(Vec<Array>, Vec<Array>)>
where
    P: Tree<Array>,
    O: Optimizer,
    F: Fn(&P, &[Array], &Array) -> Result<Vec<Array>> + ?Sized,
{
    let argnums: Vec<i32> = trainable
        .iter()
        .enumerate()
        .filter(|(_, trainable)| **trainable)
        .map(|(index, _)| index as i32)
        .collect();
    let n_params = params.len();
    let n_batch = batch.len();
    let objective = move |args: &[Array]| -> std::result::Result<Vec<Array>, Exception> {
        let run = || -> Result<Vec<Array>> {
            let params = template.params(&args[..n_params])?;
            loss(
                &params,
                &args[n_params..n_params + n_batch],
                &args[n_params + n_batch],
            )
        };
        run().map_err(Error::into_exception)
    };
    let mut args: Vec<Array> = params.to_vec();
    args.extend(batch.iter().cloned());
    args.push(key.clone());
    let (values, grads) = value_and_grad_with_argnums(objective, &argnums[..])(&args)?;
    if values.is_empty() {
        return Err(Error::Layout("the loss returned nothing".into()));
    }
    Ok((values, grads))
}

/// `grads` and `values` (the loss, then its metrics) averaged over the ranks of a data-parallel
/// step (`group`), each rank weighed by its share of the kept targets of `batch` (at
/// `targets`); unchanged in a single process.
fn across_ranks(
    group: Option<&Group>,
    targets: Option<usize>,
    grads: Vec<Array>,
    values: Vec<Array>,
    batch: &[Array],
) -> Result<(Vec<Array>, Vec<Array>)> {
    match group {
        Some(group) => distributed::average(
            group,
            grads,
            values,
            targets.and_then(|index| batch.get(index)),
        ),
        None => Ok((grads, values)),
    }
}
