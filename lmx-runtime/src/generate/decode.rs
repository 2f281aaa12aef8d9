//! One sequence's decoding loop: the prompt fed in chunks, then one token at a time through the
//! compiled decode step ([`DecodeStep`]), each step queued on the device before the host reads
//! the token of the step before (as mlx-lm's `generate_step`), so that the device never waits
//! for the host.

use super::cache::KvCache;
use super::ring::Ring;
use super::sampler::Sampler;
use super::step::DecodeStep;
use super::{check_prompt, Sampling};
use crate::error::{Error, Result};
use crate::model::{Context, LanguageModel};
use crate::nn;
use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::transforms::{async_eval, eval};
use mlx_rs::Array;
use std::time::Instant;

/// Prompt tokens fed in one forward pass at most: a long prompt's activations stay bounded, and
/// the cache of each chunk is evaluated before the next is queued.
pub(crate) const PREFILL_CHUNK: usize = 512;

/// What a generation produced, and how fast.
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    /// The generated tokens (the prompt excluded).
    pub tokens: Vec<u32>,
    /// Prompt tokens per second, over the prompt's forward pass and the first token.
    pub prompt_tokens_per_s: f64,
    /// Generated tokens per second after the first.
    pub decode_tokens_per_s: f64,
    /// Times the compiled decode step was traced: once per shape bucket (cache capacity block)
    /// it met; 0 where no step ran.
    pub decode_traces: usize,
}

/// A key-value cache kept across generations, with the tokens it holds: a prompt that starts
/// with tokens it holds (a conversation's earlier turns, a shared system prompt) is fed only
/// from where the two differ.
pub struct PromptCache {
    ctx: Context,
    tokens: Vec<u32>,
}

impl Default for PromptCache {
    fn default() -> Self {
        PromptCache {
            ctx: Context::rotating_generation(),
            tokens: Vec::new(),
        }
    }
}

impl PromptCache {
    /// An empty cache.
    pub fn new() -> PromptCache {
        PromptCache::default()
    }

    /// An empty cache whose every layer holds at most `max_kv_size` positions: the first `keep`
    /// of the sequence and the latest (mlx-lm's `max_kv_size` and the `keep` of its
    /// `RotatingKVCache`), so that a long generation's memory stays bounded; a query then sees
    /// those positions alone. Sliding-window layers keep their own window where it is smaller;
    /// layers masked otherwise than causally (biases, soft-capping) keep every position.
    /// Fails with [`Error::Setting`] unless `keep < max_kv_size`.
    pub fn bounded(max_kv_size: usize, keep: usize) -> Result<PromptCache> {
        if keep >= max_kv_size || max_kv_size > i32::MAX as usize {
            return Err(Error::Setting {
                name: "max_kv_size",
                value: format!("{max_kv_size} with keep {keep}"),
                expected: "more than keep (the first positions, kept for good)",
            });
        }
        let ring = Ring {
            size: max_kv_size as i32,
            keep: keep as i32,
        };
        Ok(PromptCache {
            ctx: Context::with_cache(KvCache::bounded(ring)),
            tokens: Vec::new(),
        })
    }

    /// The tokens whose keys and values the cache holds.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Keeps the longest prefix of the cached tokens that `prompt` starts with, short of the
    /// whole prompt (its last token must be fed to give the logits of the next), and returns the
    /// rest of `prompt`, to be fed.
    fn reuse<'p>(&mut self, prompt: &'p [u32]) -> &'p [u32] {
        let shared = self
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count()
            .min(prompt.len() - 1);
        // A recurrent state cannot go back to a shorter prefix: feed the prompt from the start.
        let rewinds = self
            .ctx
            .cache_mut()
            .is_none_or(|cache| cache.can_truncate(shared as i32));
        let shared = if rewinds {
            shared
        } else {
            let bound = self.ctx.cache_mut().and_then(|cache| cache.bound());
            self.ctx = match bound {
                Some(ring) => Context::with_cache(KvCache::bounded(ring)),
                None => Context::generation(),
            };
            0
        };
        let kept = match self.ctx.cache_mut() {
            Some(cache) => cache.truncate(shared as i32) as usize,
            None => shared,
        };
        self.tokens.truncate(kept);
        &prompt[kept..]
    }
}

/// Generates up to `sampling.max_tokens` tokens after `prompt`, calling `on_token` with each, and
/// stops early at `stop` or when prompt and generated tokens fill the model's context.
///
/// Fails before any work on an invalid configuration ([`LanguageModel::validate`]), sampling
/// setting ([`Sampling::validate`], [`Sampling::check_vocab`]) or prompt ([`check_prompt`]).
///
/// The token is chosen on the device ([`Sampler`]); the step that feeds it is queued
/// (`async_eval`) before the host reads it, so only the token crosses to the host.
///
/// Timing, as mlx-lm and `bench/generate_anchor.py` measure it: prompt tokens per second over the
/// prompt's forward pass and the first token; decode tokens per second over the remaining tokens.
pub fn generate<M: LanguageModel>(
    params: &M::Params,
    config: &M::Config,
    prompt: &[u32],
    sampling: &Sampling,
    stop: Option<u32>,
    on_token: impl FnMut(u32),
) -> Result<Generation> {
    let mut cache = PromptCache::new();
    let mut on_token = on_token;
    generate_cached::<M>(
        params,
        config,
        &mut cache,
        prompt,
        sampling,
        stop,
        |token| {
            on_token(token);
            true
        },
    )
}

/// [`generate`] over `cache`: the part of `prompt` that the cache already holds is not fed again,
/// and afterwards the cache holds the prompt and the generated tokens that were fed. `on_token`
/// returns whether to go on (`false` at a stop string, say).
pub fn generate_cached<M: LanguageModel>(
    params: &M::Params,
    config: &M::Config,
    cache: &mut PromptCache,
    prompt: &[u32],
    sampling: &Sampling,
    stop: Option<u32>,
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<Generation> {
    M::validate(config)?;
    sampling.validate()?;
    sampling.check_vocab(M::vocab_size(config))?;
    check_prompt::<M>(config, prompt)?;
    let context_len = M::context_len(config);
    let limit = sampling.max_tokens.min(context_len - prompt.len());
    let mut tokens = Vec::with_capacity(limit);
    if limit == 0 {
        return Ok(Generation {
            tokens,
            prompt_tokens_per_s: 0.0,
            decode_tokens_per_s: 0.0,
            decode_traces: 0,
        });
    }
    let fresh = cache.reuse(prompt).to_vec();
    let mut sampler = Sampler::new(sampling, prompt)?;
    let started = Instant::now();
    let mut pending = prefill::<M>(params, config, &mut cache.ctx, &mut sampler, &fresh)?;
    eval([&pending])?;
    cache.tokens.extend_from_slice(&fresh);
    let prompt_seconds = started.elapsed().as_secs_f64();
    let (rings, bound, recurrent) = cache
        .ctx
        .cache_mut()
        .map(|cache| (cache.rings(), cache.bound(), cache.states.len()))
        .unwrap_or_default();
    let mut decoder = DecodeStep::new::<M>(params, config, &sampler, rings, bound, recurrent);
    let decode_started = Instant::now();
    loop {
        let more = tokens.len() + 1 < limit;
        let queued = if more {
            Some(decoder.step(&mut cache.ctx, &mut sampler, &pending)?)
        } else {
            None
        };
        let token = read(&pending)?;
        if queued.is_some() {
            cache.tokens.push(token);
        }
        tokens.push(token);
        let go_on = on_token(token);
        match queued {
            Some(next) if go_on && Some(token) != stop => pending = next,
            // The step queued ahead is not read, but waited for: queued work that nothing waits
            // for runs on MLX's own thread, and a process that ends under it corrupts the heap.
            Some(next) => {
                eval([&next])?;
                break;
            }
            None => break,
        }
    }
    let decode_seconds = decode_started.elapsed().as_secs_f64();
    Ok(Generation {
        prompt_tokens_per_s: prompt.len() as f64 / prompt_seconds.max(f64::MIN_POSITIVE),
        decode_tokens_per_s: tokens.len().saturating_sub(1) as f64
            / decode_seconds.max(f64::MIN_POSITIVE),
        tokens,
        decode_traces: decoder.traces(),
    })
}

/// Feeds `tokens` (at least one) in chunks of [`PREFILL_CHUNK`] and returns the token after them,
/// queued.
pub(crate) fn prefill<M: LanguageModel>(
    params: &M::Params,
    config: &M::Config,
    ctx: &mut Context,
    sampler: &mut Sampler,
    tokens: &[u32],
) -> Result<Array> {
    let logits = prefill_cache::<M>(params, config, ctx, tokens)?;
    let token = sampler.next(&logits.index((0, -1)))?;
    async_eval([&token])?;
    Ok(token)
}

/// Feeds `tokens` (at least one) in chunks of [`PREFILL_CHUNK`] and returns the last chunk's
/// logits (`[1, T, vocab]`, not evaluated): every chunk but the last is evaluated for its cache
/// alone (its logits are never computed).
pub(crate) fn prefill_cache<M: LanguageModel>(
    params: &M::Params,
    config: &M::Config,
    ctx: &mut Context,
    tokens: &[u32],
) -> Result<Array> {
    let ids: Vec<i32> = tokens.iter().map(|&id| id as i32).collect();
    let mut rest = &ids[..];
    while rest.len() > PREFILL_CHUNK {
        let (chunk, after) = rest.split_at(PREFILL_CHUNK);
        let chunk = Array::from_slice(chunk, &[1, chunk.len() as i32]);
        nn::without_gradients(|| M::forward(params, config, &chunk, ctx))?;
        eval(
            ctx.cache_mut()
                .map(|cache| cache.arrays())
                .unwrap_or_default(),
        )?;
        rest = after;
    }
    let tail = Array::from_slice(rest, &[1, rest.len() as i32]);
    nn::without_gradients(|| M::forward(params, config, &tail, ctx))
}

/// A queued token, on the host.
pub(crate) fn read(token: &Array) -> Result<u32> {
    token
        .try_item_exact::<u32>()
        .map_err(|err| Error::from(Exception::custom(format!("reading the next token: {err}"))))
}
