//! Direct Preference Optimisation (Rafailov et al., 2023), lmxlab's `dpo_loss`.

use super::log_sigmoid;
use crate::error::Result;
use mlx_rs::{Array, Dtype};

/// DPO's loss and what a run reports of it, as lazy float32 scalars.
#[derive(Clone, Debug)]
pub struct Preference {
    /// `mean(-log σ(β ((π_c - ρ_c) - (π_r - ρ_r))))`.
    pub loss: Array,
    /// The mean implicit reward margin `β ((π_c - ρ_c) - (π_r - ρ_r))`: how much more the policy,
    /// relative to the reference, prefers the chosen response.
    pub reward_margin: Array,
    /// The fraction of pairs whose margin is positive.
    pub accuracy: Array,
}

/// DPO over sequence log-probabilities `[B]` (see
/// [`sequence_logprobs`](super::sequence_logprobs)) of the chosen and rejected responses under
/// the policy and under the frozen reference: `L = -log σ(β (Δchosen - Δrejected))` with
/// `Δ = log π - log π_ref`, averaged over the batch. The reference's values carry no gradient.
pub fn dpo_loss(
    policy_chosen: &Array,
    policy_rejected: &Array,
    reference_chosen: &Array,
    reference_rejected: &Array,
    beta: f32,
) -> Result<Preference> {
    let reference_chosen = mlx_rs::stop_gradient(reference_chosen)?;
    let reference_rejected = mlx_rs::stop_gradient(reference_rejected)?;
    let chosen = policy_chosen.subtract(&reference_chosen)?;
    let rejected = policy_rejected.subtract(&reference_rejected)?;
    let margin = chosen
        .subtract(&rejected)?
        .multiply(Array::from_f32(beta))?
        .as_dtype(Dtype::Float32)?;
    let loss = log_sigmoid(&margin)?.mean(false)?.negative()?;
    let accuracy = margin
        .gt(Array::from_f32(0.0))?
        .as_dtype(Dtype::Float32)?
        .mean(false)?;
    Ok(Preference {
        loss,
        reward_margin: mlx_rs::stop_gradient(margin.mean(false)?)?,
        accuracy,
    })
}
