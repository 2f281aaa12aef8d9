//! Text generation: a KV-cached decoding loop with sampling on the device ([`sampler`]), prompt
//! caching ([`PromptCache`]), continuous batching ([`BatchGenerator`]), speculative decoding with
//! a draft model ([`speculative_generate`]), beam search and best-of-n ([`beam_search`],
//! [`best_of_n`]) and streamed text with stop strings
//! ([`text::TextStream`]).

mod batch;
mod batch_step;
pub(crate) mod cache;
mod decode;
pub(crate) mod ring;
mod row_sampler;
pub mod sampler;
mod search;
mod speculative;
pub(crate) mod state;
mod step;
pub mod text;

pub use batch::{BatchGenerator, BatchLimits, Event, FinishReason, Request, SeqId};
pub use decode::{generate, generate_cached, Generation, PromptCache};
pub use search::{beam_search, best_of_n, log_prob, Scored};
pub use speculative::{speculative_generate, Models, Speculation};

use crate::data::{DataError, TokenOrigin};
use crate::error::{Error, Result};
use crate::model::LanguageModel;
use std::collections::BTreeMap;

/// How the next token is chosen.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Sampling {
    /// 0 picks the first most likely token (greedy); a positive value divides the log-
    /// probabilities the token is drawn from. Negative, infinite and NaN are errors.
    pub temperature: f32,
    /// Keep only the `k` most likely tokens (`k` at least 1).
    pub top_k: Option<usize>,
    /// Keep the smallest set of most likely tokens whose probability reaches `p`, in `(0, 1]`.
    pub top_p: Option<f32>,
    /// Keep the tokens at least `min_p` times as likely as the most likely one, in `[0, 1]`.
    /// (top-k, top-p and min-p cut the model's distribution, before the temperature, as mlx-lm.)
    pub min_p: Option<f32>,
    /// Divides the (positive) logit of a token among the last `penalty_context` ones, multiplies
    /// a negative one: above 1 discourages repeats (finite, positive).
    pub repetition_penalty: Option<f32>,
    /// Subtracted from the logit of every token among the last `penalty_context` ones (finite).
    pub presence_penalty: Option<f32>,
    /// Subtracted from the logit of every token among the last `penalty_context` ones once for
    /// each time it occurs there (OpenAI's frequency penalty; finite).
    pub frequency_penalty: Option<f32>,
    /// How many of the last tokens (prompt included) the penalties look at.
    pub penalty_context: usize,
    /// Added to the logits of these token ids before anything else (finite amounts).
    pub logit_bias: BTreeMap<u32, f32>,
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
            min_p: None,
            repetition_penalty: None,
            presence_penalty: None,
            frequency_penalty: None,
            penalty_context: 20,
            logit_bias: BTreeMap::new(),
            seed: 0,
            max_tokens: 200,
        }
    }
}

impl Sampling {
    /// Fails with [`Error::Setting`], naming the first setting out of its range: a temperature
    /// that is negative, infinite or NaN, a `top_p` outside `(0, 1]` or NaN, a `top_k` of 0, a
    /// `min_p` outside `[0, 1]`, a repetition penalty not finite and positive, a presence
    /// penalty or a bias amount not finite.
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
        if let Some(m) = self.min_p.filter(|m| !(0.0..=1.0).contains(m)) {
            return bad("min_p", m.to_string(), "in [0, 1]");
        }
        if let Some(r) = self
            .repetition_penalty
            .filter(|r| !(r.is_finite() && *r > 0.0))
        {
            return bad(
                "repetition_penalty",
                r.to_string(),
                "a finite positive number",
            );
        }
        if let Some(p) = self.presence_penalty.filter(|p| !p.is_finite()) {
            return bad("presence_penalty", p.to_string(), "a finite number");
        }
        if let Some(p) = self.frequency_penalty.filter(|p| !p.is_finite()) {
            return bad("frequency_penalty", p.to_string(), "a finite number");
        }
        if let Some((id, amount)) = self.logit_bias.iter().find(|(_, a)| !a.is_finite()) {
            return bad("logit_bias", format!("{id}: {amount}"), "finite amounts");
        }
        Ok(())
    }

    /// Fails with [`Error::Setting`] when the logit bias names an id at or past `vocab_size`.
    pub fn check_vocab(&self, vocab_size: usize) -> Result<()> {
        match self
            .logit_bias
            .keys()
            .find(|&&id| id as usize >= vocab_size)
        {
            Some(&id) => Err(Error::Setting {
                name: "logit_bias",
                value: format!("token id {id}"),
                expected: "ids below the model's vocabulary size",
            }),
            None => Ok(()),
        }
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
