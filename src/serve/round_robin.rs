//! The engine the server runs until the runtime's batched generator takes its place: one KV
//! cache per sequence, and a step feeds every active sequence in turn its pending tokens (the
//! prompt, then the last token) and samples its next token on the host.

use super::engine::{Engine, Event, FinishReason, Request, Sampling, SeqId};
use lmx::runtime::data::rng::SplitMix64;
use lmx::runtime::generate::check_prompt;
use lmx::runtime::mlx_rs::ops::indexing::IndexOp;
use lmx::runtime::mlx_rs::transforms::eval;
use lmx::runtime::mlx_rs::{Array, Dtype};
use lmx::runtime::model::{Context, LanguageModel};
use lmx::runtime::{nn, Result};
use std::collections::HashMap;

/// A model's sequences, each with its own cache, stepped one after the other.
pub struct RoundRobin<M: LanguageModel> {
    params: M::Params,
    config: M::Config,
    next_id: u64,
    sequences: Vec<Sequence>,
}

struct Sequence {
    id: SeqId,
    ctx: Context,
    /// Tokens to feed at the next step.
    input: Vec<u32>,
    /// Tokens generated so far, and how many more it may generate.
    generated: usize,
    limit: usize,
    /// How often each token was generated (for the penalties).
    counts: HashMap<u32, u32>,
    sampling: Sampling,
    stop_tokens: Vec<u32>,
    rng: SplitMix64,
}

impl<M: LanguageModel> RoundRobin<M> {
    /// An engine over a model's parameters.
    pub fn new(params: M::Params, config: M::Config) -> Result<Self> {
        M::validate(&config)?;
        Ok(RoundRobin {
            params,
            config,
            next_id: 0,
            sequences: Vec::new(),
        })
    }

    /// The next token of `sequence`, after feeding it its input.
    fn next_token(&self, sequence: &mut Sequence) -> Result<u32> {
        let ids: Vec<i32> = sequence.input.iter().map(|&id| id as i32).collect();
        let tokens = Array::from_slice(&ids, &[1, ids.len() as i32]);
        let logits = nn::without_gradients(|| {
            M::forward(&self.params, &self.config, &tokens, &mut sequence.ctx)
        })?;
        let last = logits.index((0, -1)).as_dtype(Dtype::Float32)?;
        eval([&last])?;
        Ok(sequence.pick(last.as_slice::<f32>().to_vec()))
    }
}

impl Sequence {
    /// The token chosen from `logits` after the bias, the penalties and the temperature.
    fn pick(&mut self, mut logits: Vec<f32>) -> u32 {
        for &(token, bias) in &self.sampling.logit_bias {
            if let Some(logit) = logits.get_mut(token as usize) {
                *logit += bias;
            }
        }
        for (&token, &count) in &self.counts {
            if let Some(logit) = logits.get_mut(token as usize) {
                *logit -=
                    self.sampling.presence_penalty + self.sampling.frequency_penalty * count as f32;
            }
        }
        let first_max = |logits: &[f32]| {
            (0..logits.len()).fold(
                0,
                |best, id| if logits[id] > logits[best] { id } else { best },
            )
        };
        if self.sampling.temperature == 0.0 {
            return first_max(&logits) as u32;
        }
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
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

impl<M: LanguageModel> Engine for RoundRobin<M> {
    fn insert(&mut self, request: Request) -> Result<SeqId> {
        check_prompt::<M>(&self.config, &request.prompt)?;
        let id = SeqId(self.next_id);
        self.next_id += 1;
        let room = M::context_len(&self.config) - request.prompt.len();
        self.sequences.push(Sequence {
            id,
            ctx: Context::generation(),
            limit: request.sampling.max_tokens.min(room),
            input: request.prompt,
            generated: 0,
            counts: HashMap::new(),
            rng: SplitMix64::new(request.sampling.seed),
            sampling: request.sampling,
            stop_tokens: request.stop_tokens,
        });
        Ok(id)
    }

    fn step(&mut self) -> Result<Vec<Event>> {
        let mut sequences = std::mem::take(&mut self.sequences);
        let mut events = Vec::with_capacity(sequences.len());
        let mut failed = None;
        for sequence in &mut sequences {
            let token = match self.next_token(sequence) {
                Ok(token) => token,
                Err(err) => {
                    failed = Some(err);
                    break;
                }
            };
            sequence.generated += 1;
            *sequence.counts.entry(token).or_default() += 1;
            sequence.input = vec![token];
            let finish = if sequence.stop_tokens.contains(&token) {
                Some(FinishReason::Stop)
            } else if sequence.generated >= sequence.limit {
                Some(FinishReason::Length)
            } else {
                None
            };
            events.push(Event {
                id: sequence.id,
                token,
                finish,
            });
        }
        if let Some(err) = failed {
            self.sequences = sequences;
            return Err(err);
        }
        let finished: Vec<SeqId> = events
            .iter()
            .filter(|event| event.finish.is_some())
            .map(|event| event.id)
            .collect();
        sequences.retain(|sequence| !finished.contains(&sequence.id));
        self.sequences = sequences;
        Ok(events)
    }

    fn cancel(&mut self, id: SeqId) {
        self.sequences.retain(|sequence| sequence.id != id);
    }

    fn active(&self) -> usize {
        self.sequences.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sequence(sampling: Sampling, counts: &[(u32, u32)]) -> Sequence {
        Sequence {
            id: SeqId(0),
            ctx: Context::generation(),
            input: Vec::new(),
            generated: 0,
            limit: 1,
            counts: counts.iter().copied().collect(),
            rng: SplitMix64::new(sampling.seed),
            sampling,
            stop_tokens: Vec::new(),
        }
    }

    fn greedy() -> Sampling {
        Sampling {
            temperature: 0.0,
            top_p: None,
            seed: 0,
            max_tokens: 1,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
        }
    }

    #[test]
    fn penalties_and_bias_change_the_logits_before_the_pick() {
        let logits = vec![1.0, 0.9, 0.0];
        assert_eq!(sequence(greedy(), &[(0, 2)]).pick(logits.clone()), 0);
        // 1 - 0.05 - 2 x 0.1 = 0.75 < 0.9.
        let penalised = Sampling {
            presence_penalty: 0.05,
            frequency_penalty: 0.1,
            ..greedy()
        };
        assert_eq!(
            sequence(penalised.clone(), &[(0, 2)]).pick(logits.clone()),
            1
        );
        // One occurrence: 1 - 0.05 - 0.1 = 0.85 < 0.9 as well; none: token 0 stays first.
        assert_eq!(
            sequence(penalised.clone(), &[(0, 1)]).pick(logits.clone()),
            1
        );
        assert_eq!(sequence(penalised, &[]).pick(logits.clone()), 0);
        let biased = Sampling {
            logit_bias: vec![(2, 1.5)],
            ..greedy()
        };
        assert_eq!(sequence(biased, &[]).pick(logits.clone()), 2);
        // top_p small enough keeps the most likely token only, whatever the draw.
        let nucleus = Sampling {
            temperature: 1.0,
            top_p: Some(0.01),
            ..greedy()
        };
        for seed in 0..20 {
            let sampling = Sampling {
                seed,
                ..nucleus.clone()
            };
            assert_eq!(sequence(sampling, &[]).pick(logits.clone()), 0);
        }
    }
}
