//! The training state packed into flat buffers, so that one update covers the whole model.
//!
//! A [`TrainState`] holds one array per parameter and per optimizer state array, and its
//! compiled step updates them one by one: on a GPU each update is a kernel launch, and at small
//! sizes a step's time is its launches (docs/benchmarks.md). When the optimizer's update is
//! elementwise ([`Optimizer::elementwise`]), the same update runs over all parameters at once if
//! they lie one after another in one buffer. [`FlatStep`] keeps the state that way: the trainable
//! parameters of one dtype and one weight-decay setting in one buffer, each optimizer state array
//! in a buffer laid out alike, and each parameter the loss reads is a view of its place. After
//! the backward pass the gradients are packed the same way (on CUDA by one kernel for all of
//! them, which also sums their squares for the norm), and the clip and the update are a handful
//! of kernels whatever the model's size.
//!
//! The numbers are the per-parameter step's: the same update on the same values. On CUDA the
//! gradient norm adds its squares in another grouping, so it can differ in its last bits. The state
//! unpacks to a [`TrainState`] of views ([`FlatStep::unpack`]) for checkpoints, evaluation and
//! anything else that reads parameters by name.

use crate::arrays::Arrays;
use crate::clip;
use crate::distributed::{self, DataParallel, Reduce, Shard};
use crate::error::{Error, Result};
use crate::optim::{DecayScope, Optimizer, StepScalars};
use crate::state::{StateTemplate, TrainState};
use crate::step::{
    accumulate, frozen_values, prepare, values_and_grads, Loss, MetricsLoss, Mode, PureFn, Stages,
    StepMetrics, StepOptions, ValuesFn,
};
use crate::tree::{self, Tree};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, random, with_stream, Array, Device, Dtype, Stream};
use std::cell::Cell;
use std::rc::Rc;

/// Where one parameter lives in the flat state.
#[derive(Clone, Debug)]
enum Place {
    /// In its group's buffers from `offset`, `shape` read row-major.
    Packed {
        group: usize,
        offset: i32,
        size: i32,
        shape: Vec<i32>,
    },
    /// Frozen: an array of its own, the `index`-th frozen one.
    Frozen { index: usize },
}

/// The trainable parameters of one dtype and one weight-decay setting.
#[derive(Clone, Debug)]
struct Group {
    dtype: Dtype,
    decay: bool,
    /// Their positions among the trainable parameters (the gradients' order).
    members: Vec<usize>,
}

/// How the arrays of a [`TrainState`] map to flat buffers.
///
/// The flat list is: each group's parameters, each group's optimizer state arrays (group by
/// group), the frozen parameters, the step and the key.
#[derive(Clone, Debug)]
pub struct FlatLayout {
    places: Vec<Place>,
    groups: Vec<Group>,
    frozen: usize,
    /// Optimizer state arrays per trainable parameter.
    opt_arrays: usize,
    /// Each group's buffer length.
    lengths: Vec<i32>,
}

impl FlatLayout {
    /// The layout of `state`, or `None` when its optimizer state cannot be packed: an update that
    /// is not elementwise, state arrays not shaped like their parameter, or nothing trainable.
    /// With `bucket_bytes`, a group's buffer ends where the next parameter would take it past
    /// that many bytes, and the next parameter of its dtype and decay setting begins another
    /// (a parameter larger than `bucket_bytes` is a buffer of its own).
    pub fn of<P: Tree<Array>, O: Optimizer>(
        state: &TrainState<P, O>,
        optimizer: &O,
        decay: DecayScope,
        bucket_bytes: Option<usize>,
    ) -> Result<Option<FlatLayout>> {
        if !optimizer.elementwise() {
            return Ok(None);
        }
        let params = tree::flatten(&state.params);
        let specs = state.specs();
        let mut opt_leaves: Vec<Option<Vec<Array>>> = Vec::with_capacity(params.len());
        state.opt.for_each(&mut |leaf| {
            opt_leaves.push(leaf.as_ref().map(|leaf| {
                let mut arrays = Vec::new();
                leaf.push_arrays(&mut arrays);
                arrays
            }))
        });
        let mut places = Vec::with_capacity(params.len());
        let mut groups: Vec<Group> = Vec::new();
        let mut sizes: Vec<i32> = Vec::new();
        // Each group's bytes so far.
        let mut filled: Vec<usize> = Vec::new();
        let (mut frozen, mut trainable) = (0, 0);
        let mut opt_arrays = None;
        for ((param, spec), opt) in params.iter().zip(&specs).zip(&opt_leaves) {
            let Some(opt) = opt else {
                places.push(Place::Frozen { index: frozen });
                frozen += 1;
                continue;
            };
            let alike = opt
                .iter()
                .all(|array| array.shape() == param.shape() && array.dtype() == param.dtype());
            if !alike || *opt_arrays.get_or_insert(opt.len()) != opt.len() {
                return Ok(None);
            }
            let (dtype, decay) = (param.dtype(), decay.applies(spec));
            let bytes = param.nbytes();
            let open = groups
                .iter()
                .rposition(|group| group.dtype == dtype && group.decay == decay)
                .filter(|&group| bucket_bytes.is_none_or(|limit| filled[group] + bytes <= limit));
            let group = match open {
                Some(group) => group,
                None => {
                    groups.push(Group {
                        dtype,
                        decay,
                        members: Vec::new(),
                    });
                    sizes.push(0);
                    filled.push(0);
                    groups.len() - 1
                }
            };
            let size = i32::try_from(param.size()).map_err(|_| too_large(&spec.name))?;
            let offset = sizes[group];
            sizes[group] = offset
                .checked_add(size)
                .ok_or_else(|| too_large(&spec.name))?;
            filled[group] += bytes;
            groups[group].members.push(trainable);
            trainable += 1;
            places.push(Place::Packed {
                group,
                offset,
                size,
                shape: param.shape().to_vec(),
            });
        }
        Ok(opt_arrays.map(|opt_arrays| FlatLayout {
            places,
            groups,
            frozen,
            opt_arrays,
            lengths: sizes,
        }))
    }

    /// Arrays in the flat list.
    pub fn len(&self) -> usize {
        self.groups.len() * (1 + self.opt_arrays) + self.frozen + 2
    }

    /// Never true: the flat list always holds the step and the key.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The flat list of a state given as [`TrainState::flatten`] lists it (parameters, each
    /// trainable parameter's optimizer state arrays, step, key).
    pub fn pack(&self, leaves: &[Array]) -> Result<Vec<Array>> {
        let n_params = self.places.len();
        let mut params: Vec<Vec<Array>> = vec![Vec::new(); self.groups.len()];
        let mut opt: Vec<Vec<Vec<Array>>> =
            vec![vec![Vec::new(); self.opt_arrays]; self.groups.len()];
        let mut frozen = Vec::with_capacity(self.frozen);
        let mut opt_arrays = leaves[n_params..].iter();
        for (place, param) in self.places.iter().zip(leaves) {
            match place {
                Place::Packed { group, .. } => {
                    params[*group].push(param.reshape(&[-1])?);
                    for array in &mut opt[*group] {
                        let state = opt_arrays.next().ok_or_else(short)?;
                        array.push(state.reshape(&[-1])?);
                    }
                }
                Place::Frozen { .. } => frozen.push(param.clone()),
            }
        }
        let mut flat = Vec::with_capacity(self.len());
        for group in &params {
            flat.push(ops::concatenate(group, 0)?);
        }
        for group in &opt {
            for arrays in group {
                flat.push(ops::concatenate(arrays, 0)?);
            }
        }
        flat.extend(frozen);
        let rest: Vec<Array> = opt_arrays.cloned().collect();
        if rest.len() != 2 {
            return Err(short());
        }
        flat.extend(rest);
        Ok(flat)
    }

    /// Every parameter of the flat list `flat`, in traversal order: views of the packed ones.
    pub fn params(&self, flat: &[Array]) -> Result<Vec<Array>> {
        let frozen = self.groups.len() * (1 + self.opt_arrays);
        self.places
            .iter()
            .map(|place| match place {
                Place::Packed { group, .. } => view(&flat[*group], place),
                Place::Frozen { index } => Ok(flat[frozen + index].clone()),
            })
            .collect()
    }

    /// The list [`TrainState::flatten`] would give for the flat list `flat`, of views.
    pub fn unpack(&self, flat: &[Array]) -> Result<Vec<Array>> {
        if flat.len() < self.len() {
            return Err(short());
        }
        let mut leaves = self.params(flat)?;
        for place in &self.places {
            if let Place::Packed { group, .. } = place {
                for index in 0..self.opt_arrays {
                    leaves.push(view(&flat[self.opt_index(*group, index)], place)?);
                }
            }
        }
        leaves.extend(flat[self.len() - 2..self.len()].iter().cloned());
        Ok(leaves)
    }

    /// The groups in the order a backward pass completes their gradients, as far as the model
    /// lists its layers in the order it runs them: the group whose first parameter comes last
    /// first (a group's gradient is whole once its first parameter's is).
    fn completion_order(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.groups.len()).collect();
        order.sort_by_key(|&group| std::cmp::Reverse(self.groups[group].members[0]));
        order
    }

    /// The position in the flat list of group `group`'s optimizer state array `index`.
    fn opt_index(&self, group: usize, index: usize) -> usize {
        self.groups.len() + group * self.opt_arrays + index
    }

    /// The gradients (of the trainable parameters, in traversal order) packed by group, each
    /// value times `weight` (a float32 scalar) if one is given, and their global norm.
    ///
    /// On CUDA the kernel that packs a group also weighs it and sums its squares. Elsewhere the
    /// norm is [`clip::global_norm`] of the gradients as they come: squaring a whole packed
    /// gradient would take a float32 copy of it at once.
    fn pack_grads(&self, grads: &[Array], weight: Option<&Array>) -> Result<(Vec<Array>, Array)> {
        let cuda = crate::cuda::available();
        let mut packed = Vec::with_capacity(self.groups.len());
        let mut squares = Vec::with_capacity(self.groups.len());
        for group in &self.groups {
            let members = group
                .members
                .iter()
                .map(|&member| {
                    let grad = grads.get(member).ok_or_else(short)?;
                    Ok(if grad.dtype() == group.dtype {
                        grad.clone()
                    } else {
                        grad.as_dtype(group.dtype)?
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            if cuda {
                let (flat, sum) = crate::cuda::pack_with_squares(&members, group.dtype, weight)?;
                packed.push(flat);
                squares.push(sum);
            } else {
                let flat = members
                    .iter()
                    .map(|member| Ok(member.reshape(&[-1])?))
                    .collect::<Result<Vec<_>>>()?;
                let flat = ops::concatenate(&flat, 0)?;
                packed.push(match weight {
                    Some(weight) => distributed::weigh(&flat, weight)?,
                    None => flat,
                });
            }
        }
        let norm = match squares.split_first() {
            Some((first, rest)) => rest
                .iter()
                .try_fold(first.clone(), |total, sum| total.add(sum))?
                .sqrt()?,
            None => clip::global_norm(grads)?,
        };
        Ok((packed, norm))
    }
}

/// The view of `buffer` where `place` (a packed one) lies, in its shape.
fn view(buffer: &Array, place: &Place) -> Result<Array> {
    match place {
        Place::Packed {
            offset,
            size,
            shape,
            ..
        } => Ok(buffer.index(*offset..offset + size).reshape(shape)?),
        Place::Frozen { .. } => Err(Error::Layout("a frozen parameter has no place".into())),
    }
}

fn short() -> Error {
    Error::Layout("the state has fewer arrays than its flat layout".into())
}

fn too_large(name: &str) -> Error {
    Error::Layout(format!(
        "`{name}` takes the flat state past 2^31 values; train with per-parameter state"
    ))
}

/// A compiled (or eager) training step over a flat state.
pub struct FlatStep<P: Tree<Array>, O: Optimizer> {
    mode: FlatMode<P, O>,
    /// The batch input of target ids, if the batch has one.
    targets: Option<usize>,
    /// The frozen models' leaves, inputs of every step after the learning rate.
    frozen: Vec<Array>,
    /// How many metrics the loss reports after itself.
    metrics: usize,
    layout: FlatLayout,
    template: StateTemplate<P, O>,
    traces: Rc<Cell<usize>>,
    /// With the optimizer state sharded over the ranks: how it is cut.
    shard: Option<Shard>,
}

/// How a [`FlatStep`] runs.
enum FlatMode<P: Tree<Array>, O: Optimizer> {
    /// As a per-parameter step does: one function, or micro-steps and their update.
    Step(Mode),
    /// Gradients summed over the ranks during the backward pass.
    Overlap(Overlap<P, O>),
}

/// A step whose packed gradients are summed bucket by bucket ([`Reduce::Overlap`]): the
/// gradients' function, whose outputs are handed to the device one bucket at a time in the order
/// the backward pass completes them, each bucket's collective on a stream of its own, then the
/// update's function over the sums.
///
/// MLX orders each evaluation's operations itself, and would run every collective after the
/// whole backward pass; and within one evaluation an operation on another stream makes the host
/// wait for the device. Across evaluations the streams wait for each other on the device, so each
/// bucket is an evaluation of its own, then its sum another, on the second stream.
struct Overlap<P: Tree<Array>, O: Optimizer> {
    /// `[flat state..., frozen..., batch...] -> [packed weighed grads..., weighed loss,
    /// weighed metric...]`.
    gradients: PureFn,
    /// `[flat state..., lr, summed grads..., summed loss, summed metric...] -> [flat state'...,
    /// loss, grad_norm, metric...]`.
    update: PureFn,
    body: Rc<FlatBody<P, O>>,
    /// The groups, in the order the backward pass completes them.
    order: Vec<usize>,
    /// Where the collectives run.
    stream: Stream,
}

impl<P, O> FlatStep<P, O>
where
    P: Tree<Array> + Clone + 'static,
    P::Of<Option<O::Leaf>>: Clone + 'static,
    O: Optimizer,
{
    /// The step for states laid out like `state`, or `None` when its optimizer state cannot be
    /// packed ([`FlatLayout::of`]).
    ///
    /// # Errors
    /// When `options.accumulation` is zero.
    pub fn new(
        state: &TrainState<P, O>,
        optimizer: O,
        loss: impl Loss<P>,
        options: StepOptions,
    ) -> Result<Option<Self>> {
        Self::data_parallel(state, optimizer, loss, options, None)
    }

    /// The step of one rank of a data-parallel run (of a single process for `None`): the packed
    /// gradients are averaged over the ranks inside the compiled step, one collective per
    /// buffer. With `parallel.shard_optimizer` each rank holds only its part of every optimizer
    /// state buffer (ZeRO-1): the gradients are reduce-scattered, each rank updates its part of
    /// the parameters, and the parts are gathered.
    ///
    /// With gradient accumulation over `k` micro-batches two functions are compiled, as for
    /// [`TrainStep`](crate::step::TrainStep): the micro-step, which packs each micro-batch's
    /// gradients, and the update over their mean, which averages them over the ranks first: one
    /// collective per buffer and per update, not per micro-batch.
    pub fn data_parallel(
        state: &TrainState<P, O>,
        optimizer: O,
        loss: impl Loss<P>,
        options: StepOptions,
        parallel: Option<&DataParallel>,
    ) -> Result<Option<Self>> {
        let values =
            move |params: &P, batch: &[Array], key: &Array| Ok(vec![loss(params, batch, key)?]);
        Self::with_values(
            state,
            optimizer,
            Vec::new(),
            Rc::new(values),
            0,
            options,
            parallel,
        )
    }

    /// [`data_parallel`](Self::data_parallel) for a loss that reads frozen models and reports
    /// `metrics` values after itself, as
    /// [`TrainStep::data_parallel_with_frozen`](crate::step::TrainStep::data_parallel_with_frozen)
    /// takes it: the frozen models' leaves are inputs of every step, with no gradient and no
    /// optimizer state, and the metrics are averaged over the ranks with the loss. `None` also
    /// where the model has buffers, which a flat step does not write.
    pub fn data_parallel_with_frozen(
        state: &TrainState<P, O>,
        optimizer: O,
        frozen: Vec<Array>,
        loss: impl MetricsLoss<P>,
        metrics: usize,
        options: StepOptions,
        parallel: Option<&DataParallel>,
    ) -> Result<Option<Self>> {
        if crate::buffers::count(&state.params) > 0 {
            return Ok(None);
        }
        let values = frozen_values(loss, frozen.len(), metrics, 0);
        Self::with_values(
            state,
            optimizer,
            frozen,
            Rc::new(values),
            metrics,
            options,
            parallel,
        )
    }

    /// The step of `values` (`(params, frozen ++ batch, key) -> [loss, metric...]`).
    fn with_values(
        state: &TrainState<P, O>,
        optimizer: O,
        frozen: Vec<Array>,
        values: Rc<ValuesFn<P>>,
        metrics: usize,
        options: StepOptions,
        parallel: Option<&DataParallel>,
    ) -> Result<Option<Self>> {
        if options.accumulation == 0 {
            return Err(Error::Config(
                "gradient accumulation needs at least 1 micro-batch".into(),
            ));
        }
        let bucket_bytes = match parallel.map(|parallel| parallel.reduce) {
            Some(Reduce::Overlap { bucket_bytes }) => {
                if options.accumulation > 1 {
                    return Err(Error::Config(
                        "with gradient accumulation the gradients are summed once an update, \
                         after its micro-batches, not during a backward pass: sum them in the \
                         step"
                            .into(),
                    ));
                }
                Some(bucket_bytes)
            }
            _ => None,
        };
        let Some(layout) = FlatLayout::of(state, &optimizer, options.decay, bucket_bytes)? else {
            return Ok(None);
        };
        let template = state.template();
        let Some(leaf) = template.opt_leaf() else {
            return Ok(None);
        };
        let traces = Rc::new(Cell::new(0));
        let shard = parallel
            .filter(|parallel| parallel.shard_optimizer)
            .map(|parallel| Shard::new(parallel.group.clone()));
        let body = FlatBody {
            group: parallel.map(|parallel| parallel.group.clone()),
            shard: shard.clone(),
            targets: options.targets,
            layout: layout.clone(),
            template: template.clone(),
            trainable: state.specs().iter().map(|spec| spec.trainable).collect(),
            leaf,
            optimizer,
            values,
            frozen: frozen.len(),
            metrics,
            clip_norm: options.clip_norm,
            traces: traces.clone(),
        };
        let body = Rc::new(body);
        let mode = match (bucket_bytes, options.accumulation) {
            (Some(_), _) => {
                let (gradients, update) = (body.clone(), body.clone());
                body.ranks()?;
                FlatMode::Overlap(Overlap {
                    gradients: prepare(
                        move |inputs| gradients.bucket_gradients(inputs),
                        options.compile,
                    ),
                    update: prepare(move |inputs| update.summed_update(inputs), options.compile),
                    order: layout.completion_order(),
                    stream: Stream::new_with_device(&Device::try_default()?),
                    body,
                })
            }
            (None, 1) => FlatMode::Step(Mode::Fused(prepare(
                move |inputs| body.fused(inputs),
                options.compile,
            ))),
            (None, parts) => {
                let micro_body = body.clone();
                FlatMode::Step(Mode::Accumulate {
                    micro: prepare(move |inputs| micro_body.micro(inputs), options.compile),
                    apply: prepare(move |inputs| body.apply(inputs), options.compile),
                    parts,
                })
            }
        };
        Ok(Some(FlatStep {
            mode,
            targets: options.targets,
            frozen,
            metrics,
            layout,
            template,
            traces,
            shard,
        }))
    }

    /// `state` packed: the flat list this step reads and writes (with a sharded optimizer
    /// state, this rank's part of each optimizer buffer).
    pub fn pack(&self, state: &TrainState<P, O>) -> Result<Vec<Array>> {
        let mut flat = self.layout.pack(&state.flatten())?;
        if let Some(shard) = &self.shard {
            self.each_opt_buffer(&mut flat, |buffer, length| shard.slice(buffer, length))?;
        }
        Ok(flat)
    }

    /// The [`TrainState`] that the flat list `flat` holds, its arrays views of the flat buffers.
    /// With a sharded optimizer state the ranks' parts are gathered first, and evaluated: every
    /// rank must unpack at the same point of the run, as every rank takes part in the gathering.
    pub fn unpack(&self, flat: &[Array]) -> Result<TrainState<P, O>> {
        let Some(shard) = &self.shard else {
            return self.template.state(&self.layout.unpack(flat)?);
        };
        let mut whole = flat.to_vec();
        self.each_opt_buffer(&mut whole, |part, length| shard.gather(part, length))?;
        mlx_rs::transforms::eval(whole.iter())?;
        self.template.state(&self.layout.unpack(&whole)?)
    }

    /// Replaces each optimizer state buffer of `flat` by `change(buffer, its group's length)`.
    fn each_opt_buffer(
        &self,
        flat: &mut [Array],
        change: impl Fn(&Array, i32) -> Result<Array>,
    ) -> Result<()> {
        let layout = &self.layout;
        for group in 0..layout.groups.len() {
            for index in 0..layout.opt_arrays {
                let at = layout.opt_index(group, index);
                flat[at] = change(&flat[at], layout.lengths[group])?;
            }
        }
        Ok(())
    }

    /// Runs one step: `flat` becomes the next flat state (lazily: nothing is evaluated here).
    pub fn step(&mut self, flat: &mut Vec<Array>, lr: f32, batch: &[Array]) -> Result<StepMetrics> {
        let n = self.layout.len();
        let mut inputs = flat.clone();
        let mut stages = Stages::new();
        let outputs = match &mut self.mode {
            FlatMode::Overlap(overlap) => {
                inputs.extend(self.frozen.iter().cloned());
                inputs.extend(batch.iter().cloned());
                let (outputs, overlap_stages) = overlap.step(flat, lr, &inputs)?;
                stages = overlap_stages;
                outputs
            }
            FlatMode::Step(Mode::Fused(fused)) => {
                inputs.push(Array::from_f32(lr));
                inputs.extend(self.frozen.iter().cloned());
                inputs.extend(batch.iter().cloned());
                fused(&inputs)?
            }
            FlatMode::Step(Mode::Accumulate {
                micro,
                apply,
                parts,
            }) => {
                let mut fixed = inputs.clone();
                fixed.extend(self.frozen.iter().cloned());
                let (grads, loss, metrics) = accumulate(
                    micro,
                    &fixed,
                    &flat[n - 1],
                    batch,
                    *parts,
                    self.layout.groups.len(),
                    self.targets,
                )?;
                inputs.push(Array::from_f32(lr));
                inputs.extend(grads);
                inputs.push(loss);
                inputs.extend(metrics);
                inputs.extend(batch.iter().cloned());
                apply(&inputs)?
            }
        };
        let expected = n + 2 + self.metrics;
        if outputs.len() != expected {
            return Err(Error::Layout(format!(
                "the flat step returned {} arrays, expected {expected}",
                outputs.len(),
            )));
        }
        *flat = outputs[..n].to_vec();
        Ok(StepMetrics {
            loss: outputs[n].clone(),
            grad_norm: outputs[n + 1].clone(),
            metrics: outputs[n + 2..].to_vec(),
            outputs,
            stages,
        })
    }

    /// How many times the step has been traced (compiled) or run (eager).
    pub fn traces(&self) -> usize {
        self.traces.get()
    }
}

impl<P: Tree<Array>, O: Optimizer> Overlap<P, O> {
    /// One step's outputs and the stages to hand to the device before them (see [`Overlap`]),
    /// lazily: `flat` is the state, `inputs` the state, the frozen leaves and the batch.
    fn step(&mut self, flat: &[Array], lr: f32, inputs: &[Array]) -> Result<(Vec<Array>, Stages)> {
        let groups = self.order.len();
        let outputs = (self.gradients)(inputs)?;
        // After the gradients: this rank's weighed values packed (`Weight::pack_values`), then
        // its values as they are, whose shapes and dtypes the update reads the sums back into.
        let (grads, values) = outputs.split_at(groups);
        let (packed_values, own_values) = values.split_first().ok_or_else(short)?;
        let mut sums: Vec<Option<Array>> = vec![None; groups];
        let mut summed_values = None;
        let mut stages = Vec::with_capacity(2 * groups);
        let ranks = self.body.ranks()?;
        with_stream(&self.stream, || -> Result<()> {
            for (position, &index) in self.order.iter().enumerate() {
                let grad = &grads[index];
                let sum = self.body.sum_grad(ranks, index, grad)?;
                if position == 0 {
                    // The first bucket's stage runs the forward pass: the loss and metrics go
                    // with it, so that their sums too wait on the device, not on the host.
                    stages.push(std::iter::once(grad).chain(values).cloned().collect());
                    let summed = ranks.all_sum(packed_values)?;
                    stages.push(vec![summed.clone(), sum.clone()]);
                    summed_values = Some(summed);
                } else {
                    stages.push(vec![grad.clone()]);
                    stages.push(vec![sum.clone()]);
                }
                sums[index] = Some(sum);
            }
            Ok(())
        })?;
        let mut inputs = flat.to_vec();
        inputs.push(Array::from_f32(lr));
        for sum in sums {
            inputs.push(sum.ok_or_else(short)?);
        }
        inputs.push(summed_values.ok_or_else(short)?);
        inputs.extend(own_values.iter().cloned());
        Ok(((self.update)(&inputs)?, stages))
    }
}

/// The flat step's pure functions and what they need, captured by value.
struct FlatBody<P: Tree<Array>, O: Optimizer> {
    /// The ranks the gradients and loss are averaged over.
    group: Option<distributed::Group>,
    /// With the optimizer state sharded over the ranks: how it is cut.
    shard: Option<Shard>,
    /// The batch input of target ids, if the batch has one.
    targets: Option<usize>,
    layout: FlatLayout,
    template: StateTemplate<P, O>,
    trainable: Vec<bool>,
    /// An optimizer state of the right structure, to rebuild a group's state from its arrays.
    leaf: O::Leaf,
    optimizer: O,
    /// `(params, frozen ++ batch, key) -> [loss, metric...]`.
    values: Rc<ValuesFn<P>>,
    /// How many frozen leaves come before the batch.
    frozen: usize,
    /// How many metrics follow the loss.
    metrics: usize,
    clip_norm: Option<f32>,
    traces: Rc<Cell<usize>>,
}

impl<P: Tree<Array>, O: Optimizer> FlatBody<P, O> {
    /// `[flat state..., lr, frozen..., batch...] -> [flat state'..., loss, grad_norm,
    /// metric...]`.
    fn fused(&self, inputs: &[Array]) -> Result<Vec<Array>> {
        self.count_trace();
        let n = self.layout.len();
        self.check_inputs(inputs, n + 1 + self.frozen)?;
        let (state, rest) = inputs.split_at(n);
        let (lr, inputs) = (&rest[0], &rest[1..]);
        let (key, subkey) = random::split(&state[n - 1], 2)?;
        let batch = &inputs[self.frozen..];
        // Over ranks, each rank's gradients are weighed by its weight in the global batch as they
        // are packed, before they are summed.
        let weight = match &self.group {
            Some(group) => Some(distributed::Weight::of(group, self.targets_in(batch))?),
            None => None,
        };
        let (grads, grad_norm, values) =
            self.gradients(state, inputs, &subkey, weight.as_ref().map(|w| w.local()))?;
        self.update(state, lr, key, grads, grad_norm, values, batch, weight)
    }

    /// `[flat state..., frozen..., micro-batch..., key] -> [packed grads..., loss, metric...]`.
    fn micro(&self, inputs: &[Array]) -> Result<Vec<Array>> {
        self.count_trace();
        let n = self.layout.len();
        self.check_inputs(inputs, n + 1 + self.frozen)?;
        let (state, rest) = inputs.split_at(n);
        let (inputs, key) = rest.split_at(rest.len() - 1);
        let (mut grads, _, values) = self.gradients(state, inputs, &key[0], None)?;
        grads.extend(values);
        Ok(grads)
    }

    /// `[flat state..., lr, packed mean grads..., mean loss, mean metric..., batch...] -> [flat
    /// state'..., loss, grad_norm, metric...]`: the update over the micro-batches' mean (the
    /// batch is read for its targets, this rank's share of the ranks' kept ones).
    fn apply(&self, inputs: &[Array]) -> Result<Vec<Array>> {
        self.count_trace();
        let n = self.layout.len();
        let groups = self.layout.groups.len();
        self.check_inputs(inputs, n + groups + 2 + self.metrics)?;
        let (state, rest) = inputs.split_at(n);
        let (lr, rest) = (&rest[0], &rest[1..]);
        let (grads, rest) = rest.split_at(groups);
        let (values, batch) = rest.split_at(1 + self.metrics);
        let (key, _) = random::split(&state[n - 1], 2)?;
        let grad_norm = clip::global_norm(grads)?;
        self.update(
            state,
            lr,
            key,
            grads.to_vec(),
            grad_norm,
            values.to_vec(),
            batch,
            None,
        )
    }

    /// `[flat state..., frozen..., batch...] -> [packed grads..., packed values, loss,
    /// metric...]`: the gradients weighed by this rank's [`Weight`](distributed::Weight) in the
    /// global batch and its weight and weighed values packed, what the rank adds to the sums over
    /// the ranks ([`Overlap`]), then its own values.
    fn bucket_gradients(&self, inputs: &[Array]) -> Result<Vec<Array>> {
        self.count_trace();
        let n = self.layout.len();
        self.check_inputs(inputs, n + self.frozen)?;
        let (state, inputs) = inputs.split_at(n);
        let group = self.ranks()?;
        let (_, subkey) = random::split(&state[n - 1], 2)?;
        let weight = distributed::Weight::of(group, self.targets_in(&inputs[self.frozen..]))?;
        let (mut grads, _, values) =
            self.gradients(state, inputs, &subkey, Some(weight.local()))?;
        grads.push(weight.pack_values(&values)?);
        grads.extend(values);
        Ok(grads)
    }

    /// `[flat state..., lr, summed grads..., summed packed values, loss, metric...] -> [flat
    /// state'..., loss, grad_norm, metric...]`: the update over the sums of
    /// [`bucket_gradients`](Self::bucket_gradients)' outputs ([`Overlap`]; with a sharded
    /// optimizer state each summed gradient is this rank's part), the rank's own values read
    /// for their shapes and dtypes.
    fn summed_update(&self, inputs: &[Array]) -> Result<Vec<Array>> {
        self.count_trace();
        let n = self.layout.len();
        let groups = self.layout.groups.len();
        self.check_inputs(inputs, n + 1 + groups + 2 + self.metrics)?;
        let (state, rest) = inputs.split_at(n);
        let (lr, rest) = (&rest[0], &rest[1..]);
        let (grads, rest) = rest.split_at(groups);
        let (summed, own) = (&rest[0], &rest[1..]);
        let (values, mean) = distributed::mean_values(summed, own, self.targets.is_some())?;
        let (key, _) = random::split(&state[n - 1], 2)?;
        let group = self.ranks()?;
        let grad_norm = self.summed_norm(group, grads)?;
        self.descend(state, lr, key, grads.to_vec(), grad_norm, values, mean)
    }

    /// The ranks the gradients are summed over: those of a step made for several.
    fn ranks(&self) -> Result<&distributed::Group> {
        self.group.as_ref().ok_or_else(|| {
            Error::Config("the gradients are summed over ranks, and there are none".into())
        })
    }

    /// Group `index`'s packed gradient `grad` summed over the ranks of `group`; with a sharded
    /// optimizer state, this rank's part of the sum.
    fn sum_grad(&self, group: &distributed::Group, index: usize, grad: &Array) -> Result<Array> {
        match &self.shard {
            None => group.all_sum(grad),
            Some(shard) => shard.sum_scatter(grad, self.layout.lengths[index]),
        }
    }

    /// The global norm of the summed gradients `grads` ([`sum_grad`](Self::sum_grad)'s).
    fn summed_norm(&self, group: &distributed::Group, grads: &[Array]) -> Result<Array> {
        let local = clip::global_norm(grads)?;
        match &self.shard {
            None => Ok(local),
            Some(_) => Ok(group.all_sum(&local.multiply(&local)?)?.sqrt()?),
        }
    }

    /// The batch input of target ids in `batch`, if the step has one.
    fn targets_in<'a>(&self, batch: &'a [Array]) -> Option<&'a Array> {
        self.targets.and_then(|index| batch.get(index))
    }

    fn count_trace(&self) {
        self.traces.set(self.traces.get() + 1);
    }

    fn check_inputs(&self, inputs: &[Array], needed: usize) -> Result<()> {
        if inputs.len() < needed {
            return Err(Error::Layout(format!(
                "the flat step needs at least {needed} inputs, got {}",
                inputs.len()
            )));
        }
        Ok(())
    }

    /// The loss and its metrics at the parameters of the flat `state` on `inputs` (the frozen
    /// leaves, then the batch), and the loss's gradients packed by group with their global norm:
    /// `(grads, grad_norm, [loss, metric...])`.
    fn gradients(
        &self,
        state: &[Array],
        inputs: &[Array],
        key: &Array,
        weight: Option<&Array>,
    ) -> Result<(Vec<Array>, Array, Vec<Array>)> {
        let params = self.layout.params(state)?;
        let (values, grads) = values_and_grads(
            &self.template,
            &*self.values,
            &self.trainable,
            &params,
            inputs,
            key,
        )?;
        let (grads, grad_norm) = self.layout.pack_grads(&grads, weight)?;
        Ok((grads, grad_norm, values))
    }

    /// Averages the packed gradients `grads` (of global norm `grad_norm`) and `values` (the
    /// loss and its metrics) over the ranks, clips and applies the optimizer: `[flat state'...,
    /// loss, grad_norm, metric...]`, the state's key carried on as `key`. `weighed` is this
    /// rank's weight in the global batch when `grads` were weighed by it as they were packed
    /// ([`fused`](Self::fused)), `None` when they are this rank's own means.
    #[allow(clippy::too_many_arguments)]
    fn update(
        &self,
        state: &[Array],
        lr: &Array,
        key: Array,
        grads: Vec<Array>,
        grad_norm: Array,
        values: Vec<Array>,
        batch: &[Array],
        weighed: Option<distributed::Weight>,
    ) -> Result<Vec<Array>> {
        let (grads, grad_norm, values, mean) = match &self.group {
            None => (grads, grad_norm, values, None),
            Some(group) => {
                let (weight, grads) = match weighed {
                    Some(weight) => (weight, grads),
                    None => {
                        let weight = distributed::Weight::of(group, self.targets_in(batch))?;
                        let grads = grads
                            .iter()
                            .map(|grad| distributed::weigh(grad, weight.local()))
                            .collect::<Result<Vec<_>>>()?;
                        (weight, grads)
                    }
                };
                let (values, mean) = weight.sum_values(group, &values)?;
                let grads = grads
                    .iter()
                    .enumerate()
                    .map(|(index, grad)| self.sum_grad(group, index, grad))
                    .collect::<Result<Vec<_>>>()?;
                let norm = self.summed_norm(group, &grads)?;
                (grads, norm, values, mean)
            }
        };
        self.descend(state, lr, key, grads, grad_norm, values, mean)
    }

    /// Clips the gradients `grads` (of global norm `grad_norm`; summed over the ranks if there
    /// are several, whose `mean` makes them the global batch's) and applies the optimizer:
    /// `[flat state'..., loss, grad_norm, metric...]`, the state's key carried on as `key`.
    #[allow(clippy::too_many_arguments)]
    fn descend(
        &self,
        state: &[Array],
        lr: &Array,
        key: Array,
        grads: Vec<Array>,
        grad_norm: Array,
        values: Vec<Array>,
        mean: distributed::Mean,
    ) -> Result<Vec<Array>> {
        let layout = &self.layout;
        let n = layout.len();
        let grad_norm = match &mean {
            Some(mean) => grad_norm.multiply(mean)?,
            None => grad_norm,
        };
        // The mean's factor and the clip's are one scalar, so the gradients are scaled once.
        let clip = self
            .clip_norm
            .map(|max_norm| clip::clip_scale(&grad_norm, max_norm))
            .transpose()?;
        let scale = match (clip, mean) {
            (Some(clip), Some(mean)) => Some(clip.multiply(mean)?),
            (clip, mean) => clip.or(mean),
        };
        let grads = match scale {
            Some(scale) => clip::scale(&grads, &scale)?,
            None => grads,
        };
        let step = state[n - 2].add(Array::from_f32(1.0))?;
        let scalars = StepScalars { lr, step: &step };
        let groups = layout.groups.len();
        let mut params = Vec::with_capacity(groups);
        let mut opt = Vec::with_capacity(groups * layout.opt_arrays);
        for (index, (group, grad)) in layout.groups.iter().zip(&grads).enumerate() {
            let first = layout.opt_index(index, 0);
            let leaf = self
                .leaf
                .rebuild_from(&mut state[first..first + layout.opt_arrays].iter().cloned());
            let length = layout.lengths[index];
            let param = match &self.shard {
                Some(shard) => shard.slice(&state[index], length)?,
                None => state[index].clone(),
            };
            let (param, leaf) = self
                .optimizer
                .update(&param, grad, &leaf, scalars, group.decay)?;
            params.push(match &self.shard {
                Some(shard) => shard.gather(&param, length)?,
                None => param,
            });
            leaf.push_arrays(&mut opt);
        }
        let mut outputs = params;
        outputs.extend(opt);
        outputs.extend(state[n - 2 - layout.frozen..n - 2].iter().cloned());
        let mut values = values.into_iter();
        let loss = values
            .next()
            .ok_or_else(|| Error::Layout("the loss returned nothing".into()))?;
        outputs.extend([step, key, loss, grad_norm]);
        outputs.extend(values);
        Ok(outputs)
    }
}
