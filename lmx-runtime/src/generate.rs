//! Text generation: a KV-cached decoding loop with greedy, temperature, top-k and top-p sampling.

use crate::data::rng::SplitMix64;
use crate::data::{DataError, TokenOrigin};
use crate::error::{Error, Result};
use crate::model::{Context, LanguageModel};
use crate::nn;
use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::transforms::{async_eval, eval};
use mlx_rs::{Array, Dtype};
use std::time::Instant;

/// How the next token is chosen.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Sampling {
    /// 0 picks the first most likely token (greedy, on the device); a positive value divides the
    /// logits, and the token is sampled on the host. Negative, infinite and NaN are errors.
    pub temperature: f32,
    /// Keep only the `k` most likely tokens (`k` at least 1).
    pub top_k: Option<usize>,
    /// Keep the smallest set of most likely tokens whose probability reaches `p`, in `(0, 1]`.
    pub top_p: Option<f32>,
    /// Seed of the sampler.
    pub seed: u64,
    /// Tokens to generate at most.
    pub max_tokens: usize,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            temperature: 0.8,
            top_k: Some(40),
            top_p: None,
            seed: 0,
            max_tokens: 200,
        }
    }
}

impl Sampling {
    /// Fails with [`Error::Setting`], naming the first setting out of its range: a temperature
    /// that is negative, infinite or NaN, a `top_p` outside `(0, 1]` or NaN, a `top_k` of 0.
    pub fn validate(&self) -> Result<()> {
        let bad = |name, value: String, expected| {
            Err(Error::Setting {
                name,
                value,
                expected,
            })
        };
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad(
                "temperature",
                self.temperature.to_string(),
                "0 (greedy) or a finite positive number",
            );
        }
        if let Some(p) = self.top_p.filter(|p| !(*p > 0.0 && *p <= 1.0)) {
            return bad("top_p", p.to_string(), "in (0, 1]");
        }
        if self.top_k == Some(0) {
            return bad(
                "top_k",
                "0".into(),
                "at least 1 (or none, to keep every token)",
            );
        }
        Ok(())
    }
}

/// Fails unless `prompt` can start a generation with `M` and `config`: it must hold at least one
/// token and no more than the model's context, and every id must be below the vocabulary size
/// ([`DataError::OutOfVocab`](crate::data::DataError::OutOfVocab), naming the first that is
/// not). [`generate`] checks this itself; a program calls it to fail before showing the prompt.
pub fn check_prompt<M: LanguageModel>(config: &M::Config, prompt: &[u32]) -> Result<()> {
    if prompt.is_empty() {
        return Err(Error::Config(
            "generation needs a prompt of at least one token".into(),
        ));
    }
    let context_len = M::context_len(config);
    if prompt.len() > context_len {
        return Err(Error::Config(format!(
            "the prompt has {} tokens, more than the model's context of {context_len}",
            prompt.len()
        )));
    }
    let vocab_size = M::vocab_size(config);
    if let Some((position, &id)) = prompt
        .iter()
        .enumerate()
        .find(|(_, &id)| id as usize >= vocab_size)
    {
        return Err(DataError::OutOfVocab {
            origin: TokenOrigin::Prompt,
            position: position as u64,
            id,
            vocab_size,
        }
        .into());
    }
    Ok(())
}

/// What a generation produced, and how fast.
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    /// The generated tokens (the prompt excluded).
    pub tokens: Vec<u32>,
    /// Prompt tokens per second, over the prompt's forward pass and the first token.
    pub prompt_tokens_per_s: f64,
    /// Generated tokens per second after the first.
    pub decode_tokens_per_s: f64,
}

/// Generates up to `sampling.max_tokens` tokens after `prompt`, calling `on_token` with each, and
/// stops early at `stop` or when prompt and generated tokens fill the model's context.
///
/// Fails before any work on an invalid configuration ([`LanguageModel::validate`]), sampling
/// setting ([`Sampling::validate`]) or prompt ([`check_prompt`]).
///
/// Greedy decoding (`temperature` 0) picks the first most likely token on the device and, as
/// mlx-lm does, queues the next token's forward pass (`async_eval`) before reading the current
/// token to the host, so that the device never waits for the host. Sampling picks on the host.
///
/// Timing, as mlx-lm and `bench/generate_anchor.py` measure it: prompt tokens per second over the
/// prompt's forward pass and the first token; decode tokens per second over the remaining tokens.
pub fn generate<M: LanguageModel>(
    params: &M::Params,
    config: &M::Config,
    prompt: &[u32],
    sampling: &Sampling,
    stop: Option<u32>,
    mut on_token: impl FnMut(u32),
) -> Result<Generation> {
    M::validate(config)?;
    sampling.validate()?;
    check_prompt::<M>(config, prompt)?;
    let context_len = M::context_len(config);
    let limit = sampling.max_tokens.min(context_len - prompt.len());
    let mut tokens = Vec::with_capacity(limit);
    if limit == 0 {
        return Ok(Generation {
            tokens,
            prompt_tokens_per_s: 0.0,
            decode_tokens_per_s: 0.0,
        });
    }
    let mut decoder = Decoder::<M> {
        params,
        config,
        ctx: Context::generation(),
        sampler: (sampling.temperature > 0.0).then(|| Sampler {
            sampling: sampling.clone(),
            rng: SplitMix64::new(sampling.seed),
        }),
    };
    let started = Instant::now();
    let ids: Vec<i32> = prompt.iter().map(|&id| id as i32).collect();
    let mut pending = decoder.step(&Array::from_slice(&ids, &[1, ids.len() as i32]))?;
    pending.wait()?;
    let prompt_seconds = started.elapsed().as_secs_f64();
    let decode_started = Instant::now();
    loop {
        let more = tokens.len() + 1 < limit;
        let queued = match &pending {
            Pending::Device(token) if more => Some(decoder.step(&token.reshape(&[1, 1])?)?),
            _ => None,
        };
        let token = pending.read()?;
        tokens.push(token);
        on_token(token);
        if Some(token) == stop || !more {
            break;
        }
        pending = match queued {
            Some(next) => next,
            None => decoder.step(&Array::from_slice(&[token as i32], &[1, 1]))?,
        };
    }
    let decode_seconds = decode_started.elapsed().as_secs_f64();
    Ok(Generation {
        prompt_tokens_per_s: prompt.len() as f64 / prompt_seconds.max(f64::MIN_POSITIVE),
        decode_tokens_per_s: tokens.len().saturating_sub(1) as f64
            / decode_seconds.max(f64::MIN_POSITIVE),
        tokens,
    })
}

/// The next token: on the device while it may still be computing (greedy), or on the host.
enum Pending {
    /// A `uint32` array of one token, queued for evaluation.
    Device(Array),
    /// A token sampled on the host.
    Host(u32),
}

impl Pending {
    /// Waits until the token is computed.
    fn wait(&self) -> Result<()> {
        if let Pending::Device(token) = self {
            eval([token])?;
        }
        Ok(())
    }

    /// The token, on the host.
    fn read(&self) -> Result<u32> {
        match self {
            Pending::Device(token) => token
                .try_item_exact::<u32>()
                .map_err(|err| Exception::custom(format!("reading the next token: {err}")).into()),
            Pending::Host(token) => Ok(*token),
        }
    }
}

/// A model with its key-value cache and, unless decoding greedily, its sampler.
struct Decoder<'a, M: LanguageModel> {
    params: &'a M::Params,
    config: &'a M::Config,
    ctx: Context,
    sampler: Option<Sampler>,
}

impl<M: LanguageModel> Decoder<'_, M> {
    /// Feeds `tokens` (`[1, T]`) and picks the token after them: greedily on the device (queued,
    /// not waited for), or sampled on the host from the float32 logits.
    fn step(&mut self, tokens: &Array) -> Result<Pending> {
        let (params, config, ctx) = (self.params, self.config, &mut self.ctx);
        let logits = nn::without_gradients(|| M::forward(params, config, tokens, ctx))?;
        let last = logits.index((0, -1));
        match self.sampler.as_mut() {
            None => {
                let token = argmax_axis(&last, -1, false)?;
                async_eval([&token])?;
                Ok(Pending::Device(token))
            }
            Some(sampler) => {
                let last = last.as_dtype(Dtype::Float32)?;
                eval([&last])?;
                Ok(Pending::Host(sampler.next(last.as_slice::<f32>())))
            }
        }
    }
}

/// Samples tokens from logits on the host, reproducibly from its seed.
struct Sampler {
    sampling: Sampling,
    rng: SplitMix64,
}

impl Sampler {
    /// A token drawn from the tempered distribution of `logits`, cut to the top `k` and top `p`.
    fn next(&mut self, logits: &[f32]) -> u32 {
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        if let Some(k) = self.sampling.top_k {
            order.truncate(k.max(1));
        }
        let top = logits[order[0]];
        let weights: Vec<f64> = order
            .iter()
            .map(|&id| (((logits[id] - top) / self.sampling.temperature) as f64).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let mut kept = weights.len();
        if let Some(p) = self.sampling.top_p {
            let mut mass = 0.0;
            for (index, weight) in weights.iter().enumerate() {
                mass += weight / total;
                if mass >= p as f64 {
                    kept = index + 1;
                    break;
                }
            }
        }
        let total: f64 = weights[..kept].iter().sum();
        let mut draw = (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * total;
        for (index, weight) in weights[..kept].iter().enumerate() {
            draw -= weight;
            if draw < 0.0 {
                return order[index] as u32;
            }
        }
        order[kept - 1] as u32
    }
}
