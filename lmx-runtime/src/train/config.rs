//! What a training run is told: lengths, batch, schedule, evaluation, checkpoints.

use super::{Overlap, Precision, StatePacking};
use crate::error::{Error, Result};
use crate::optim::DecayScope;
use crate::schedule::Schedule;
use std::path::PathBuf;

/// A training run's settings (from flags or a TOML file).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Updates to make.
    pub steps: u64,
    /// Sequences per update (split into `accumulation` micro-batches when the step accumulates).
    pub batch_size: usize,
    /// Tokens per sequence.
    pub seq_len: usize,
    /// The learning-rate schedule.
    pub schedule: Schedule,
    /// Seed of initialisation, data order and the step's random key.
    pub seed: u64,
    /// Compile the step (`false`: eager, for debugging; same numbers).
    pub compile: bool,
    /// Parameter precision.
    pub precision: Precision,
    /// How far the host runs ahead of the device.
    pub overlap: Overlap,
    /// How the step's state is laid out: per parameter or packed flat.
    pub state_packing: StatePacking,
    /// Fraction of windows held out for validation.
    pub validation_fraction: f64,
    /// Evaluate the validation loss every this many steps (0: never).
    pub eval_every: u64,
    /// Validation batches per evaluation.
    pub eval_batches: usize,
    /// Print a progress line every this many steps when the output is not a terminal (0: never;
    /// lmxlab's `log_interval`). `metrics.jsonl` records every step whatever this is.
    pub log_every: u64,
    /// Save a checkpoint every this many steps (0: only at the end, or when the run is stopped).
    pub checkpoint_every: u64,
    /// Checkpoints to keep: the most recent ones, and besides them the one of lowest loss, which a
    /// diverged run can continue from.
    pub keep_checkpoints: usize,
    /// Stop when the validation loss has not improved for this many evaluations (0: never).
    pub early_stopping_patience: usize,
    /// The run directory: checkpoints, `metrics.jsonl`, `run.json`.
    pub out_dir: PathBuf,
    /// Peak device throughput in TFLOP/s for MFU (0: do not report MFU).
    pub peak_tflops: f64,
    /// Which parameters the optimizer's weight decay applies to: `weights` (lmx's default) or
    /// `all` (as MLX's optimizers do).
    pub decay: DecayScope,
    /// Micro-batches per update, in place of the step's declared `accumulate` count (`None`:
    /// the step's): the batch is split into this many equal parts whose gradients are averaged
    /// before one update.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accumulation: Option<usize>,
    /// Sequence length by declared stages (a length curriculum): each batch of step `i` trains
    /// on the first `length(i)` tokens of its windows; `None` trains every step at `seq_len`.
    /// The compiled step is traced once per declared length.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub length_stages: Option<crate::objectives::curriculum::LengthCurriculum>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            steps: 300,
            batch_size: 16,
            seq_len: 128,
            schedule: Schedule::Cosine {
                lr: 3e-3,
                warmup_steps: 30,
                total_steps: 300,
                final_lr: 3e-4,
            },
            seed: 0,
            compile: true,
            precision: Precision::Float32,
            overlap: Overlap::default(),
            state_packing: StatePacking::default(),
            validation_fraction: 0.05,
            eval_every: 100,
            eval_batches: 8,
            log_every: 10,
            // A crash or a kill loses at most this many steps, not the run.
            checkpoint_every: 100,
            keep_checkpoints: 3,
            early_stopping_patience: 0,
            out_dir: PathBuf::from("runs/latest"),
            peak_tflops: 0.0,
            decay: DecayScope::Weights,
            accumulation: None,
            length_stages: None,
        }
    }
}

impl TrainConfig {
    /// Checks the settings that would otherwise fail deep inside the run.
    pub fn validate(&self) -> Result<()> {
        if self.steps == 0 {
            return Err(Error::Config("steps must be at least 1".into()));
        }
        if self.batch_size == 0 || self.seq_len == 0 {
            return Err(Error::Config(
                "batch_size and seq_len must be at least 1".into(),
            ));
        }
        if self.accumulation == Some(0) {
            return Err(Error::Config(
                "accumulation must be at least 1 micro-batch".into(),
            ));
        }
        if let Some(parts) = self.accumulation {
            if self.batch_size % parts != 0 {
                return Err(Error::Config(format!(
                    "batch_size {} does not split into {parts} equal micro-batches",
                    self.batch_size
                )));
            }
        }
        if !(0.0..1.0).contains(&self.validation_fraction) {
            return Err(Error::Config(format!(
                "validation_fraction must be in [0, 1), not {}",
                self.validation_fraction
            )));
        }
        if let Some(stages) = &self.length_stages {
            // Deserialized stages are checked as constructed ones are.
            let stages = crate::objectives::curriculum::LengthCurriculum::new(
                stages.lengths().to_vec(),
                stages.per_stage(),
            )?;
            let longest = stages.lengths().last().copied().unwrap_or(0);
            if longest > self.seq_len {
                return Err(Error::Config(format!(
                    "the length stages reach {longest} tokens, past seq_len {}",
                    self.seq_len
                )));
            }
        }
        self.schedule.validate()
    }
}
