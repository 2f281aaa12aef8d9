//! Text generation: a KV-cached decoding loop with greedy, temperature, top-k and top-p sampling.

use crate::data::rng::SplitMix64;
use crate::error::{Error, Result};
use crate::model::{Context, LanguageModel};
use mlx_rs::{ops::indexing::IndexOp, transforms::eval, Array, Dtype};
use std::time::Instant;

/// How the next token is chosen.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Sampling {
    /// 0 picks the most likely token (greedy); otherwise logits are divided by it.
    pub temperature: f32,
    /// Keep only the `k` most likely tokens.
    pub top_k: Option<usize>,
    /// Keep the smallest set of most likely tokens whose probability reaches `p`.
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

/// What a generation produced, and how fast.
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    /// The generated tokens (the prompt excluded).
    pub tokens: Vec<u32>,
    /// Prompt tokens processed per second.
    pub prompt_tokens_per_s: f64,
    /// Generated tokens per second, after the prompt.
    pub decode_tokens_per_s: f64,
}

/// Generates up to `sampling.max_tokens` tokens after `prompt`, calling `on_token` with each, and
/// stops early at `stop` or at the model's context length.
pub fn generate<M: LanguageModel>(
    params: &M::Params,
    config: &M::Config,
    prompt: &[u32],
    sampling: &Sampling,
    stop: Option<u32>,
    mut on_token: impl FnMut(u32),
) -> Result<Generation> {
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
    let mut sampler = Sampler {
        sampling: sampling.clone(),
        rng: SplitMix64::new(sampling.seed),
    };
    let mut ctx = Context::generation();
    let started = Instant::now();
    let ids: Vec<i32> = prompt.iter().map(|&id| id as i32).collect();
    let mut logits = last_logits::<M>(params, config, &ids, &mut ctx)?;
    let prompt_seconds = started.elapsed().as_secs_f64();
    let decode_started = Instant::now();
    let mut tokens = Vec::new();
    while tokens.len() < sampling.max_tokens && prompt.len() + tokens.len() < context_len {
        let token = sampler.next(&logits)?;
        tokens.push(token);
        on_token(token);
        if Some(token) == stop || tokens.len() == sampling.max_tokens {
            break;
        }
        logits = last_logits::<M>(params, config, &[token as i32], &mut ctx)?;
    }
    let decode_seconds = decode_started.elapsed().as_secs_f64();
    Ok(Generation {
        prompt_tokens_per_s: prompt.len() as f64 / prompt_seconds,
        decode_tokens_per_s: tokens.len().saturating_sub(1) as f64
            / decode_seconds.max(f64::MIN_POSITIVE),
        tokens,
    })
}

/// The float32 logits of the last position after feeding `ids`.
fn last_logits<M: LanguageModel>(
    params: &M::Params,
    config: &M::Config,
    ids: &[i32],
    ctx: &mut Context,
) -> Result<Vec<f32>> {
    let tokens = Array::from_slice(ids, &[1, ids.len() as i32]);
    let logits = M::forward(params, config, &tokens, ctx)?;
    let last = logits.index((0, -1)).as_dtype(Dtype::Float32)?;
    eval([&last])?;
    Ok(last.as_slice::<f32>().to_vec())
}

/// Picks tokens from logits on the host, reproducibly from its seed.
struct Sampler {
    sampling: Sampling,
    rng: SplitMix64,
}

impl Sampler {
    fn next(&mut self, logits: &[f32]) -> Result<u32> {
        if self.sampling.temperature <= 0.0 {
            return Ok(argmax(logits));
        }
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
                return Ok(order[index] as u32);
            }
        }
        Ok(order[kept - 1] as u32)
    }
}

fn argmax(values: &[f32]) -> u32 {
    values
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map_or(0, |(index, _)| index as u32)
}
