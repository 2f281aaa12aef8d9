//! Training objectives beyond next-token cross-entropy, after lmxlab's training API: preference
//! optimisation ([`dpo`]), group-relative policy optimisation ([`grpo`], its rollouts from the
//! generator in [`rollout`]), distillation from a
//! frozen teacher ([`distill`]), multi-token prediction ([`mtp`], trained as [`mtp_model::Mtp`])
//! and data curricula ([`curriculum`]).
//!
//! Each loss is a function of arrays (log-probabilities, logits, rewards), so that a step's loss
//! calls it inside the compiled step, over the policy's and the frozen models' forward passes:
//! the frozen models' parameters reach that step as inputs without gradients
//! ([`TrainStep::with_frozen`](crate::step::TrainStep::with_frozen)). GRPO's reference reaches a
//! compiled pass of its own instead ([`ReferenceLogprobs`]), whose output its update reads.

pub mod curriculum;
pub mod difficulty_rows;
pub mod distill;
pub mod dpo;
pub mod grpo;
pub mod grpo_run;
pub mod language;
pub mod logprobs;
pub mod mtp;
pub mod mtp_model;
pub mod reference;
pub mod rewards;
pub mod rollout;
pub mod teacher;

pub use difficulty_rows::{Difficulty, DifficultyRows};
pub use distill::{distillation_loss, soft_target_loss};
pub use dpo::{dpo_loss, Preference};
pub use grpo::{group_advantages, grpo_loss, PolicyGradient};
pub use grpo_run::{GrpoConfig, GrpoRun};
pub use language::{distillation, distillation_from, dpo};
pub use logprobs::{sequence_logprobs, token_logprobs};
pub use mtp::{check_backbone, mtp_losses, Backbone, MtpHead, MtpLosses};
pub use mtp_model::{is_head_tensor, mtp, Mtp, MtpConfig, MtpParams, MtpStep};
pub use reference::ReferenceLogprobs;
pub use rewards::{ExactAnswer, Format, Length, Reward};
pub use rollout::{grpo, Prompt, Rollouts};
pub use teacher::Teacher;

use crate::error::Result;
use mlx_rs::Array;

/// `log σ(x)`, stable for large `|x|`: `-log(1 + e^{-x})` as `-logaddexp(0, -x)`.
pub(crate) fn log_sigmoid(x: &Array) -> Result<Array> {
    Ok(mlx_rs::ops::logaddexp(Array::from_f32(0.0), x.negative()?)?.negative()?)
}
