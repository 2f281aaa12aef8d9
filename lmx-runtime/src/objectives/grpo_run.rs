//! A GRPO run: each update samples its rollouts from the current policy
//! ([`rollout::sample`](super::rollout::sample)), scores them and trains the compiled GRPO step
//! on them ([`grpo`](super::grpo())), with checkpoints. What an update draws (its prompts and
//! its sampling seed) is a function of its index, so a run resumed from a checkpoint computes
//! exactly what the uninterrupted one does.

use super::rewards::Reward;
use super::rollout::{generator, sample_with, Prompt};
use super::{grpo, ReferenceLogprobs};
use crate::checkpoint::{self, Checkpoints};
use crate::distributed::{DataParallel, DistributedError};
use crate::error::{Error, Result};
use crate::generate::{BatchGenerator, Sampling};
use crate::model::LanguageModel;
use crate::optim::Optimizer;
use crate::schedule::Schedule;
use crate::state::TrainState;
use crate::step::StepOptions;
use crate::train::{Callback, Control, StatePacking, StepReport, Stepper};
use mlx_rs::Array;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// How a run decodes a completion's ids into the text its reward scores.
pub type Decode = Box<dyn Fn(&[u32]) -> String>;

/// What a GRPO run does.
#[derive(Clone, Debug, PartialEq)]
pub struct GrpoConfig {
    /// Updates to make.
    pub steps: u64,
    /// Prompts per update, taken in order (wrapping around).
    pub prompts_per_step: usize,
    /// Completions sampled per prompt (lmxlab's group size G).
    pub group: usize,
    /// The sampling temperature.
    pub temperature: f32,
    /// Tokens per completion at most.
    pub max_tokens: usize,
    /// The id that ends a completion, if any.
    pub stop: Option<u32>,
    /// The KL penalty's weight (lmxlab's `beta`).
    pub beta: f32,
    /// The ratio's clip range (lmxlab's `epsilon`).
    pub epsilon: f32,
    /// The learning rate by update.
    pub schedule: Schedule,
    /// Seeds the optimizer state's key and the sampling.
    pub seed: u64,
    /// A checkpoint every this many updates (0: none but the last, and the one a stop follows).
    pub checkpoint_every: u64,
    /// Where checkpoints go (`checkpoints/` inside).
    pub out_dir: PathBuf,
    /// How the update's state is laid out (flat on CUDA by default, as the trainer's).
    pub state_packing: StatePacking,
}

/// A GRPO run of model `M` with optimizer `O`.
pub struct GrpoRun<M: LanguageModel, O: Optimizer> {
    run: GrpoConfig,
    /// The update's step and the state it owns.
    stepper: Stepper<M::Params, O>,
    /// The frozen reference's log-probabilities of each update's batch, which the update reads.
    reference: ReferenceLogprobs,
    /// Samples every update's rollouts: one for the run, so that its compiled steps are traced
    /// once, not once per update.
    generator: BatchGenerator<M>,
    prompts: Vec<Prompt>,
    width: usize,
    reward: Box<dyn Reward>,
    decode: Decode,
    checkpoints: Checkpoints,
    callbacks: Vec<Box<dyn Callback>>,
    done: u64,
    /// The ranks of a data-parallel run: each samples and trains on its share of every update's
    /// prompts.
    parallel: Option<DataParallel>,
}

impl<M: LanguageModel, O: Optimizer> GrpoRun<M, O>
where
    M::Params: Clone + 'static,
    <M::Params as crate::tree::Tree<Array>>::Of<Option<O::Leaf>>: Clone + 'static,
{
    /// A run from `params`, which are also the frozen reference, over `prompts`, rewarded by
    /// `reward` on completions decoded by `decode`.
    ///
    /// # Errors
    /// [`Error::Config`] for no prompts, no group or no update; the step's errors.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        config: M::Config,
        run: GrpoConfig,
        params: M::Params,
        optimizer: O,
        options: StepOptions,
        prompts: Vec<Prompt>,
        reward: Box<dyn Reward>,
        decode: Decode,
    ) -> Result<Self> {
        Self::data_parallel(
            config, run, params, optimizer, options, prompts, reward, decode, None,
        )
    }

    /// [`new`](Self::new) on one rank of a data-parallel run (of one process for `None`). Each
    /// rank samples the completions of its equal share of every update's prompts, seeded as
    /// one process seeds those rows, and the gradients, the loss and the metrics are averaged
    /// over the ranks: every rank makes the update one process makes on the whole batch. (The
    /// loss is a mean over completions, so the average is exact; `kl` and `clip_fraction` are
    /// means over completion tokens, exact while every rank's completions hold as many tokens,
    /// as without a stop token.) Only rank 0 writes checkpoints.
    ///
    /// # Errors
    /// As [`new`](Self::new), and [`DistributedError::Uneven`] when the ranks cannot share the
    /// prompts of an update evenly.
    #[allow(clippy::too_many_arguments)]
    pub fn data_parallel(
        config: M::Config,
        run: GrpoConfig,
        params: M::Params,
        optimizer: O,
        options: StepOptions,
        prompts: Vec<Prompt>,
        reward: Box<dyn Reward>,
        decode: Decode,
        parallel: Option<DataParallel>,
    ) -> Result<Self> {
        if prompts.is_empty() || run.prompts_per_step == 0 || run.group == 0 {
            return Err(Error::Config(
                "GRPO needs prompts, at least one per update, and groups of at least one".into(),
            ));
        }
        let ranks = parallel
            .as_ref()
            .map_or(1, |parallel| parallel.group.size());
        if run.prompts_per_step % ranks != 0 {
            return Err(DistributedError::Uneven {
                what: "prompts per update (batch_size)",
                value: run.prompts_per_step,
                ranks,
            }
            .into());
        }
        // Every batch is as wide as the longest prompt and completion, so one trace serves all.
        let longest = prompts.iter().map(|p| p.ids.len()).max().unwrap_or(0);
        let width = longest + run.max_tokens;
        let objective = grpo::<M>(run.beta, run.epsilon);
        let reference = ReferenceLogprobs::new::<M>(&params, config.clone(), options.compile);
        let rows = run.prompts_per_step / ranks * run.group;
        let generator = generator::<M>(params.clone(), config.clone(), rows)?;
        let state = TrainState::new(params, &optimizer, run.seed)?;
        let loss = objective.loss.clone();
        let model = config;
        let packing = run.state_packing;
        let stepper = Stepper::with_frozen(
            state,
            optimizer,
            objective.frozen.clone(),
            move |params: &M::Params, frozen: &[Array], batch: &[Array], key: &Array| {
                loss(params, &model, frozen, batch, Some(key))
            },
            objective.metrics.len(),
            options,
            packing,
            parallel.as_ref(),
        )?;
        let checkpoints = Checkpoints::new(run.out_dir.join("checkpoints"));
        Ok(GrpoRun {
            run,
            stepper,
            reference,
            generator,
            prompts,
            width,
            reward,
            decode,
            checkpoints,
            callbacks: Vec::new(),
            done: 0,
            parallel,
        })
    }

    /// Adds a callback: each update's [`StepReport`] carries `mean_reward`, `kl` and
    /// `clip_fraction` in its metrics. Its `build_ms` is the rollouts' time (sampling and
    /// scoring, the update's batch), its `submit_ms` and `wait_ms` the update's (handing the
    /// reference's pass and the compiled update to the device, running them), so that the
    /// update's throughput can be told from the generator's; `tokens_per_s` counts the update's
    /// rows over the whole of it.
    pub fn add_callback(&mut self, callback: impl Callback + 'static) {
        self.callbacks.push(Box::new(callback));
    }

    /// Continues from the checkpoint in `dir`.
    ///
    /// # Errors
    /// The checkpoint's errors; [`Error::Checkpoint`] when it records no step.
    pub fn resume(&mut self, dir: &Path) -> Result<()> {
        let trainer = self
            .stepper
            .change_state(|state| checkpoint::load(dir, state))?;
        self.done = trainer["step"].as_u64().ok_or_else(|| Error::Checkpoint {
            path: dir.to_owned(),
            message: "trainer.json records no `step`".into(),
        })?;
        Ok(())
    }

    /// The latest checkpoint of the run's directory, if any.
    pub fn latest_checkpoint(&self) -> Result<Option<PathBuf>> {
        self.checkpoints.latest()
    }

    /// The updates made so far.
    pub fn steps_done(&self) -> u64 {
        self.done
    }

    /// The state after the last update.
    pub fn state(&self) -> &TrainState<M::Params, O> {
        self.stepper.state()
    }

    /// This rank's prompts of update `index` (the update's: the next `prompts_per_step`,
    /// wrapping around, shared out in order over the ranks) and the index of its first
    /// completion among the update's.
    fn prompts_of(&self, index: u64) -> (Vec<Prompt>, usize) {
        let per = self.run.prompts_per_step;
        let (rank, ranks) = self.parallel.as_ref().map_or((0, 1), |parallel| {
            (parallel.group.rank(), parallel.group.size())
        });
        let share = per / ranks;
        let prompts = (rank * share..(rank + 1) * share)
            .map(|i| self.prompts[(index as usize * per + i) % self.prompts.len()].clone())
            .collect();
        (prompts, rank * share * self.run.group)
    }

    /// `value`'s mean over the ranks (itself in one process): every rank scores as many
    /// completions.
    fn over_ranks(&self, value: f32) -> Result<f32> {
        let Some(parallel) = &self.parallel else {
            return Ok(value);
        };
        let sum = parallel.group.all_sum(&Array::from_f32(value))?;
        Ok(sum.item_exact::<f32>() / parallel.group.size() as f32)
    }

    /// Makes the remaining updates, or stops where a callback says so (after a checkpoint).
    ///
    /// # Errors
    /// [`Error::Diverged`] when the loss stops being finite; the generator's, step's and
    /// checkpoints' errors.
    pub fn run(&mut self) -> Result<()> {
        let started = Instant::now();
        while self.done < self.run.steps {
            let index = self.done;
            let sampling = Sampling {
                temperature: self.run.temperature,
                top_k: None,
                seed: self
                    .run
                    .seed
                    .wrapping_mul(1 << 32)
                    .wrapping_add(index << 16),
                max_tokens: self.run.max_tokens,
                ..Sampling::default()
            };
            let building = Instant::now();
            self.generator
                .set_params(self.stepper.state().params.clone())?;
            let (prompts, first) = self.prompts_of(index);
            // Completion `i` of the update draws with seed `seed + i` on whichever rank.
            let sampling = Sampling {
                seed: sampling.seed.wrapping_add(first as u64),
                ..sampling
            };
            let rollouts = sample_with(
                &mut self.generator,
                &prompts,
                self.run.group,
                &sampling,
                self.run.stop,
                self.width,
                &*self.decode,
                &*self.reward,
            )?;
            let rollout_s = building.elapsed().as_secs_f64();
            let lr = self.run.schedule.lr(index);
            let submitting = Instant::now();
            // The reference's pass reaches the device first, and runs there while the host
            // replays the update.
            let batch = rollouts.batch(&mut self.reference)?;
            let metrics = self.stepper.step(lr, &batch)?;
            let submit_s = submitting.elapsed().as_secs_f64();
            let waiting = Instant::now();
            mlx_rs::transforms::eval(&metrics.outputs)?;
            let wait_s = waiting.elapsed().as_secs_f64();
            self.done += 1;
            let loss = metrics.loss.item_exact::<f32>();
            if !loss.is_finite() {
                return Err(Error::Diverged {
                    loss,
                    step: self.done,
                    resume_from: None,
                });
            }
            let seconds = building.elapsed().as_secs_f64();
            let mut values = std::collections::BTreeMap::new();
            values.insert("mean_reward", self.over_ranks(rollouts.mean_reward())?);
            values.insert("kl", metrics.metrics[0].item_exact::<f32>());
            values.insert("clip_fraction", metrics.metrics[1].item_exact::<f32>());
            let report = StepReport {
                step: self.done,
                total_steps: self.run.steps,
                loss,
                grad_norm: metrics.grad_norm.item_exact::<f32>(),
                metrics: values,
                lr,
                tokens_per_s: rollouts.rewards.len() as f64 * self.width as f64 / seconds,
                build_ms: rollout_s * 1e3,
                submit_ms: submit_s * 1e3,
                wait_ms: wait_s * 1e3,
                mfu: None,
                peak_memory_mib: mlx_rs::memory::peak_memory()? as f64 / (1024.0 * 1024.0),
                elapsed_s: started.elapsed().as_secs_f64(),
            };
            let mut stop = false;
            for callback in &mut self.callbacks {
                stop |= matches!(callback.on_step(&report)?, Control::Stop(_));
            }
            // The ranks stop together, after the update any of them was asked to stop after (a
            // signal reaches them at different times).
            stop = self.over_ranks(f32::from(u8::from(stop)))? > 0.0;
            let due = self.run.checkpoint_every > 0 && self.done % self.run.checkpoint_every == 0;
            let writes = self.parallel.as_ref().is_none_or(|p| p.group.rank() == 0);
            // As the plain trainer: the last update and the one a stop follows are always kept,
            // so that a run without periodic checkpoints still leaves its trained policy.
            if writes && (due || stop || self.done == self.run.steps) {
                let trainer = serde_json::json!({ "step": self.done });
                self.checkpoints
                    .save(self.done, self.stepper.state(), &trainer)?;
            }
            if stop {
                break;
            }
        }
        for callback in &mut self.callbacks {
            callback.on_end()?;
        }
        Ok(())
    }
}
