//! Log-probabilities of given tokens under a model's logits, the quantity DPO and GRPO compare
//! between the policy and its reference.

use crate::error::Result;
use crate::nn::kept_token_losses;
use mlx_rs::Array;

/// `log p(target)` per position, `[B, T]` in float32, for `logits: [B, T, vocab]` and integer
/// `targets: [B, T]`; a position whose target is negative ([`IGNORE_TARGET`](crate::nn::IGNORE_TARGET):
/// a prompt token or padding) gets 0, so that sums over a row count the response tokens only.
/// It is the negated per-token cross-entropy, so on CUDA MLX's fused kernel reads the logits
/// in their own precision and neither a float32 copy of them nor their softmax is stored.
pub fn token_logprobs(logits: &Array, targets: &Array) -> Result<Array> {
    Ok(kept_token_losses(logits, targets)?.0.negative()?)
}

/// The log-probability of each row's kept targets, `[B]`: the sum of [`token_logprobs`] over
/// the sequence, lmxlab's sequence log-probability with the prompt masked.
pub fn sequence_logprobs(logits: &Array, targets: &Array) -> Result<Array> {
    Ok(token_logprobs(logits, targets)?.sum_axis(-1, false)?)
}
