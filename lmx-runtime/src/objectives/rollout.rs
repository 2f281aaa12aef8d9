//! GRPO's rollouts: `group` completions of each prompt sampled from the current policy with the
//! batched KV-cached generator (every row of a batch at once), scored by a reward, normalised
//! within each group, and laid out as the rows GRPO's compiled step reads
//! ([`grpo`](super::grpo())).

use super::rewards::{score_all, Reward};
use super::{group_advantages, grpo_loss, token_logprobs, ReferenceLogprobs};
use crate::error::{Error, Result};
use crate::generate::{BatchGenerator, BatchLimits, Request, Sampling};
use crate::model::{Context, LanguageModel};
use crate::nn::IGNORE_TARGET;
use crate::train::Objective;
use mlx_rs::Array;
use std::collections::HashMap;
use std::rc::Rc;

/// A prompt of a verifiable task: its ids and, where the task has one, its answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Prompt {
    /// The prompt's token ids.
    pub ids: Vec<u32>,
    /// The reference answer the reward compares with.
    pub answer: Option<String>,
}

/// One batch of rollouts: `group` consecutive rows per prompt.
#[derive(Clone, Debug)]
pub struct Rollouts {
    /// `[P·G, width]` ids: each prompt and its completion, padded with id 0.
    pub tokens: Array,
    /// `[P·G, width]` the next id at each position of the completion, [`IGNORE_TARGET`] on the
    /// prompt and the padding.
    pub targets: Array,
    /// `[P·G]` rewards normalised within each group ([`group_advantages`]).
    pub advantages: Array,
    /// Each completion's reward.
    pub rewards: Vec<f32>,
    /// Each completion, decoded.
    pub completions: Vec<String>,
}

impl Rollouts {
    /// The mean reward of the batch.
    pub fn mean_reward(&self) -> f32 {
        self.rewards.iter().sum::<f32>() / self.rewards.len().max(1) as f32
    }

    /// The batch GRPO's objective reads: `[tokens, targets, advantages]` and the reference's
    /// log-probabilities of the targets, which `reference` computes here (handed to the device
    /// ahead of the update, not waited for).
    ///
    /// # Errors
    /// The reference's pass's errors.
    pub fn batch(&self, reference: &mut ReferenceLogprobs) -> Result<[Array; 4]> {
        Ok([
            self.tokens.clone(),
            self.targets.clone(),
            self.advantages.clone(),
            reference.logprobs(&self.tokens, &self.targets)?,
        ])
    }
}

/// Samples `group` completions of each prompt from `params`, all rows of the batch at once with
/// the batched KV-cached generator ([`BatchGenerator`]; completion `i` of the batch draws with
/// seed `sampling.seed + i` and ends at `stop` or after `sampling.max_tokens`, each row as it
/// would alone, so that a batch is a function of the parameters and the seed), decodes and
/// scores them with `reward`, and lays them out `width` ids wide, the same width every batch so
/// that the compiled step is traced once.
///
/// # Errors
/// [`Error::Config`] when `group` is 0 or a prompt and its longest completion do not fit
/// `width`; the generator's errors.
#[allow(clippy::too_many_arguments)]
pub fn sample<M: LanguageModel>(
    params: &M::Params,
    config: &M::Config,
    prompts: &[Prompt],
    group: usize,
    sampling: &Sampling,
    stop: Option<u32>,
    width: usize,
    decode: &dyn Fn(&[u32]) -> String,
    reward: &dyn Reward,
) -> Result<Rollouts> {
    let mut generator = generator::<M>(params.clone(), config.clone(), prompts.len() * group)?;
    sample_with(
        &mut generator,
        prompts,
        group,
        sampling,
        stop,
        width,
        decode,
        reward,
    )
}

/// A generator for rollouts of `rows` completions at once, for [`sample_with`].
pub fn generator<M: LanguageModel>(
    params: M::Params,
    config: M::Config,
    rows: usize,
) -> Result<BatchGenerator<M>> {
    let limits = BatchLimits {
        max_batch: rows.max(1),
        max_waiting: rows.max(1),
    };
    BatchGenerator::<M>::new(params, config, limits)
}

/// [`sample`] through `generator` (made by [`generator`] for at least `prompts.len() * group`
/// rows, its parameters the policy's), so that a run's updates reuse its compiled steps.
#[allow(clippy::too_many_arguments)]
pub fn sample_with<M: LanguageModel>(
    generator: &mut BatchGenerator<M>,
    prompts: &[Prompt],
    group: usize,
    sampling: &Sampling,
    stop: Option<u32>,
    width: usize,
    decode: &dyn Fn(&[u32]) -> String,
    reward: &dyn Reward,
) -> Result<Rollouts> {
    if group == 0 || prompts.is_empty() {
        return Err(Error::Config(
            "GRPO samples at least one completion of at least one prompt".into(),
        ));
    }
    for (p, prompt) in prompts.iter().enumerate() {
        let longest = (prompt.ids.len() + sampling.max_tokens).saturating_sub(1);
        if prompt.ids.is_empty() || longest > width {
            return Err(Error::Config(format!(
                "GRPO prompt {p}: {} ids and up to {} generated do not fit rows of {width} ids",
                prompt.ids.len(),
                sampling.max_tokens
            )));
        }
    }
    let completions = complete(generator, prompts, group, sampling, stop)?;
    let rows = prompts.len() * group;
    let (mut tokens, mut targets) = (vec![0i32; rows * width], vec![IGNORE_TARGET; rows * width]);
    let (mut texts, mut answers) = (Vec::with_capacity(rows), Vec::with_capacity(rows));
    for (row, completion) in completions.iter().enumerate() {
        let prompt = &prompts[row / group];
        let ids: Vec<u32> = prompt.ids.iter().chain(completion).copied().collect();
        let at = row * width;
        for (j, pair) in ids.windows(2).enumerate() {
            tokens[at + j] = pair[0] as i32;
            if j + 1 >= prompt.ids.len() {
                targets[at + j] = pair[1] as i32;
            }
        }
        tokens[at + ids.len() - 1] = ids[ids.len() - 1] as i32;
        texts.push(decode(completion));
        answers.push(prompt.answer.clone());
    }
    let scores = score_all(reward, &texts, &answers)?;
    scores.eval()?;
    let rewards = scores.as_slice::<f32>().to_vec();
    let shape = [rows as i32, width as i32];
    Ok(Rollouts {
        tokens: Array::from_slice(&tokens, &shape),
        targets: Array::from_slice(&targets, &shape),
        advantages: group_advantages(&scores, group)?,
        rewards,
        completions: texts,
    })
}

/// The generated ids of every row (`group` consecutive rows a prompt), decoded together in one
/// batch: row `i` samples with seed `sampling.seed + i` and stops at `stop`.
fn complete<M: LanguageModel>(
    generator: &mut BatchGenerator<M>,
    prompts: &[Prompt],
    group: usize,
    sampling: &Sampling,
    stop: Option<u32>,
) -> Result<Vec<Vec<u32>>> {
    let rows = prompts.len() * group;
    let mut row_of = HashMap::with_capacity(rows);
    for row in 0..rows {
        let request = Request {
            prompt: prompts[row / group].ids.clone(),
            sampling: Sampling {
                seed: sampling.seed.wrapping_add(row as u64),
                ..sampling.clone()
            },
            stop_tokens: stop.into_iter().collect(),
        };
        row_of.insert(generator.insert(request)?, row);
    }
    let mut completions = vec![Vec::new(); rows];
    while generator.active() > 0 {
        for event in generator.step()? {
            completions[row_of[&event.id]].push(event.token);
        }
    }
    Ok(completions)
}

/// GRPO of model `M` over batches of [`Rollouts::batch`] followed by the frozen reference's
/// per-token log-probabilities of them ([`ReferenceLogprobs`], a pass
/// of its own that the update reads): lmxlab's `grpo_loss` (the clipped surrogate with
/// `epsilon`, `beta` times the KL to the reference) over the completions' tokens, one update per
/// batch (the policy that sampled them is the policy's own values, their gradient stopped). It
/// reports the mean KL to the reference and the fraction of clipped ratios.
pub fn grpo<M: LanguageModel>(beta: f32, epsilon: f32) -> Objective<M> {
    let loss = move |params: &M::Params,
                     config: &M::Config,
                     _frozen: &[Array],
                     batch: &[Array],
                     key: Option<&Array>|
          -> Result<Vec<Array>> {
        let [tokens, targets, advantages, reference] = batch else {
            return Err(Error::Layout(format!(
                "GRPO reads tokens, targets, advantages and the reference's log-probabilities, \
                 got {} arrays",
                batch.len()
            )));
        };
        let policy = M::forward(params, config, tokens, &mut Context::for_step(key))?;
        let policy = token_logprobs(&policy, targets)?;
        let mask = targets.ge(Array::from_int(0))?;
        let gradient = grpo_loss(
            &policy, &policy, reference, &mask, advantages, beta, epsilon,
        )?;
        Ok(vec![gradient.loss, gradient.kl, gradient.clip_fraction])
    };
    Objective {
        name: "grpo",
        frozen: Vec::new(),
        loss: Rc::new(loss),
        metrics: &["kl", "clip_fraction"],
        mean_over_targets: false,
    }
}
