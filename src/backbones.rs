//! The bundled models that multi-token prediction trains heads on (`lmx train --step mtp`):
//! each splits its generated forward pass into the hidden states, the embedding and the output
//! head that `objectives::Backbone` asks for, running the generated blocks through the module's
//! public `Pass::new`. A model of one's own implements the trait the same way.

use crate::models::llama;
use lmx_runtime::model::Context;
use lmx_runtime::nn;
use lmx_runtime::objectives::Backbone;
use lmx_runtime::{Array, Error, Result};

impl Backbone for llama::Llama {
    fn hidden_size(config: &llama::Config) -> usize {
        config.d_model as usize
    }

    fn attention_heads(config: &llama::Config) -> usize {
        config.n_heads as usize
    }

    fn hidden_states(
        params: &llama::Params,
        config: &llama::Config,
        tokens: &Array,
        ctx: &mut Context,
    ) -> Result<Array> {
        let mut x = nn::embedding(&params.model.embed_tokens, tokens)?;
        {
            let mut pass = llama::Pass::new(config, ctx, tokens);
            for layer in &params.model.layers {
                x = layer.forward(&mut pass, &x)?;
            }
        }
        ctx.advance(tokens.dim(-1));
        nn::rms_norm(&params.model.norm, &x, config.eps as f32)
    }

    fn embed(params: &llama::Params, _: &llama::Config, tokens: &Array) -> Result<Array> {
        nn::embedding(&params.model.embed_tokens, tokens)
    }

    fn output_head(
        params: &llama::Params,
        config: &llama::Config,
        hidden: &Array,
    ) -> Result<Array> {
        if config.tie {
            return nn::embedding_as_linear(&params.model.embed_tokens, hidden);
        }
        let head = params.lm_head.as_ref().ok_or_else(|| {
            Error::Config("an untied Llama has `lm_head`; these parameters have none".into())
        })?;
        nn::linear(head, hidden)
    }
}
