//! The training loop.

use super::callbacks::{Callback, Control, EvalReport, StepReport};
use super::memory_cap::{self, MemoryCap};
use super::staged::StagedBatches;
use super::stepper::Stepper;
use super::{Objective, ObjectiveLoss, Overlap, TrainConfig};
use crate::checkpoint::{self, Checkpoints, FrozenLeaves};
use crate::data::{BatchIterator, BatchPosition, Order, Rows, Windows};
use crate::distributed::{DataParallel, DistributedError};
use crate::error::{Error, Result};
use crate::model::{LanguageModel, TrainingStep};
use crate::state::{StateTemplate, TrainState};
use crate::step::{StepMetrics, StepOptions};
use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::transforms::{async_eval, compile::compile, eval};
use mlx_rs::Array;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

type Params<S> = <<S as TrainingStep>::Model as LanguageModel>::Params;
type ModelConfig<S> = <<S as TrainingStep>::Model as LanguageModel>::Config;
type EvalFn = Box<dyn FnMut(&[Array]) -> std::result::Result<Vec<Array>, Exception>>;

/// How a run ended.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainSummary {
    /// Updates made, in this run and the runs it resumed.
    pub steps: u64,
    /// The last training loss.
    pub last_loss: f32,
    /// The last validation loss, if the run evaluated.
    pub last_val_loss: Option<f32>,
    /// Why the run stopped before its last step, if it did.
    pub stopped: Option<String>,
    /// The checkpoint written last.
    pub checkpoint: Option<PathBuf>,
}

/// What a run trains and validates on.
#[derive(Clone, Debug)]
pub struct TrainData {
    /// The training rows.
    pub train: Arc<dyn Rows>,
    /// The validation rows, if the run validates.
    pub validation: Option<Arc<dyn Rows>>,
}

impl TrainData {
    /// A corpus's windows, the last `fraction` of them kept for validation (none for 0), once
    /// every id is known to be below `vocab`: checked before the split, so that an error names
    /// the id's place in the whole stream (and comes before any complaint about the split).
    pub fn split(windows: Windows, fraction: f64, vocab: usize) -> Result<TrainData> {
        windows.check_vocab(vocab)?;
        if fraction <= 0.0 {
            return Ok(TrainData {
                train: Arc::new(windows),
                validation: None,
            });
        }
        let split = windows.split(fraction)?;
        Ok(TrainData {
            train: Arc::new(split.train),
            validation: split.validation.map(|rows| Arc::new(rows) as Arc<dyn Rows>),
        })
    }
}

/// A step dispatched to the device whose loss the host has not read yet.
struct InFlight {
    step: u64,
    /// When the loop began building it: the step's time runs from here to the start of the
    /// next step's building, or, where the loop waits for it at a boundary, to its loss read.
    started: Instant,
    loss: Array,
    grad_norm: Array,
    /// The objective's own metrics, in the order of `Trainer::metric_names`.
    metrics: Vec<Array>,
    lr: f32,
    build_s: f64,
    submit_s: f64,
    /// In a data-parallel run: how many ranks had been asked to stop when it was dispatched.
    stop_votes: Option<Array>,
}

/// What a run has seen so far.
struct Progress {
    started: Instant,
    last_loss: f32,
    last_val_loss: Option<f32>,
    stopped: Option<String>,
    last_checkpoint: Option<PathBuf>,
}

/// Trains the model of a declared [`TrainingStep`] on token windows.
pub struct Trainer<S: TrainingStep> {
    model: ModelConfig<S>,
    config: TrainConfig,
    stepper: Stepper<Params<S>, S::Optimizer>,
    evaluate: EvalFn,
    train_batches: BatchIterator,
    validation: Option<Arc<dyn Rows>>,
    checkpoints: Checkpoints,
    callbacks: Vec<Box<dyn Callback>>,
    stop: Option<Arc<AtomicBool>>,
    done: u64,
    flops_per_token: f64,
    /// The objective's frozen leaves (none without one), inputs of validation after the
    /// parameters.
    frozen: Vec<Array>,
    /// Whether validation weighs each batch by its kept targets (the loss is a mean over them).
    by_targets: bool,
    /// The names of the objective's own metrics, which each step returns after its loss.
    metric_names: &'static [&'static str],
    /// The ranks this process trains with, each on its part of every batch.
    parallel: Option<DataParallel>,
}

impl<S: TrainingStep> Trainer<S>
where
    <Params<S> as crate::tree::Tree<Array>>::Of<
        Option<<S::Optimizer as crate::optim::Optimizer>::Leaf>,
    >: Clone + 'static,
{
    /// A fresh run: parameters initialised from `config.seed`, the optimizer's state created
    /// before the step is traced, the windows split into training and validation.
    pub fn new(model: ModelConfig<S>, config: TrainConfig, windows: Windows) -> Result<Self> {
        config.validate()?;
        S::Model::validate(&model)?;
        let vocab = S::Model::vocab_size(&model);
        let data = TrainData::split(windows, config.validation_fraction, vocab)?;
        Self::with_data(model, config, data)
    }

    /// A fresh run over rows of one's own (supervised examples, [`SftRows`](crate::data::SftRows)):
    /// `config.validation_fraction` is not used, `data.validation` is the validation set.
    pub fn with_data(model: ModelConfig<S>, config: TrainConfig, data: TrainData) -> Result<Self> {
        Self::starting_from(model, config, data, None, None, None)
    }

    /// A fresh run from `params` (a published model's weights) instead of initialised ones,
    /// cast to the run's precision; the optimizer's state is fresh.
    pub fn with_params(
        model: ModelConfig<S>,
        config: TrainConfig,
        data: TrainData,
        params: Params<S>,
    ) -> Result<Self> {
        Self::starting_from(model, config, data, Some(params), None, None)
    }

    /// A fresh run from `params` that trains `objective` (DPO against a frozen reference,
    /// distillation from a frozen teacher) instead of the step's own loss: the step's optimizer,
    /// clipping and accumulation, the objective's loss in training and validation, its frozen
    /// models as inputs of both. Checkpoints hold the trained state alone; a resumed run is
    /// given the same objective again.
    pub fn with_objective(
        model: ModelConfig<S>,
        config: TrainConfig,
        data: TrainData,
        params: Params<S>,
        objective: Objective<S::Model>,
    ) -> Result<Self> {
        Self::starting_from(model, config, data, Some(params), Some(objective), None)
    }

    /// A fresh run (from `params` if given) of one rank of a data-parallel run. Every rank
    /// draws the same batches of `config.batch_size` rows and trains on its own equal part of
    /// each; the gradients and the loss are averaged over the ranks, so that every rank makes
    /// the update one process would make on the whole batch and holds the same state. Metrics
    /// are the whole batch's; only rank 0 writes checkpoints.
    pub fn data_parallel(
        model: ModelConfig<S>,
        config: TrainConfig,
        data: TrainData,
        params: Option<Params<S>>,
        parallel: DataParallel,
    ) -> Result<Self> {
        Self::ranks_share(&config, &parallel)?;
        Self::starting_from(model, config, data, params, None, Some(parallel))
    }

    /// [`data_parallel`](Self::data_parallel) training on `objective`, as
    /// [`with_objective`](Self::with_objective): every rank holds the frozen models whole, and
    /// the loss's metrics are averaged over the ranks as the loss is.
    pub fn data_parallel_with_objective(
        model: ModelConfig<S>,
        config: TrainConfig,
        data: TrainData,
        params: Params<S>,
        objective: Objective<S::Model>,
        parallel: DataParallel,
    ) -> Result<Self> {
        Self::ranks_share(&config, &parallel)?;
        Self::starting_from(
            model,
            config,
            data,
            Some(params),
            Some(objective),
            Some(parallel),
        )
    }

    /// Fails unless the ranks can share every batch evenly.
    fn ranks_share(config: &TrainConfig, parallel: &DataParallel) -> Result<()> {
        let ranks = parallel.group.size();
        if config.batch_size % ranks != 0 {
            return Err(DistributedError::Uneven {
                what: "batch_size",
                value: config.batch_size,
                ranks,
            }
            .into());
        }
        Ok(())
    }

    fn starting_from(
        model: ModelConfig<S>,
        config: TrainConfig,
        data: TrainData,
        params: Option<Params<S>>,
        objective: Option<Objective<S::Model>>,
        parallel: Option<DataParallel>,
    ) -> Result<Self> {
        config.validate()?;
        S::Model::validate(&model)?;
        // An id past the vocabulary would read the embedding out of bounds on the device.
        let vocab = S::Model::vocab_size(&model);
        data.train.check_vocab(vocab)?;
        if let Some(validation) = &data.validation {
            validation.check_vocab(vocab)?;
        }
        let params = match params {
            Some(params) => params,
            None => S::Model::init(&model, config.seed)?,
        };
        // A step's declared frozen models are copies of the run's start unless the caller's
        // objective says otherwise (a resumed run of the command line passes its start again).
        let objective = objective.or_else(|| Objective::declared::<S>(&params));
        let params = config.precision.cast(&params)?;
        let optimizer = S::optimizer();
        let state = TrainState::new(params, &optimizer, config.seed)?;
        let declared = S::options();
        let options = StepOptions {
            compile: config.compile,
            decay: config.decay,
            accumulation: config.accumulation.unwrap_or(declared.accumulation),
            // The trainer's batch is `[inputs, targets]`.
            targets: Some(1),
            ..declared
        };
        let loss_model = model.clone();
        let precision = config.precision;
        let frozen = match &objective {
            Some(objective) => objective.frozen_for(precision)?,
            None => Vec::new(),
        };
        let by_targets = objective
            .as_ref()
            .is_none_or(|objective| objective.mean_over_targets);
        let options = StepOptions {
            targets: options.targets.filter(|_| by_targets),
            ..options
        };
        let metric_names = objective
            .as_ref()
            .map_or(&[][..], |objective| objective.metrics);
        let objective_loss = objective.map(|objective| objective.loss);
        let evaluate = evaluation::<S>(
            state.template(),
            model.clone(),
            &config,
            objective_loss.clone().map(|loss| (loss, frozen.len())),
        );
        let flops_per_token = S::Model::flops_per_token(&state.params, &model, config.seq_len);
        let stepper = match objective_loss {
            None => Stepper::new(
                state,
                optimizer,
                move |params: &Params<S>, batch: &[Array], key: &Array| {
                    S::loss(
                        &precision.for_compute(params)?,
                        &loss_model,
                        batch,
                        Some(key),
                    )
                },
                options,
                config.state_packing,
                parallel.as_ref(),
            )?,
            Some(loss) => Stepper::with_frozen(
                state,
                optimizer,
                frozen.clone(),
                move |params: &Params<S>, frozen: &[Array], batch: &[Array], key: &Array| {
                    loss(
                        &precision.for_compute(params)?,
                        &loss_model,
                        frozen,
                        batch,
                        Some(key),
                    )
                },
                metric_names.len(),
                options,
                config.state_packing,
                parallel.as_ref(),
            )?,
        };
        let validation = data.validation;
        let order = match data.train.in_order() {
            true => Order::Sequential,
            false => Order::Shuffled,
        };
        let train_batches = BatchIterator::over(data.train, config.batch_size, order, config.seed)?;
        let checkpoints =
            Checkpoints::new(config.out_dir.join("checkpoints")).keep_last(config.keep_checkpoints);
        Ok(Trainer {
            model,
            config,
            stepper,
            evaluate,
            train_batches,
            validation,
            checkpoints,
            callbacks: Vec::new(),
            stop: None,
            done: 0,
            flops_per_token,
            frozen,
            by_targets,
            metric_names,
            parallel,
        })
    }

    /// Adds a callback; they run in the order added.
    pub fn add_callback(&mut self, callback: impl Callback + 'static) {
        self.callbacks.push(Box::new(callback));
    }

    /// Stops the run at the next step boundary once `flag` is set (by a signal handler, another
    /// thread, a user interface): the step in flight is finished, a checkpoint saved, and
    /// [`run`](Self::run) returns with [`TrainSummary::stopped`] set.
    pub fn stop_when(&mut self, flag: Arc<AtomicBool>) {
        self.stop = Some(flag);
    }

    /// The training state (parameters, optimizer state, step, key). With a flat state
    /// ([`StatePacking`](super::StatePacking)) its arrays are views of the flat buffers, made on
    /// the first call after a step.
    pub fn state(&self) -> &TrainState<Params<S>, S::Optimizer> {
        self.stepper.state()
    }

    /// Whether the step's state is packed flat ([`StatePacking`](super::StatePacking)).
    pub fn flat_state(&self) -> bool {
        self.stepper.is_flat()
    }

    /// The model's configuration.
    pub fn model_config(&self) -> &ModelConfig<S> {
        &self.model
    }

    /// Updates made so far.
    pub fn steps_done(&self) -> u64 {
        self.done
    }

    /// How many times the step has been traced.
    pub fn traces(&self) -> usize {
        self.stepper.traces()
    }

    /// Continues from the checkpoint in `dir`: state, step and data position, so that the rest of
    /// the run computes exactly what an uninterrupted run would have.
    pub fn resume(&mut self, dir: &Path) -> Result<()> {
        let trainer = self
            .stepper
            .change_state(|state| checkpoint::load(dir, state))?;
        self.done = recorded(dir, &trainer, "step")?;
        let position: BatchPosition = recorded(dir, &trainer, "data_position")?;
        self.train_batches.seek(position)?;
        Ok(())
    }

    /// The most recent checkpoint of this run's directory, if any.
    pub fn latest_checkpoint(&self) -> Result<Option<PathBuf>> {
        self.checkpoints.latest()
    }

    /// Saves checkpoints without the frozen parameters ([`FrozenLeaves::Omitted`]): for a run
    /// whose frozen base its readers load again from where it came (a LoRA run over a Hugging
    /// Face folder). [`resume`](Self::resume) then keeps the state's own frozen leaves.
    pub fn omit_frozen_from_checkpoints(&mut self) {
        self.checkpoints = self.checkpoints.clone().frozen(FrozenLeaves::Omitted);
    }

    /// Trains until `config.steps` updates are made, a callback or the [stop
    /// flag](Self::stop_when) stops the run, or the loss stops being finite (an error naming the
    /// step and the checkpoint to continue from). Called again after a
    /// stop, it goes on with the batches an unstopped run would have trained on.
    ///
    /// Unless `config.overlap` is [`Overlap::Off`], the loop builds the graph of step `n + 1`
    /// while the device computes step `n`, and reads step `n`'s loss after that. With
    /// [`Overlap::Build`] it hands step `n + 1` to the device only then, so at most one step is on
    /// the device; with [`Overlap::Submit`] it hands it over first, so the device never waits for
    /// the host and two steps can be on it at once; on CUDA within the memory of one step, after
    /// its first steps run one at a time to measure it (`train/memory_cap.rs`). It waits for the
    /// device only where it must:
    /// at validation, at checkpoints and at the end. A non-finite loss stops the run at once:
    /// `steps_done` is then the step that made it, and the step built after it is not counted,
    /// although [`state`](Self::state) already holds that step's outputs.
    pub fn run(&mut self) -> Result<TrainSummary> {
        let mut progress = Progress {
            started: Instant::now(),
            last_loss: f32::NAN,
            last_val_loss: None,
            stopped: None,
            last_checkpoint: self.checkpoints.latest()?,
        };
        let mut batches = StagedBatches::new(
            self.own_rows(),
            self.config.seq_len,
            crate::cuda::available(),
        );
        let steps = self.config.steps;
        let remaining = |done: u64| steps.saturating_sub(done);
        // Where the batch of the step after the last one run comes from.
        let mut resume_at = batches.position(&self.train_batches);
        let mut next = batches.next(&mut self.train_batches, remaining(self.done))?;
        let mut in_flight: Option<InFlight> = None;
        // `Submit` on CUDA starts in `Build` order and keeps within one step's memory after.
        let capped = self.config.overlap == Overlap::Submit && crate::cuda::available();
        let mut cap: Option<MemoryCap> = None;
        let started_at = self.done;
        while self.done < self.config.steps && progress.stopped.is_none() {
            let building = Instant::now();
            let lr = self.config.schedule.lr(self.done);
            let batch = self.at_stage_length(&next);
            let mut metrics = self.stepper.step(lr, &batch)?;
            let stop_votes = self.stop_votes()?;
            // The vote's sum goes to the device with the step: evaluated only when it is read,
            // after the next step was handed over, it would queue behind that step and make the
            // host wait for it before building the one after (two H100s: 8 ms a step).
            let build_s = building.elapsed().as_secs_f64();
            let overlap = match self.config.overlap {
                Overlap::Submit if capped && cap.is_none() => Overlap::Build,
                overlap => overlap,
            };
            let mut submit_s = 0.0;
            if overlap == Overlap::Submit {
                submit_s = submit(&mut metrics, stop_votes.as_slice())?;
            }
            if let Some(previous) = in_flight.take() {
                self.report(previous, Some(building), &mut progress)?;
            }
            if capped && cap.is_none() && self.done - started_at == memory_cap::PROBE_STEPS {
                cap = Some(MemoryCap::over_peak()?);
            }
            match overlap {
                Overlap::Off => submit_s = run_now(&mut metrics, stop_votes.as_slice())?,
                Overlap::Build => submit_s = submit(&mut metrics, stop_votes.as_slice())?,
                Overlap::Submit => {}
            }
            self.done += 1;
            in_flight = Some(InFlight {
                step: self.done,
                started: building,
                loss: metrics.loss,
                grad_norm: metrics.grad_norm,
                metrics: metrics.metrics,
                lr,
                build_s,
                submit_s,
                stop_votes,
            });
            // The position before `next` is drawn: resuming from this step draws it again.
            resume_at = batches.position(&self.train_batches);
            if self.done < self.config.steps {
                next = batches.next(&mut self.train_batches, remaining(self.done))?;
            }
            if self.parallel.is_none()
                && self
                    .stop
                    .as_ref()
                    .is_some_and(|flag| flag.load(Ordering::SeqCst))
            {
                progress
                    .stopped
                    .get_or_insert_with(|| "stopped on request".into());
            }
            if self.config.overlap == Overlap::Off
                || self.at_boundary()
                || progress.stopped.is_some()
            {
                if let Some(current) = in_flight.take() {
                    self.report(current, None, &mut progress)?;
                }
                self.boundary(resume_at, &next, &mut progress)?;
            }
        }
        // The batches drawn ahead go back, so that another `run` after a stop trains on them.
        self.train_batches.seek(resume_at)?;
        for callback in &mut self.callbacks {
            callback.on_end()?;
        }
        Ok(TrainSummary {
            steps: self.done,
            last_loss: progress.last_loss,
            last_val_loss: progress.last_val_loss,
            stopped: progress.stopped,
            checkpoint: progress.last_checkpoint,
        })
    }

    /// In a data-parallel run, the count over the ranks of those whose stop flag is set, summed
    /// behind the step just built (handed to the device with it): read with its loss, the same
    /// on every rank, so that every rank stops after the same step (a signal reaches the ranks at
    /// different times).
    fn stop_votes(&self) -> Result<Option<Array>> {
        let Some(parallel) = &self.parallel else {
            return Ok(None);
        };
        let asked = self
            .stop
            .as_ref()
            .is_some_and(|flag| flag.load(Ordering::SeqCst));
        Ok(Some(
            parallel.group.all_sum(&Array::from_int(i32::from(asked)))?,
        ))
    }

    /// Whether the step just dispatched ends the run or is due for validation or a checkpoint.
    fn at_boundary(&self) -> bool {
        let due = |every: u64| every > 0 && self.done % every == 0;
        self.done == self.config.steps
            || due(self.config.eval_every)
            || due(self.config.checkpoint_every)
    }

    /// Reads a step's loss and gradient norm (waiting for the device if it must) and tells the
    /// callbacks. The step's time ends at `ended` (the next step's start), or once its loss is
    /// read.
    ///
    /// A step's time is the host loop's time for it, from its start to the next one's, which in
    /// a steady run is one step of the device's pipeline whatever the overlap. Timing it from the
    /// previous report instead would be wrong where two reports follow each other: at a
    /// boundary the step drained there would get only the wait for its tail, near zero where
    /// its work was done while handing it over, and with it a throughput a thousand times too
    /// high.
    fn report(
        &mut self,
        step: InFlight,
        ended: Option<Instant>,
        progress: &mut Progress,
    ) -> Result<()> {
        let waiting = Instant::now();
        // Evaluated here so that a failed collective (a rank lost) is an error, not a panic.
        eval(
            [&step.loss, &step.grad_norm]
                .into_iter()
                .chain(&step.metrics),
        )?;
        let loss = step.loss.item_exact::<f32>();
        let grad_norm = step.grad_norm.item_exact::<f32>();
        let metrics = self
            .metric_names
            .iter()
            .copied()
            .zip(step.metrics.iter().map(|metric| metric.item_exact::<f32>()))
            .collect();
        if let Some(votes) = &step.stop_votes {
            eval([votes])?;
            if votes.item_exact::<i32>() > 0 {
                progress
                    .stopped
                    .get_or_insert_with(|| "stopped on request".into());
            }
        }
        let wait_s = waiting.elapsed().as_secs_f64();
        if !loss.is_finite() {
            return Err(Error::Diverged {
                loss,
                step: step.step,
                resume_from: self.checkpoints.last_sane()?,
            });
        }
        progress.last_loss = loss;
        let ended = ended.unwrap_or_else(Instant::now);
        let seconds = ended.duration_since(step.started).as_secs_f64();
        // A length stage trains on fewer tokens of each window than `seq_len`.
        let length = match &self.config.length_stages {
            Some(stages) => stages.length(step.step as usize - 1),
            None => self.config.seq_len,
        };
        let tokens_per_s = (self.config.batch_size * length) as f64 / seconds;
        let report = StepReport {
            step: step.step,
            total_steps: self.config.steps,
            loss,
            grad_norm,
            metrics,
            lr: step.lr,
            tokens_per_s,
            build_ms: step.build_s * 1e3,
            submit_ms: step.submit_s * 1e3,
            wait_ms: wait_s * 1e3,
            mfu: (self.config.peak_tflops > 0.0)
                .then(|| self.flops_per_token * tokens_per_s / (self.config.peak_tflops * 1e12)),
            peak_memory_mib: mlx_rs::memory::peak_memory()? as f64 / (1024.0 * 1024.0),
            elapsed_s: progress.started.elapsed().as_secs_f64(),
        };
        for callback in &mut self.callbacks {
            if let Control::Stop(reason) = callback.on_step(&report)? {
                progress.stopped.get_or_insert(reason);
            }
        }
        Ok(())
    }

    /// Validation and checkpoints after the last dispatched step, with nothing in flight; `next`
    /// is the batch of the step after it (the last step's at the end of the run).
    fn boundary(
        &mut self,
        position: BatchPosition,
        next: &(Array, Array),
        progress: &mut Progress,
    ) -> Result<()> {
        let done = self.done;
        let at_end = done == self.config.steps;
        let due = |every: u64| every > 0 && done % every == 0;
        if self.config.eval_every > 0 && (due(self.config.eval_every) || at_end) {
            if let Some(val_loss) = self.validation_loss()? {
                progress.last_val_loss = Some(val_loss);
                let report = EvalReport {
                    step: self.done,
                    val_loss,
                };
                for callback in &mut self.callbacks {
                    if let Control::Stop(reason) = callback.on_eval(&report)? {
                        progress.stopped.get_or_insert(reason);
                    }
                }
            }
        }
        if due(self.config.checkpoint_every) || at_end || progress.stopped.is_some() {
            progress.last_checkpoint = Some(self.save_checkpoint(position, next)?);
        }
        Ok(())
    }

    /// The mean loss over the kept targets of up to `eval_batches` validation batches, in
    /// order: each batch's mean weighed by its share of them (mlx-lm's `evaluate`). Every
    /// weight is exactly 1 where the batches keep as many targets as each other (windows of a
    /// corpus), which makes it the plain mean of the batches' losses.
    pub fn validation_loss(&mut self) -> Result<Option<f32>> {
        let Some(rows) = &self.validation else {
            return Ok(None);
        };
        let batch_size = self.config.batch_size.min(rows.count());
        if batch_size == 0 {
            return Ok(None);
        }
        let mut batches = BatchIterator::over(rows.clone(), batch_size, Order::Sequential, 0)?;
        let count = self
            .config
            .eval_batches
            .clamp(1, batches.batches_per_epoch().max(1));
        let params = crate::tree::flatten(&self.state().params);
        let full = (batch_size * rows.seq_len()) as f32;
        let (mut total, mut weights) = (0.0f32, 0.0f32);
        for _ in 0..count {
            let batch = batches.next_batch()?;
            let weight = if self.by_targets {
                batch.kept_targets() as f32 / full
            } else {
                1.0
            };
            let (inputs, targets) = batch.to_arrays();
            let mut args = params.clone();
            args.extend(self.frozen.iter().cloned());
            args.extend([inputs, targets]);
            let loss = (self.evaluate)(&args)?.remove(0);
            eval([&loss])?;
            total += loss.item_exact::<f32>() * weight;
            weights += weight;
        }
        Ok((weights > 0.0).then(|| total / weights))
    }

    /// The loss of the current parameters on `batch`, computed as validation computes it.
    fn loss_on(&mut self, batch: &(Array, Array)) -> Result<f32> {
        let mut args = crate::tree::flatten(&self.state().params);
        args.extend(self.frozen.iter().cloned());
        args.extend([batch.0.clone(), batch.1.clone()]);
        let loss = (self.evaluate)(&args)?.remove(0);
        eval([&loss])?;
        Ok(loss.item_exact::<f32>())
    }

    /// Saves the checkpoint of the current step. Its `trainer.json` records the loss of its own
    /// parameters, on `next`, the batch of the step after it: the loss the step after it would
    /// report. The loss a step reports is that of the parameters before its update, so the
    /// last reported loss says nothing of an update that blew the parameters up; pruning and a
    /// diverged run's message go by this one (`checkpoint::Checkpoints::last_sane`).
    fn save_checkpoint(
        &mut self,
        position: BatchPosition,
        next: &(Array, Array),
    ) -> Result<PathBuf> {
        // Every rank takes the state, whose optimizer buffers a sharded state gathers from all.
        self.state();
        let next = self.whole_batch(next)?;
        if self.parallel.as_ref().is_some_and(|p| p.group.rank() != 0) {
            return Ok(self.checkpoints.dir(self.done));
        }
        let loss = self.loss_on(&next)?;
        let mut trainer = serde_json::json!({
            "step": self.done,
            "data_position": position,
            "schedule": self.config.schedule,
            "train_config": self.config,
            "model": S::Model::NAME,
            "model_config": self.model,
            "step_name": S::NAME,
        });
        // A non-finite loss is recorded as null: no candidate to continue from.
        trainer[checkpoint::LOSS_FIELD] = loss.into();
        self.checkpoints.save(self.done, self.state(), &trainer)
    }
}

impl<S: TrainingStep> Trainer<S> {
    /// The batch of the next step at its length stage: the first `length(step)` tokens of each
    /// row (every row when the run declares no stages).
    fn at_stage_length(&self, (inputs, targets): &(Array, Array)) -> Vec<Array> {
        let parts = [inputs, targets];
        let Some(stages) = &self.config.length_stages else {
            return parts.map(Array::clone).to_vec();
        };
        let length = stages.length(self.done as usize) as i32;
        parts.map(|part| part.index((.., ..length))).to_vec()
    }

    /// The whole global batch from this rank's rows of it (`own`), gathered from every rank in
    /// rank order: the batch of a single process. Evaluated on every rank, those that do not read
    /// it included, so that each takes its part in the collective.
    fn whole_batch(&self, own: &(Array, Array)) -> Result<(Array, Array)> {
        let Some(parallel) = &self.parallel else {
            return Ok(own.clone());
        };
        let whole = (
            parallel.group.all_gather(&own.0)?,
            parallel.group.all_gather(&own.1)?,
        );
        eval([&whole.0, &whole.1])?;
        Ok(whole)
    }

    /// This rank's rows of each batch of the whole run: all of them for a single process.
    fn own_rows(&self) -> Range<usize> {
        let Some(parallel) = &self.parallel else {
            return 0..self.config.batch_size;
        };
        let rows = self.config.batch_size / parallel.group.size();
        let start = rows * parallel.group.rank();
        start..start + rows
    }
}

/// Hands a step (and `extra`, evaluated with its outputs) to the device and returns the seconds
/// that took (on a GPU, MLX encodes the whole step on this thread before returning).
fn submit(step: &mut StepMetrics, extra: &[Array]) -> Result<f64> {
    let submitting = Instant::now();
    step.hand_over_stages()?;
    async_eval(step.outputs.iter().chain(extra))?;
    Ok(submitting.elapsed().as_secs_f64())
}

/// Runs a step's outputs to completion and returns the seconds that took, the device's time
/// included. MLX marks the outputs of a synchronous `eval` ready when it returns, where those
/// of `async_eval` are each asked once, when the next step reads them, whether the device is
/// done (on CUDA one `cudaEventQuery` per parameter and optimizer moment: about 0.13 ms a step
/// at the tiny preset on an H100, 6% of its step).
fn run_now(step: &mut StepMetrics, extra: &[Array]) -> Result<f64> {
    let running = Instant::now();
    step.hand_over_stages()?;
    eval(step.outputs.iter().chain(extra))?;
    Ok(running.elapsed().as_secs_f64())
}

/// The field `name` of a checkpoint's `trainer.json`.
fn recorded<T: serde::de::DeserializeOwned>(
    dir: &Path,
    trainer: &serde_json::Value,
    name: &str,
) -> Result<T> {
    let error = |message: String| Error::Checkpoint {
        path: dir.join("trainer.json"),
        message,
    };
    let value = trainer
        .get(name)
        .cloned()
        .ok_or_else(|| error(format!("no `{name}` recorded")))?;
    serde_json::from_value(value).map_err(|err| error(format!("`{name}`: {err}")))
}

/// The validation loss as a function of `[params..., frozen..., inputs, targets]` (the step's
/// loss, or the objective's over its `n` frozen leaves), computed in the run's precision and
/// compiled unless the run is eager.
fn evaluation<S: TrainingStep>(
    template: StateTemplate<Params<S>, S::Optimizer>,
    model: ModelConfig<S>,
    config: &TrainConfig,
    objective: Option<(Rc<ObjectiveLoss<S::Model>>, usize)>,
) -> EvalFn
where
    <Params<S> as crate::tree::Tree<Array>>::Of<
        Option<<S::Optimizer as crate::optim::Optimizer>::Leaf>,
    >: Clone + 'static,
{
    let n_params = template.layout().params;
    let precision = config.precision;
    let loss = move |args: &[Array]| -> std::result::Result<Vec<Array>, Exception> {
        let run = || -> Result<Array> {
            let params = precision.for_compute(&template.params(&args[..n_params])?)?;
            match &objective {
                None => S::loss(&params, &model, &args[n_params..], None),
                Some((loss, n_frozen)) => {
                    let (frozen, batch) = args[n_params..].split_at(*n_frozen);
                    let values = loss(&params, &model, frozen, batch, None)?;
                    values.into_iter().next().ok_or_else(|| {
                        Error::Layout("the objective's loss returned nothing".into())
                    })
                }
            }
        };
        run().map(|loss| vec![loss]).map_err(Error::into_exception)
    };
    if config.compile {
        Box::new(compile(loss, false))
    } else {
        Box::new(loss)
    }
}
