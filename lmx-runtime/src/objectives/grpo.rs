//! Group Relative Policy Optimisation (Shao et al., 2024), lmxlab's `grpo_loss`: completions
//! sampled in groups per prompt, rewards normalised within each group, the clipped surrogate
//! with a KL penalty towards the frozen reference.

use crate::error::{Error, Result};
use mlx_rs::{Array, Dtype};

/// Added to a group's standard deviation so that a group of equal rewards gets advantages 0.
pub const ADVANTAGE_EPS: f32 = 1e-8;

/// Advantages `(r - mean_g) / (std_g + ε)`, `[B]`, for rewards `[B]` laid out as consecutive
/// groups of `group` completions of one prompt (the population standard deviation, ε =
/// [`ADVANTAGE_EPS`]).
///
/// # Errors
/// [`Error::Config`] when `group` is 0 or does not divide the batch.
pub fn group_advantages(rewards: &Array, group: usize) -> Result<Array> {
    let rows = rewards.size();
    if group == 0 || rows % group != 0 {
        return Err(Error::Config(format!(
            "GRPO: {rows} rewards do not make groups of {group} completions"
        )));
    }
    let grouped = rewards
        .as_dtype(Dtype::Float32)?
        .reshape(&[(rows / group) as i32, group as i32])?;
    let mean = grouped.mean_axis(-1, true)?;
    let std = mlx_rs::ops::std_axis(&grouped, -1, true, 0)?;
    let advantages = grouped
        .subtract(&mean)?
        .divide(std.add(Array::from_f32(ADVANTAGE_EPS))?)?;
    Ok(advantages.reshape(&[rows as i32])?)
}

/// GRPO's loss and what a run reports of it, as lazy float32 scalars.
#[derive(Clone, Debug)]
pub struct PolicyGradient {
    /// `-mean_i mean_t [min(ρ A, clip(ρ, 1-ε, 1+ε) A) - β KL]` over each completion's tokens.
    pub loss: Array,
    /// The mean per-token KL estimate to the reference.
    pub kl: Array,
    /// The fraction of completion tokens whose ratio lies outside `[1-ε, 1+ε]`.
    pub clip_fraction: Array,
}

/// The clipped surrogate with the KL penalty, over per-token log-probabilities `[B, T]` of the
/// sampled completions (see [`token_logprobs`](super::token_logprobs)) under the policy, under
/// the policy that sampled them (`old`; with one update per batch, as lmxlab, the policy's own
/// values, whose gradient is stopped here) and under the frozen reference; `mask: [B, T]` is 1
/// on completion tokens and 0 on prompt and padding; `advantages: [B]` from
/// [`group_advantages`]. `ρ = exp(π - π_old)`; the KL is the unbiased estimator
/// `exp(ρ_ref - π) - (ρ_ref - π) - 1`; each completion's tokens are averaged, then completions.
pub fn grpo_loss(
    policy: &Array,
    old: &Array,
    reference: &Array,
    mask: &Array,
    advantages: &Array,
    beta: f32,
    epsilon: f32,
) -> Result<PolicyGradient> {
    let old = mlx_rs::stop_gradient(old)?;
    let reference = mlx_rs::stop_gradient(reference)?;
    let advantages = mlx_rs::stop_gradient(advantages)?.expand_dims(-1)?;
    let mask = mask.as_dtype(Dtype::Float32)?;
    let ratio = policy.subtract(&old)?.exp()?;
    let clipped = mlx_rs::ops::clip(&ratio, (1.0 - epsilon, 1.0 + epsilon))?;
    let surrogate =
        mlx_rs::ops::minimum(ratio.multiply(&advantages)?, clipped.multiply(&advantages)?)?;
    let log_ratio = reference.subtract(policy)?;
    let kl = log_ratio
        .exp()?
        .subtract(&log_ratio)?
        .subtract(Array::from_f32(1.0))?;
    let objective = surrogate.subtract(kl.multiply(Array::from_f32(beta))?)?;
    let lengths = mlx_rs::ops::maximum(mask.sum_axis(-1, false)?, Array::from_f32(1.0))?;
    let per_completion = objective
        .multiply(&mask)?
        .sum_axis(-1, false)?
        .divide(&lengths)?;
    let loss = per_completion.mean(false)?.negative()?;
    let tokens = mlx_rs::ops::maximum(mask.sum(false)?, Array::from_f32(1.0))?;
    let masked_mean = |x: &Array| -> Result<Array> {
        Ok(mlx_rs::stop_gradient(
            x.multiply(&mask)?.sum(false)?.divide(&tokens)?,
        )?)
    };
    let outside = ratio
        .subtract(Array::from_f32(1.0))?
        .abs()?
        .gt(Array::from_f32(epsilon))?
        .as_dtype(Dtype::Float32)?;
    Ok(PolicyGradient {
        loss,
        kl: masked_mean(&kl)?,
        clip_fraction: masked_mean(&outside)?,
    })
}
