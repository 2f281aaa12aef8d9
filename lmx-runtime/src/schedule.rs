//! Learning-rate schedules: constant, linear decay and cosine decay, each after a linear warm-up.
//!
//! A schedule is computed on the host, once per step, and reaches the compiled step as an input
//! array, so changing the rate never retraces the step. `step` counts the updates already made:
//! the first update uses `lr(0)`, as MLX's schedules do.
//!
//! Over a run of `total_steps` updates with `warmup_steps` of warm-up:
//!
//! - warm-up, `step < W`: `lr · step / W`, rising from 0 (so the first update has rate 0);
//! - decay, `W ≤ step ≤ total_steps`: from `lr` at `step = W` to `final_lr` at `step =
//!   total_steps`, linearly or along half a cosine;
//! - past the end, `step > total_steps`: `final_lr`.
//!
//! A warm-up longer than the run is clamped to the run, `W = min(warmup_steps, total_steps)`:
//! the rate rises over the whole run (the last update, `step = total_steps - 1`, uses
//! `lr · (total_steps - 1) / total_steps`), the decay phase is empty, and from `total_steps` on
//! the rate is `final_lr`. There is never a division by zero nor a negative progress.
//!
//! ```
//! use lmx_runtime::schedule::Schedule;
//!
//! let schedule = Schedule::Cosine { lr: 1e-3, warmup_steps: 10, total_steps: 110, final_lr: 1e-4 };
//! assert_eq!(schedule.lr(0), 0.0);
//! assert_eq!(schedule.lr(10), 1e-3);
//! assert!((schedule.lr(60) - 5.5e-4).abs() < 1e-9);
//! assert_eq!(schedule.lr(500), 1e-4);
//! ```

use crate::error::{Error, Result};

/// A learning-rate schedule, configured through serde with `kind` naming the variant
/// (`{"kind": "cosine", "lr": 3e-4, "warmup_steps": 100, "total_steps": 5000}`).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Schedule {
    /// `lr` after the warm-up, forever.
    Constant {
        /// The rate after the warm-up.
        lr: f32,
        /// Steps of linear warm-up from 0.
        #[serde(default)]
        warmup_steps: u64,
    },
    /// Linear decay from `lr` to `final_lr` at `total_steps`.
    Linear {
        /// The peak rate, reached at the end of the warm-up.
        lr: f32,
        /// Steps of linear warm-up from 0 (clamped to `total_steps`).
        #[serde(default)]
        warmup_steps: u64,
        /// The length of the run, warm-up included.
        total_steps: u64,
        /// The rate at `total_steps` and after.
        #[serde(default, alias = "min_lr")]
        final_lr: f32,
    },
    /// Cosine decay from `lr` to `final_lr` at `total_steps`.
    Cosine {
        /// The peak rate, reached at the end of the warm-up.
        lr: f32,
        /// Steps of linear warm-up from 0 (clamped to `total_steps`).
        #[serde(default)]
        warmup_steps: u64,
        /// The length of the run, warm-up included.
        total_steps: u64,
        /// The rate at `total_steps` and after.
        #[serde(default, alias = "min_lr")]
        final_lr: f32,
    },
}

/// The shape of the decay phase.
#[derive(Clone, Copy)]
enum Decay {
    Linear,
    Cosine,
}

impl Schedule {
    /// The learning rate of the update that follows `step` updates.
    pub fn lr(&self, step: u64) -> f32 {
        match *self {
            Schedule::Constant { lr, warmup_steps } => {
                warm_up(lr, step, warmup_steps).unwrap_or(lr)
            }
            Schedule::Linear {
                lr,
                warmup_steps,
                total_steps,
                final_lr,
            } => decayed(lr, final_lr, step, warmup_steps, total_steps, Decay::Linear),
            Schedule::Cosine {
                lr,
                warmup_steps,
                total_steps,
                final_lr,
            } => decayed(lr, final_lr, step, warmup_steps, total_steps, Decay::Cosine),
        }
    }

    /// The peak rate, reached at the end of the warm-up.
    pub fn peak_lr(&self) -> f32 {
        match *self {
            Schedule::Constant { lr, .. }
            | Schedule::Linear { lr, .. }
            | Schedule::Cosine { lr, .. } => lr,
        }
    }

    /// Checks that every rate is finite and not negative.
    pub fn validate(&self) -> Result<()> {
        let rates = match *self {
            Schedule::Constant { lr, .. } => [lr, lr],
            Schedule::Linear { lr, final_lr, .. } | Schedule::Cosine { lr, final_lr, .. } => {
                [lr, final_lr]
            }
        };
        match rates.iter().find(|rate| !rate.is_finite() || **rate < 0.0) {
            Some(rate) => Err(Error::Config(format!(
                "learning rates must be finite and not negative, got {rate}"
            ))),
            None => Ok(()),
        }
    }
}

/// The warm-up rate at `step`, or `None` once the warm-up is over.
fn warm_up(lr: f32, step: u64, warmup_steps: u64) -> Option<f32> {
    (step < warmup_steps).then(|| (f64::from(lr) * step as f64 / warmup_steps as f64) as f32)
}

/// Warm-up clamped to the run, then decay from `lr` to `final_lr` over the rest of the run.
fn decayed(
    lr: f32,
    final_lr: f32,
    step: u64,
    warmup_steps: u64,
    total_steps: u64,
    decay: Decay,
) -> f32 {
    let warmup_steps = warmup_steps.min(total_steps);
    if let Some(rate) = warm_up(lr, step, warmup_steps) {
        return rate;
    }
    let decay_steps = total_steps - warmup_steps;
    if step >= total_steps {
        return final_lr;
    }
    let progress = (step - warmup_steps) as f64 / decay_steps as f64;
    let remaining = match decay {
        Decay::Linear => 1.0 - progress,
        Decay::Cosine => 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()),
    };
    let (lr, final_lr) = (f64::from(lr), f64::from(final_lr));
    (final_lr + (lr - final_lr) * remaining) as f32
}
