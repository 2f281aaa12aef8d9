//! Speculative decoding: a small draft model of the same vocabulary proposes tokens, the target
//! model checks them all in one forward pass, and the standard acceptance rule (Leviathan et al.,
//! Chen et al.) keeps the output distributed exactly as the target's: a drafted token `d` drawn
//! from the draft's `q` is kept with probability `min(1, p(d) / q(d))`; at the first refusal
//! the token is drawn from `max(0, p - q)`, normalised; when every drafted token is kept, one
//! more is drawn from the target's distribution after them. Greedy decoding is the case of
//! one-hot distributions: the output is the target's greedy output, token for token.

use super::decode::{prefill_cache, Generation};
use super::sampler::Sampler;
use super::{check_prompt, Sampling};
use crate::error::{Error, Result};
use crate::model::{Context, LanguageModel};
use crate::nn;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{self, maximum};
use mlx_rs::transforms::eval;
use mlx_rs::{random, Array, Dtype};
use std::time::Instant;

/// A speculative generation and how often the target kept the draft's tokens.
#[derive(Clone, Debug, PartialEq)]
pub struct Speculation {
    /// The tokens and speeds.
    pub generation: Generation,
    /// Tokens the draft proposed.
    pub drafted: usize,
    /// Of those, tokens the target kept.
    pub accepted: usize,
}

/// The target model `M` and the draft model `D`, with their parameters and configurations.
pub struct Models<'a, M: LanguageModel, D: LanguageModel> {
    /// The model whose output this is.
    pub target: (&'a M::Params, &'a M::Config),
    /// The smaller model that proposes tokens.
    pub draft: (&'a D::Params, &'a D::Config),
}

/// Generates as [`generate`](super::generate) does with `models.target`, `draft_tokens` tokens
/// proposed by `models.draft` at a time. The output is the target's: token for token when
/// greedy, in distribution when sampled (the draws themselves differ from [`generate`]'s).
///
/// Fails before any work as [`generate`](super::generate) does, and on a draft whose vocabulary
/// size differs from the target's, a penalty (they look back on tokens that the acceptance rule
/// would have to replay), or `draft_tokens` of 0.
pub fn speculative_generate<M: LanguageModel, D: LanguageModel>(
    models: Models<'_, M, D>,
    prompt: &[u32],
    sampling: &Sampling,
    draft_tokens: usize,
    stop: Option<u32>,
    mut on_token: impl FnMut(u32),
) -> Result<Speculation> {
    let ((target, target_config), (draft, draft_config)) = (models.target, models.draft);
    M::validate(target_config)?;
    D::validate(draft_config)?;
    sampling.validate()?;
    sampling.check_vocab(M::vocab_size(target_config))?;
    check_prompt::<M>(target_config, prompt)?;
    check_prompt::<D>(draft_config, prompt)?;
    let (vocab, draft_vocab) = (M::vocab_size(target_config), D::vocab_size(draft_config));
    if vocab != draft_vocab {
        return Err(Error::Config(format!(
            "the draft model's vocabulary of {draft_vocab} ids differs from the target's of {vocab}"
        )));
    }
    for (name, value) in [
        ("repetition_penalty", sampling.repetition_penalty),
        ("presence_penalty", sampling.presence_penalty),
        ("frequency_penalty", sampling.frequency_penalty),
    ] {
        if let Some(value) = value {
            return Err(Error::Setting {
                name,
                value: value.to_string(),
                expected: "unset with a draft model (speculative decoding)",
            });
        }
    }
    if draft_tokens == 0 {
        return Err(Error::Setting {
            name: "draft_tokens",
            value: "0".into(),
            expected: "at least 1",
        });
    }
    let context = M::context_len(target_config).min(D::context_len(draft_config));
    let limit = sampling.max_tokens.min(context - prompt.len());
    let sampler = Sampler::new(sampling, prompt)?;
    let mut key = random::key(sampling.seed)?;
    let mut split = || -> Result<Array> {
        let (carry, draw) = random::split(&key, 2)?;
        key = carry;
        Ok(draw)
    };
    let started = Instant::now();
    let (mut target_ctx, mut draft_ctx) = (Context::generation(), Context::generation());
    let (&last, head) = prompt.split_last().expect("a checked prompt");
    if !head.is_empty() {
        prefill_cache::<M>(target, target_config, &mut target_ctx, head)?;
        prefill_cache::<D>(draft, draft_config, &mut draft_ctx, head)?;
    }
    // A model with recurrent layers now holds states, which no rejection could cut back: refused
    // before any token (with a one-token prompt, at the first rejection below).
    if target_ctx
        .cache_mut()
        .is_some_and(|cache| !cache.can_truncate(0))
    {
        return Err(Error::RecurrentRewind { model: M::NAME });
    }
    if draft_ctx
        .cache_mut()
        .is_some_and(|cache| !cache.can_truncate(0))
    {
        return Err(Error::RecurrentRewind { model: D::NAME });
    }
    // The token the target is fed next, and the tokens the draft is fed next.
    let mut next = last;
    let mut draft_input = vec![last];
    let mut tokens = Vec::with_capacity(limit);
    let (mut drafted, mut accepted) = (0, 0);
    let mut decode_started = None;
    'rounds: while tokens.len() < limit {
        // Slots the target holds before this round.
        let base = target_ctx.offset();
        let k = draft_tokens.min(limit - tokens.len() - 1);
        let mut input = ids(&draft_input);
        let mut proposals = Vec::with_capacity(k);
        let mut draft_probs = Vec::with_capacity(k);
        for _ in 0..k {
            let logits =
                nn::without_gradients(|| D::forward(draft, draft_config, &input, &mut draft_ctx))?;
            let q = sampler.probabilities(&logits.index((0, -1)))?;
            let token =
                random::categorical(q.log()?, -1, None, &split()?)?.as_dtype(Dtype::Int32)?;
            input = token.reshape(&[1, 1])?;
            proposals.push(token.reshape(&[1])?);
            draft_probs.push(q);
        }
        let mut fed = vec![Array::from_slice(&[next as i32], &[1])];
        fed.extend(proposals.iter().cloned());
        let fed = ops::concatenate(&fed, 0)?.reshape(&[1, -1])?;
        let logits =
            nn::without_gradients(|| M::forward(target, target_config, &fed, &mut target_ctx))?;
        let target_probs = (0..=k as i32)
            .map(|i| sampler.probabilities(&logits.index((0, i))))
            .collect::<Result<Vec<_>>>()?;
        // The first refused proposal (k when all are kept).
        let kept = if k == 0 {
            0
        } else {
            let ratios = (0..k)
                .map(|i| {
                    let at = |probs: &Array| probs.take_along_axis(&proposals[i], 0);
                    Ok(at(&target_probs[i])?.divide(at(&draft_probs[i])?)?)
                })
                .collect::<Result<Vec<_>>>()?;
            let ratios = ops::concatenate(&ratios, 0)?;
            let draws = random::uniform::<_, f32>(0.0, 1.0, &[k as i32], &split()?)?;
            let keep = draws.lt(&ratios)?;
            eval([&keep])?;
            keep.as_slice::<bool>()
                .iter()
                .position(|keep| !keep)
                .unwrap_or(k)
        };
        let last_probs = if kept < k {
            let rest = maximum(
                target_probs[kept].subtract(&draft_probs[kept])?,
                Array::from_f32(0.0),
            )?;
            // Where the two distributions are equal no mass is left: the target's then.
            let mass = rest.sum(None)?;
            ops::select(&mass.gt(Array::from_f32(0.0))?, &rest, &target_probs[kept])?
        } else {
            target_probs[k].clone()
        };
        let token = random::categorical(last_probs.log()?, -1, None, &split()?)?
            .as_dtype(Dtype::Uint32)?
            .item_exact::<u32>();
        let kept_tokens: Vec<u32> = proposals[..kept]
            .iter()
            .map(|p| p.as_dtype(Dtype::Uint32).map(|p| p.as_slice::<u32>()[0]))
            .collect::<std::result::Result<_, _>>()?;
        drafted += k;
        accepted += kept;
        for &t in kept_tokens.iter().chain([&token]) {
            tokens.push(t);
            on_token(t);
            decode_started.get_or_insert_with(Instant::now);
            if Some(t) == stop || tokens.len() == limit {
                break 'rounds;
            }
        }
        // The target keeps the fed tokens that were kept; the draft, which was not fed its
        // last proposal, catches up on it when all were kept.
        if let Some(cache) = target_ctx.cache_mut() {
            if !cache.can_truncate(base + 1 + kept as i32) {
                return Err(Error::RecurrentRewind { model: M::NAME });
            }
            cache.truncate(base + 1 + kept as i32);
        }
        draft_input = if k == 0 {
            draft_input.into_iter().chain([token]).collect()
        } else if kept == k {
            vec![kept_tokens[k - 1], token]
        } else {
            if let Some(cache) = draft_ctx.cache_mut() {
                if !cache.can_truncate(base + 1 + kept as i32) {
                    return Err(Error::RecurrentRewind { model: D::NAME });
                }
                cache.truncate(base + 1 + kept as i32);
            }
            vec![token]
        };
        next = token;
    }
    let decode_started = decode_started.unwrap_or_else(Instant::now);
    let prompt_seconds = (decode_started - started).as_secs_f64();
    let decode_seconds = decode_started.elapsed().as_secs_f64();
    Ok(Speculation {
        generation: Generation {
            prompt_tokens_per_s: prompt.len() as f64 / prompt_seconds.max(f64::MIN_POSITIVE),
            decode_tokens_per_s: tokens.len().saturating_sub(1) as f64
                / decode_seconds.max(f64::MIN_POSITIVE),
            tokens,
            // The draft's and the target's passes run eagerly: their lengths vary round by round.
            decode_traces: 0,
        },
        drafted,
        accepted,
    })
}

/// `[1, T]` int32 token ids.
fn ids(tokens: &[u32]) -> Array {
    let ids: Vec<i32> = tokens.iter().map(|&id| id as i32).collect();
    Array::from_slice(&ids, &[1, ids.len() as i32])
}
