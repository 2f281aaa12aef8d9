//! A frozen model's per-token log-probabilities of a batch's targets, as a compiled function of
//! its own that the step reading them takes as an input (GRPO's reference).
//!
//! Inside the update, the reference's forward pass would be replayed on the host together with
//! the policy's forward and backward passes before the device starts anything, and a GRPO update
//! follows its rollouts' last synchronisation, so the device would wait for the whole replay. As
//! a function of its own, handed to the device first, the reference runs there while the host
//! replays the update.

use super::token_logprobs;
use crate::error::{Error, Result};
use crate::model::{Context, LanguageModel};
use crate::nn::without_gradients;
use crate::step::{prepare, PureFn};
use crate::train::frozen_tree;
use crate::tree;
use mlx_rs::Array;

/// The reference's pass: its frozen leaves and the function of `[frozen..., tokens, targets]`.
pub struct ReferenceLogprobs {
    frozen: Vec<Array>,
    pass: PureFn,
}

impl ReferenceLogprobs {
    /// The pass of model `M` at `reference` (its leaves inputs of the pass, never captured as
    /// constants), compiled unless `compiled` is false (the step's eager mode).
    pub fn new<M: LanguageModel>(reference: &M::Params, config: M::Config, compiled: bool) -> Self
    where
        M::Params: Clone + 'static,
    {
        let template = reference.clone();
        let body = move |inputs: &[Array]| -> Result<Vec<Array>> {
            let [frozen @ .., tokens, targets] = inputs else {
                return Err(Error::Layout(
                    "the reference's pass reads its leaves, tokens and targets".into(),
                ));
            };
            let reference = frozen_tree(&template, frozen)?;
            // No gradient of the reference is ever taken.
            without_gradients(|| {
                let logits = M::forward(&reference, &config, tokens, &mut Context::evaluation())?;
                Ok(vec![token_logprobs(&logits, targets)?])
            })
        };
        ReferenceLogprobs {
            frozen: tree::flatten(reference),
            pass: prepare(body, compiled),
        }
    }

    /// `[B, T]` float32 log-probabilities of `targets: [B, T]` after `tokens: [B, T]` under the
    /// reference, 0 where a target is ignored ([`token_logprobs`]), handed to the device and not
    /// waited for.
    ///
    /// # Errors
    /// The model's errors, and MLX's.
    pub fn logprobs(&mut self, tokens: &Array, targets: &Array) -> Result<Array> {
        let mut inputs = self.frozen.clone();
        inputs.extend([tokens.clone(), targets.clone()]);
        let logprobs = (self.pass)(&inputs)?
            .into_iter()
            .next()
            .ok_or_else(|| Error::Layout("the reference's pass returned nothing".into()))?;
        mlx_rs::transforms::async_eval([&logprobs])?;
        Ok(logprobs)
    }
}
