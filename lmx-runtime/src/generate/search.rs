//! Searching for likely continuations rather than sampling one: beam search, and best-of-n
//! (several sampled continuations, the likeliest kept), lmxlab's two rows.

use super::decode::{generate, prefill_cache, Generation};
use super::{check_prompt, Sampling};
use crate::error::{Error, Result};
use crate::model::{Context, LanguageModel};
use crate::nn;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{self, argpartition_axis};
use mlx_rs::transforms::eval;
use mlx_rs::{Array, Dtype};

/// A continuation and its log-probability under the model.
#[derive(Clone, Debug, PartialEq)]
pub struct Scored {
    /// The generated tokens (the prompt excluded; a stop token included).
    pub tokens: Vec<u32>,
    /// The sum of the tokens' log-probabilities (natural logarithm).
    pub log_prob: f64,
}

impl Scored {
    /// The log-probability per token, which ranks continuations of different lengths.
    pub fn mean_log_prob(&self) -> f64 {
        self.log_prob / self.tokens.len().max(1) as f64
    }
}

/// Beam search: keeps the `width` likeliest continuations (by summed log-probability) at every
/// step, up to `max_tokens` tokens (within the model's context) or `stop`; a continuation that
/// reaches `stop` is finished, and the search ends when `width` are. Returns the finished and
/// the live continuations, best first by [`Scored::mean_log_prob`].
///
/// The `width` rows decode as one batch; every step reads only the chosen tokens and their
/// scores to the host.
pub fn beam_search<M: LanguageModel>(
    params: &M::Params,
    config: &M::Config,
    prompt: &[u32],
    width: usize,
    max_tokens: usize,
    stop: Option<u32>,
) -> Result<Vec<Scored>> {
    M::validate(config)?;
    check_prompt::<M>(config, prompt)?;
    if width == 0 {
        return Err(Error::Setting {
            name: "width",
            value: "0".into(),
            expected: "at least 1",
        });
    }
    let limit = max_tokens.min(M::context_len(config) - prompt.len());
    let mut finished: Vec<Scored> = Vec::new();
    if limit == 0 {
        return Ok(finished);
    }
    let mut ctx = Context::generation();
    let logits = prefill_cache::<M>(params, config, &mut ctx, prompt)?;
    // The first step expands the prompt alone; later ones every live beam.
    let mut beams = vec![Scored {
        tokens: Vec::new(),
        log_prob: 0.0,
    }];
    let mut log_probs = log_softmax(&logits.index((.., -1)))?;
    for step in 0..limit {
        let vocab = log_probs.dim(-1);
        let scores: Vec<f32> = beams.iter().map(|b| b.log_prob as f32).collect();
        let totals = log_probs
            .add(Array::from_slice(&scores, &[beams.len() as i32, 1]))?
            .reshape(&[-1])?;
        // Twice the width, so that `width` live beams remain when some stop.
        let take = (2 * width).min(totals.dim(0) as usize) as i32;
        let best = argpartition_axis(totals.negative()?, take - 1, 0)?.index(..take);
        let best_scores = totals.take_axis(&best, 0)?;
        eval([&best, &best_scores])?;
        let mut candidates: Vec<(u32, f32)> = best
            .as_dtype(Dtype::Uint32)?
            .as_slice::<u32>()
            .iter()
            .copied()
            .zip(best_scores.as_slice::<f32>().iter().copied())
            .collect();
        candidates.sort_by(|a, b| b.1.total_cmp(&a.1));
        let mut origins = Vec::with_capacity(width);
        let mut next = Vec::with_capacity(width);
        for (index, score) in candidates {
            let (origin, token) = ((index / vocab as u32) as usize, index % vocab as u32);
            let mut tokens = beams[origin].tokens.clone();
            tokens.push(token);
            let scored = Scored {
                tokens,
                log_prob: f64::from(score),
            };
            if Some(token) == stop {
                if finished.len() < width {
                    finished.push(scored);
                }
            } else if next.len() < width {
                origins.push(origin);
                next.push(scored);
            }
        }
        beams = next;
        if finished.len() >= width || beams.is_empty() || step + 1 == limit {
            break;
        }
        if let Some(cache) = ctx.cache_mut() {
            cache.keep_rows(&origins)?;
        }
        let last: Vec<i32> = beams
            .iter()
            .map(|b| *b.tokens.last().expect("a token") as i32)
            .collect();
        let input = Array::from_slice(&last, &[beams.len() as i32, 1]);
        let logits = nn::without_gradients(|| M::forward(params, config, &input, &mut ctx))?;
        log_probs = log_softmax(&logits.index((.., -1)))?;
    }
    finished.extend(beams);
    finished.sort_by(|a, b| b.mean_log_prob().total_cmp(&a.mean_log_prob()));
    Ok(finished)
}

/// Best-of-n: `n` continuations sampled with `sampling` (seeds `seed`, `seed + 1`, ...), scored by
/// the model's log-probability of their tokens (unaffected by the sampling settings), best first
/// by [`Scored::mean_log_prob`].
pub fn best_of_n<M: LanguageModel>(
    params: &M::Params,
    config: &M::Config,
    prompt: &[u32],
    sampling: &Sampling,
    n: usize,
    stop: Option<u32>,
) -> Result<Vec<Scored>> {
    if n == 0 {
        return Err(Error::Setting {
            name: "n",
            value: "0".into(),
            expected: "at least 1",
        });
    }
    let mut scored = (0..n as u64)
        .map(|i| {
            let sampling = Sampling {
                seed: sampling.seed.wrapping_add(i),
                ..sampling.clone()
            };
            let Generation { tokens, .. } =
                generate::<M>(params, config, prompt, &sampling, stop, |_| ())?;
            let log_prob = log_prob::<M>(params, config, prompt, &tokens)?;
            Ok(Scored { tokens, log_prob })
        })
        .collect::<Result<Vec<_>>>()?;
    scored.sort_by(|a, b| b.mean_log_prob().total_cmp(&a.mean_log_prob()));
    Ok(scored)
}

/// The model's log-probability of `tokens` after `prompt`, in one forward pass.
pub fn log_prob<M: LanguageModel>(
    params: &M::Params,
    config: &M::Config,
    prompt: &[u32],
    tokens: &[u32],
) -> Result<f64> {
    if tokens.is_empty() {
        return Ok(0.0);
    }
    let sequence: Vec<i32> = prompt
        .iter()
        .chain(&tokens[..tokens.len() - 1])
        .map(|&t| t as i32)
        .collect();
    let input = Array::from_slice(&sequence, &[1, sequence.len() as i32]);
    let logits =
        nn::without_gradients(|| M::forward(params, config, &input, &mut Context::evaluation()))?;
    let from = prompt.len() as i32 - 1;
    let log_probs = log_softmax(&logits.index((0, from..)))?;
    let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
    let picked = log_probs
        .take_along_axis(Array::from_slice(&ids, &[ids.len() as i32, 1]), -1)?
        .sum(None)?;
    Ok(f64::from(picked.item_exact::<f32>()))
}

/// Float32 log-probabilities over the last axis.
fn log_softmax(logits: &Array) -> Result<Array> {
    let logits = logits.as_dtype(Dtype::Float32)?;
    Ok(logits.subtract(ops::logsumexp_axis(&logits, -1, true)?)?)
}
