//! Choosing the next token on the device, as mlx-lm's `make_logits_processors` and
//! `make_sampler` do: the logit bias and the repetition and presence penalties change the
//! logits; top-k, top-p and min-p cut the model's distribution (before the temperature); the
//! token is drawn at the temperature, or is the most likely one at temperature 0. Everything stays
//! lazy on the device, the tokens the penalties look back on included, so that a decoding loop
//! can queue the next step before the host reads this one's token.

use super::Sampling;
use crate::error::Result;
use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::ops::{self, argpartition_axis, sort_axis};
use mlx_rs::{random, Array, Dtype};

/// One sequence's sampler: its settings, its random key and the tokens its penalties see.
#[derive(Clone)]
pub struct Sampler {
    sampling: Sampling,
    /// Token ids and amounts of the logit bias (`None` when there is none).
    bias: Option<(Array, Array)>,
    /// The key the next draw splits off.
    key: Array,
    /// The last `penalty_context` tokens (`int32`), when a penalty is set.
    recent: Option<Array>,
}

impl Sampler {
    /// A sampler with `sampling`'s settings (validated by the caller), its penalties looking
    /// back on `prompt` first.
    pub fn new(sampling: &Sampling, prompt: &[u32]) -> Result<Sampler> {
        let bias = (!sampling.logit_bias.is_empty()).then(|| {
            let ids: Vec<i32> = sampling.logit_bias.keys().map(|&id| id as i32).collect();
            let amounts: Vec<f32> = sampling.logit_bias.values().copied().collect();
            let n = ids.len() as i32;
            (
                Array::from_slice(&ids, &[n]),
                Array::from_slice(&amounts, &[n]),
            )
        });
        let penalised = sampling.repetition_penalty.is_some()
            || sampling.presence_penalty.is_some()
            || sampling.frequency_penalty.is_some();
        let recent = penalised.then(|| {
            let tail: Vec<i32> = prompt[prompt.len().saturating_sub(sampling.penalty_context)..]
                .iter()
                .map(|&id| id as i32)
                .collect();
            Array::from_slice(&tail, &[tail.len() as i32])
        });
        Ok(Sampler {
            sampling: sampling.clone(),
            bias,
            key: random::key(sampling.seed)?,
            recent,
        })
    }

    /// The settings it samples with.
    pub(crate) fn settings(&self) -> &Sampling {
        &self.sampling
    }

    /// Whether its state is its key alone: no logit bias, no penalty (whose recent tokens it
    /// keeps), so that a draw depends on its settings, its key and the logits only.
    pub(crate) fn keeps_key_only(&self) -> bool {
        self.bias.is_none() && self.recent.is_none()
    }

    /// Whether the token is the most likely one of the logits as they are: no bias, no
    /// penalty, temperature 0 (a batch of such rows takes one `argmax`).
    pub fn is_plain_greedy(&self) -> bool {
        self.sampling.temperature == 0.0 && self.bias.is_none() && self.recent.is_none()
    }

    /// The next token (a `uint32` scalar, not evaluated) after `logits` (`[vocab]`), which it
    /// then remembers for its penalties.
    pub fn next(&mut self, logits: &Array) -> Result<Array> {
        let logits = self.processed(logits)?;
        let token = if self.sampling.temperature == 0.0 {
            argmax_axis(&logits, -1, false)?
        } else {
            let (carry, draw) = random::split(&self.key, 2)?;
            self.key = carry;
            let scaled = self
                .filtered(&logits)?
                .multiply(Array::from_f32(1.0 / self.sampling.temperature))?;
            random::categorical(&scaled, -1, None, &draw)?
        }
        .as_dtype(Dtype::Uint32)?;
        self.remember(&token)?;
        Ok(token)
    }

    /// The distribution the next token is drawn from (`[vocab]` probabilities): at temperature 0
    /// all mass on the most likely token. For tests and for speculative decoding's acceptance.
    pub fn probabilities(&self, logits: &Array) -> Result<Array> {
        let logits = self.processed(logits)?;
        if self.sampling.temperature == 0.0 {
            let best = argmax_axis(&logits, -1, true)?;
            let vocab = Array::arange::<_, i32>(None, logits.dim(-1), None)?;
            return Ok(vocab.eq(&best)?.as_dtype(Dtype::Float32)?);
        }
        let scaled = self
            .filtered(&logits)?
            .multiply(Array::from_f32(1.0 / self.sampling.temperature))?;
        Ok(ops::softmax_axis(&scaled, -1, true)?)
    }

    /// What changes from token to token: the key, then the recent tokens where a penalty looks
    /// at them (the state a compiled decode step reads and returns).
    pub(crate) fn state(&self) -> Vec<Array> {
        std::iter::once(self.key.clone())
            .chain(self.recent.clone())
            .collect()
    }

    /// Takes up `state`, laid out as [`state`](Self::state) gives it.
    pub(crate) fn set_state(&mut self, state: &[Array]) {
        self.key = state[0].clone();
        if self.recent.is_some() {
            self.recent = Some(state[1].clone());
        }
    }

    /// Remembers `token` (a scalar) among the tokens the penalties see.
    fn remember(&mut self, token: &Array) -> Result<()> {
        if let Some(recent) = &self.recent {
            let joined = ops::concatenate(
                &[recent.clone(), token.as_dtype(Dtype::Int32)?.reshape(&[1])?],
                0,
            )?;
            let keep = (self.sampling.penalty_context as i32).min(joined.dim(0));
            self.recent = Some(joined.index(joined.dim(0) - keep..));
        }
        Ok(())
    }

    /// Float32 logits with the bias added and the penalties applied to the recent tokens: a
    /// repeated token's logit divided by the repetition penalty (multiplied where negative),
    /// then lowered by the presence penalty (once, however often it occurred) and by the
    /// frequency penalty (once for each time it occurred).
    fn processed(&self, logits: &Array) -> Result<Array> {
        let mut logits = logits.as_dtype(Dtype::Float32)?;
        if let Some((ids, amounts)) = &self.bias {
            let biased = logits.take_along_axis(ids, 0)?.add(amounts)?;
            logits = logits.put_along_axis(ids, &biased, 0)?;
        }
        if let Some(recent) = self.recent.as_ref().filter(|recent| recent.dim(0) > 0) {
            let mut seen = logits.take_along_axis(recent, 0)?;
            if let Some(penalty) = self.sampling.repetition_penalty {
                let penalty = Array::from_f32(penalty);
                seen = ops::select(
                    &seen.lt(Array::from_f32(0.0))?,
                    &seen.multiply(&penalty)?,
                    &seen.divide(&penalty)?,
                )?;
            }
            if let Some(presence) = self.sampling.presence_penalty {
                seen = seen.subtract(Array::from_f32(presence))?;
            }
            if let Some(frequency) = self.sampling.frequency_penalty {
                // Each recent token's count among the recent tokens: every occurrence of a token
                // gets the same count, so writing them back agrees.
                let n = recent.dim(0);
                let counts = recent
                    .reshape(&[n, 1])?
                    .eq(recent.reshape(&[1, n])?)?
                    .sum_axis(1, false)?
                    .as_dtype(Dtype::Float32)?;
                seen = seen.subtract(counts.multiply(Array::from_f32(frequency))?)?;
            }
            logits = logits.put_along_axis(recent, &seen, 0)?;
        }
        Ok(logits)
    }

    /// Log-probabilities of `logits` with the tokens that top-k, top-p and min-p cut set to
    /// minus infinity (mlx-lm's order: top-p, min-p, top-k, each on the model's distribution).
    fn filtered(&self, logits: &Array) -> Result<Array> {
        let minus_inf = Array::from_f32(f32::NEG_INFINITY);
        let mut logprobs = logits.subtract(logits.logsumexp_axis(-1, true)?)?;
        let vocab = logprobs.dim(-1);
        if let Some(p) = self.sampling.top_p.filter(|&p| p < 1.0) {
            // The most likely tokens whose mass reaches `p`: the cut is the least likely kept
            // log-probability (a token tied with it is kept too, as in mlx-lm).
            let sorted = sort_axis(&logprobs, -1)?;
            let above = sorted.exp()?.cumsum(-1, true, false)?;
            let dropped = above
                .ge(Array::from_f32(p))?
                .sum_axis(-1, true)?
                .as_dtype(Dtype::Int32)?;
            let threshold = sorted.take_along_axis(&dropped, -1)?;
            logprobs = ops::select(&logprobs.lt(&threshold)?, &minus_inf, &logprobs)?;
        }
        if let Some(min_p) = self.sampling.min_p.filter(|&m| m > 0.0) {
            let floor = logprobs
                .max_axis(-1, true)?
                .add(Array::from_f32(min_p.ln()))?;
            logprobs = ops::select(&logprobs.lt(&floor)?, &minus_inf, &logprobs)?;
        }
        if let Some(k) = self.sampling.top_k.filter(|&k| k < vocab as usize) {
            let k = k as i32;
            let cut = argpartition_axis(logprobs.negative()?, k - 1, -1)?.index(k..);
            let fill = ops::broadcast_to(&minus_inf, cut.shape())?;
            logprobs = logprobs.put_along_axis(&cut, &fill, -1)?;
        }
        Ok(logprobs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// The probabilities `sampling` draws from after `logits`, having seen `history`.
    fn probabilities(sampling: Sampling, history: &[u32], logits: &[f32]) -> Vec<f32> {
        let sampler = Sampler::new(&sampling, history).unwrap();
        let logits = Array::from_slice(logits, &[logits.len() as i32]);
        let probs = sampler.probabilities(&logits).unwrap();
        probs.as_slice::<f32>().to_vec()
    }

    fn close(got: &[f32], want: &[f64]) {
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!(
                (f64::from(*g) - w).abs() < 1e-5,
                "got {got:?}, want {want:?}"
            );
        }
    }

    fn sampled(change: impl FnOnce(&mut Sampling)) -> Sampling {
        let mut sampling = Sampling {
            temperature: 1.0,
            top_k: None,
            ..Sampling::default()
        };
        change(&mut sampling);
        sampling
    }

    /// Probabilities proportional to `weights`, zero where the weight is zero.
    fn normalised(weights: &[f64]) -> Vec<f64> {
        let total: f64 = weights.iter().sum();
        weights.iter().map(|w| w / total).collect()
    }

    /// Logits of probabilities 0.4, 0.3, 0.2, 0.1: their logarithms, shifted by 3.
    fn logits() -> [f32; 4] {
        [0.4f32, 0.3, 0.2, 0.1].map(|p| p.ln() + 3.0)
    }

    #[test]
    fn temperature_rescales_the_distribution() {
        close(
            &probabilities(sampled(|_| ()), &[], &logits()),
            &[0.4, 0.3, 0.2, 0.1],
        );
        // p^(1/T): at T = 0.5 the squares, normalised.
        close(
            &probabilities(sampled(|s| s.temperature = 0.5), &[], &logits()),
            &normalised(&[0.16, 0.09, 0.04, 0.01]),
        );
        close(
            &probabilities(sampled(|s| s.temperature = 0.0), &[], &logits()),
            &[1.0, 0.0, 0.0, 0.0],
        );
    }

    #[test]
    fn top_k_top_p_and_min_p_cut_the_models_distribution_before_the_temperature() {
        close(
            &probabilities(sampled(|s| s.top_k = Some(2)), &[], &logits()),
            &normalised(&[0.4, 0.3, 0.0, 0.0]),
        );
        // A k past the vocabulary keeps every token.
        close(
            &probabilities(sampled(|s| s.top_k = Some(usize::MAX)), &[], &logits()),
            &[0.4, 0.3, 0.2, 0.1],
        );
        // 0.4 + 0.3 = 0.7 reaches 0.65; 0.4 alone does not.
        close(
            &probabilities(sampled(|s| s.top_p = Some(0.65)), &[], &logits()),
            &normalised(&[0.4, 0.3, 0.0, 0.0]),
        );
        close(
            &probabilities(sampled(|s| s.top_p = Some(0.75)), &[], &logits()),
            &normalised(&[0.4, 0.3, 0.2, 0.0]),
        );
        // min_p 0.5: at least half the top probability (0.2 and above).
        close(
            &probabilities(sampled(|s| s.min_p = Some(0.5)), &[], &logits()),
            &normalised(&[0.4, 0.3, 0.2, 0.0]),
        );
        // The cut is made on the model's distribution, then the survivors are tempered.
        close(
            &probabilities(
                sampled(|s| {
                    s.top_k = Some(3);
                    s.temperature = 0.5;
                }),
                &[],
                &logits(),
            ),
            &normalised(&[0.16, 0.09, 0.04, 0.0]),
        );
    }

    #[test]
    fn bias_and_penalties_change_the_logits_of_their_tokens() {
        let logits = [2.0f32, -1.0, 0.5, 0.0];
        let softmax = |l: [f64; 4]| normalised(&l.map(f64::exp));
        let mut bias = BTreeMap::new();
        bias.insert(3, 1.5);
        close(
            &probabilities(sampled(|s| s.logit_bias = bias), &[], &logits),
            &softmax([2.0, -1.0, 0.5, 1.5]),
        );
        // Token 0 (positive) is divided by 2, token 1 (negative) multiplied; a repeat counts once.
        close(
            &probabilities(
                sampled(|s| s.repetition_penalty = Some(2.0)),
                &[0, 1, 0],
                &logits,
            ),
            &softmax([1.0, -2.0, 0.5, 0.0]),
        );
        close(
            &probabilities(
                sampled(|s| s.presence_penalty = Some(0.75)),
                &[2, 2],
                &logits,
            ),
            &softmax([2.0, -1.0, -0.25, 0.0]),
        );
        // The frequency penalty counts each occurrence: token 2 twice, token 0 once.
        close(
            &probabilities(
                sampled(|s| s.frequency_penalty = Some(0.5)),
                &[2, 0, 2],
                &logits,
            ),
            &softmax([1.5, -1.0, -0.5, 0.0]),
        );
        // Only the last `penalty_context` tokens are penalised.
        close(
            &probabilities(
                sampled(|s| {
                    s.presence_penalty = Some(1.0);
                    s.penalty_context = 1;
                }),
                &[0, 2],
                &logits,
            ),
            &softmax([2.0, -1.0, -0.5, 0.0]),
        );
        // Greedy decoding sees the penalised logits.
        close(
            &probabilities(
                sampled(|s| {
                    s.temperature = 0.0;
                    s.repetition_penalty = Some(8.0);
                }),
                &[0],
                &logits,
            ),
            &[0.0, 0.0, 1.0, 0.0],
        );
    }

    /// Draws follow the distribution (a loose check of the draw itself; the filters are checked
    /// exactly above), the same seed draws the same tokens, and the sampler's own draws feed its
    /// penalties.
    #[test]
    fn draws_are_reproducible_and_follow_the_distribution() {
        let logits = Array::from_slice(&logits(), &[4]);
        let draw = |seed: u64, n: usize| -> Vec<u32> {
            let mut sampler = Sampler::new(&sampled(|s| s.seed = seed), &[]).unwrap();
            (0..n)
                .map(|_| sampler.next(&logits).unwrap().item_exact::<u32>())
                .collect()
        };
        let tokens = draw(5, 2000);
        assert_eq!(tokens, draw(5, 2000));
        assert_ne!(tokens, draw(6, 2000));
        for (id, want) in [0.4, 0.3, 0.2, 0.1].iter().enumerate() {
            let share = tokens.iter().filter(|&&t| t as usize == id).count() as f64 / 2000.0;
            assert!(
                (share - want).abs() < 0.04,
                "token {id}: {share} drawn, {want} expected"
            );
        }
        // A presence penalty that bans a token once drawn: four draws give four tokens.
        let mut sampler = Sampler::new(
            &sampled(|s| {
                s.presence_penalty = Some(1e4);
                s.penalty_context = 4;
            }),
            &[],
        )
        .unwrap();
        let mut four: Vec<u32> = (0..4)
            .map(|_| sampler.next(&logits).unwrap().item_exact::<u32>())
            .collect();
        four.sort_unstable();
        assert_eq!(four, [0, 1, 2, 3]);
    }
}
