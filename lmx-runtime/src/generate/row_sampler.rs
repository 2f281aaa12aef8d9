//! The next token of every row of a batch drawn by one compiled function, where the rows sample
//! alike: the same settings but their seeds, no logit bias and no penalties (GRPO's rollouts, a
//! bench or a server whose requests share their settings). Each row's draw in the trace is the
//! one its own [`Sampler`] makes (its key in, the key it carries on out), so a row samples what
//! it samples alone; the host records one call a token instead of every row's few ops.
//!
//! A trace holds for the bucket of rows (the decode step's: padded with copies of the first row,
//! whose draws are dropped) and the settings, fixed for the function's life.

use super::sampler::Sampler;
use super::Sampling;
use crate::error::{Error, Result};
use mlx_rs::error::Exception;
use mlx_rs::ops::{self, indexing::IndexOp};
use mlx_rs::transforms::compile::compile;
use mlx_rs::Array;

type Traced = Box<dyn FnMut(&[Array]) -> std::result::Result<Vec<Array>, Exception>>;

/// The compiled draw of a batch whose rows sample with `settings`.
pub(crate) struct RowSampler {
    /// The rows' settings, the seed left at 0 and `max_tokens` at 1: what the trace fixes.
    settings: Sampling,
    function: Traced,
}

impl RowSampler {
    /// The shared settings of `samplers`, if they sample alike and keep no state beside their
    /// keys (no logit bias, no penalties): then one [`RowSampler`] draws for all of them.
    pub(crate) fn shared(samplers: &[&Sampler]) -> Option<Sampling> {
        let first = samplers.first()?;
        let settings = drawn(first.settings());
        samplers
            .iter()
            .all(|sampler| sampler.keeps_key_only() && drawn(sampler.settings()) == settings)
            .then_some(settings)
    }

    /// The draw of rows with `settings` ([`shared`](Self::shared)'s).
    pub(crate) fn new(settings: Sampling) -> Result<RowSampler> {
        let template = Sampler::new(&settings, &[])?;
        let settings = template.settings().clone();
        // MLX calls the body only to trace it: `[logits [B, vocab], key...]` ->
        // `[tokens [B], key...]`.
        let body = move |inputs: &[Array]| -> Result<Vec<Array>> {
            let (logits, keys) = inputs.split_first().ok_or_else(|| {
                Error::Layout("the row sampler reads the logits and the rows' keys".into())
            })?;
            let mut tokens = Vec::with_capacity(keys.len());
            let mut carried = Vec::with_capacity(keys.len());
            for (row, key) in keys.iter().enumerate() {
                let mut sampler = template.clone();
                sampler.set_state(std::slice::from_ref(key));
                tokens.push(sampler.next(&logits.index(row as i32))?);
                carried.extend(sampler.state());
            }
            let mut outputs = vec![ops::stack(&tokens, 0)?];
            outputs.extend(carried);
            Ok(outputs)
        };
        let pure = move |inputs: &[Array]| body(inputs).map_err(Error::into_exception);
        Ok(RowSampler {
            settings,
            function: Box::new(compile(pure, false)),
        })
    }

    /// Whether this function draws for rows with `settings` ([`shared`](Self::shared)'s).
    pub(crate) fn draws(&self, settings: &Sampling) -> bool {
        &self.settings == settings
    }

    /// The next token of each of `samplers` (`[rows]`, `uint32`, queued) after `logits`
    /// (`[bucket, vocab]`, a row each, then the bucket's padding), each sampler's key carried on.
    pub(crate) fn next(&mut self, samplers: &mut [&mut Sampler], logits: &Array) -> Result<Array> {
        let rows = samplers.len();
        let bucket = logits.dim(0) as usize;
        let mut inputs = vec![logits.clone()];
        inputs.extend(
            (0..bucket).map(|row| samplers[if row < rows { row } else { 0 }].state()[0].clone()),
        );
        let outputs = (self.function)(&inputs)?;
        for (sampler, key) in samplers.iter_mut().zip(&outputs[1..]) {
            sampler.set_state(std::slice::from_ref(key));
        }
        Ok(outputs[0].index(..rows as i32))
    }
}

/// `sampling` as a draw depends on it: without its seed (the key is an input) and its token
/// budget.
fn drawn(sampling: &Sampling) -> Sampling {
    Sampling {
        seed: 0,
        max_tokens: 1,
        ..sampling.clone()
    }
}
