//! Multi-token prediction (Gloeckle et al., 2024; DeepSeek-V3's sequential form), lmxlab's
//! `MTPHead` and `MultiTokenPrediction`: `n_predict` heads, head `k` predicting the token `k`
//! places after the next one from the previous head's hidden state (the base model's for the
//! first) and the embedding of the token before its target, through one transformer block and
//! the base model's own output head.
//!
//! The heads need three pieces of the base model that a forward pass alone does not give: its
//! final hidden states, its token embedding and its output head. [`Backbone`] asks a model for
//! them, so any model that exposes them (a bundled one, a `.lmx` or Rust model of a user's own)
//! trains with heads through [`Mtp`](super::mtp_model::Mtp), and nothing about the base model
//! changes: its forward pass, generation and checkpointed names stay its own.

use crate::error::{Error, Result};
use crate::model::{Context, LanguageModel};
use crate::nn::{self, init::Keys, LinearParams, RmsNormParams};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;

/// The norms' epsilon: MLX's `nn.RMSNorm` default and lmxlab's `BlockConfig.norm_eps`.
const EPS: f32 = 1e-5;

/// What multi-token prediction reads of a base model: `output_head(hidden_states(tokens))` must
/// be `forward(tokens)`, which [`check_backbone`] tests.
pub trait Backbone: LanguageModel {
    /// The width of the hidden states the output head reads (`d_model`).
    fn hidden_size(config: &Self::Config) -> usize;

    /// The attention heads of the model's blocks; a multi-token head's block has half as many
    /// (at least one), as lmxlab's default block configuration.
    fn attention_heads(config: &Self::Config) -> usize;

    /// The hidden states `[B, T, d_model]` that the output head reads (after the final norm).
    fn hidden_states(
        params: &Self::Params,
        config: &Self::Config,
        tokens: &Array,
        ctx: &mut Context,
    ) -> Result<Array>;

    /// The token embedding `[B, T, d_model]` of `tokens` (the model's input embedding layer).
    fn embed(params: &Self::Params, config: &Self::Config, tokens: &Array) -> Result<Array>;

    /// The logits `[B, T, vocab]` of hidden states `[B, T, d_model]`: the model's output head.
    fn output_head(params: &Self::Params, config: &Self::Config, hidden: &Array) -> Result<Array>;
}

/// The largest difference between `M::forward` and `output_head(hidden_states(..))` on
/// `tokens`: 0 for a [`Backbone`] that splits its forward pass faithfully.
pub fn check_backbone<M: Backbone>(
    params: &M::Params,
    config: &M::Config,
    tokens: &Array,
) -> Result<f32> {
    let whole = M::forward(params, config, tokens, &mut Context::evaluation())?;
    let hidden = M::hidden_states(params, config, tokens, &mut Context::evaluation())?;
    let split = M::output_head(params, config, &hidden)?;
    Ok(whole
        .subtract(&split)?
        .abs()?
        .max(None)?
        .item_exact::<f32>())
}

/// One multi-token head (lmxlab's `MTPHead`): RMS norms of the hidden state and of the previous
/// target's embedding, concatenated and projected back to `d_model`, then one pre-norm block.
#[derive(Clone, Debug, PartialEq, lmx_macros::Tree)]
#[lmx(runtime = "crate")]
pub struct MtpHead<T = Array> {
    pub hidden_norm: RmsNormParams<T>,
    pub embed_norm: RmsNormParams<T>,
    /// `[d_model, 2 d_model]`, no bias.
    pub proj: LinearParams<T>,
    pub block: MtpBlock<T>,
}

/// The head's block (lmxlab's default for it: multi-head attention with half the base's heads
/// and no positions, a GELU feed-forward of `2 d_model`, RMS norms, no biases, pre-norm).
#[derive(Clone, Debug, PartialEq, lmx_macros::Tree)]
#[lmx(runtime = "crate")]
pub struct MtpBlock<T = Array> {
    pub attn_norm: RmsNormParams<T>,
    pub attention: MtpAttention<T>,
    pub ffn_norm: RmsNormParams<T>,
    pub ffn: MtpFfn<T>,
}

/// The block's attention projections.
#[derive(Clone, Debug, PartialEq, lmx_macros::Tree)]
#[lmx(runtime = "crate")]
pub struct MtpAttention<T = Array> {
    pub q_proj: LinearParams<T>,
    pub k_proj: LinearParams<T>,
    pub v_proj: LinearParams<T>,
    pub o_proj: LinearParams<T>,
}

/// The block's feed-forward layers, `down(gelu(up(x)))`.
#[derive(Clone, Debug, PartialEq, lmx_macros::Tree)]
#[lmx(runtime = "crate")]
pub struct MtpFfn<T = Array> {
    pub up: LinearParams<T>,
    pub down: LinearParams<T>,
}

impl MtpHead {
    /// A head for hidden states of width `d_model`, initialised as MLX initialises its layers
    /// (norms ones, linear weights uniform in `±1/sqrt(input)`).
    pub fn init(d_model: usize, keys: &mut Keys) -> Result<MtpHead> {
        let d = d_model as i32;
        let linear = |input: i32, output: i32, keys: &mut Keys| -> Result<LinearParams> {
            nn::init::linear(input, output, false, keys)
        };
        Ok(MtpHead {
            hidden_norm: nn::init::rms_norm(d)?,
            embed_norm: nn::init::rms_norm(d)?,
            proj: linear(2 * d, d, keys)?,
            block: MtpBlock {
                attn_norm: nn::init::rms_norm(d)?,
                attention: MtpAttention {
                    q_proj: linear(d, d, keys)?,
                    k_proj: linear(d, d, keys)?,
                    v_proj: linear(d, d, keys)?,
                    o_proj: linear(d, d, keys)?,
                },
                ffn_norm: nn::init::rms_norm(d)?,
                ffn: MtpFfn {
                    up: linear(d, 2 * d, keys)?,
                    down: linear(2 * d, d, keys)?,
                },
            },
        })
    }

    /// The head's hidden states `[B, T, d_model]` from hidden states `h` and the embeddings
    /// `previous` of the tokens before the targets, both `[B, T, d_model]`. Its attention is
    /// causal, so position `t` reads nothing after `t` (see [`mtp_losses`]).
    pub fn forward(&self, h: &Array, previous: &Array, heads: usize) -> Result<Array> {
        let combined = mlx_rs::ops::concatenate(
            &[
                nn::rms_norm(&self.hidden_norm, h, EPS)?,
                nn::rms_norm(&self.embed_norm, previous, EPS)?,
            ],
            -1,
        )?;
        let x = nn::linear(&self.proj, &combined)?;
        let block = &self.block;
        let a = nn::rms_norm(&block.attn_norm, &x, EPS)?;
        let split = |layer: &LinearParams| -> Result<Array> {
            nn::split_heads(&nn::linear(layer, &a)?, heads as i32)
        };
        let attention = &block.attention;
        let (q, k, v) = (
            split(&attention.q_proj)?,
            split(&attention.k_proj)?,
            split(&attention.v_proj)?,
        );
        let mixed = nn::attention(&q, &k, &v, nn::AttentionMask::Causal)?;
        let x = x.add(nn::linear(&attention.o_proj, &nn::merge_heads(&mixed)?)?)?;
        let f = nn::rms_norm(&block.ffn_norm, &x, EPS)?;
        let f = nn::linear(&block.ffn.down, &nn::gelu(&nn::linear(&block.ffn.up, &f)?)?)?;
        Ok(x.add(f)?)
    }
}

/// lmxlab's defaults: two heads, auxiliary losses weighed 0.3.
pub const DEFAULT_N_PREDICT: usize = 2;
/// lmxlab's default `mtp_weight`.
pub const DEFAULT_MTP_WEIGHT: f32 = 0.3;

/// The losses of one batch, lazy float32 scalars.
#[derive(Clone, Debug)]
pub struct MtpLosses {
    /// The next-token cross-entropy of the base model's logits (the plain step's loss).
    pub main: Array,
    /// Head `k`'s cross-entropy (`k` from 0: the token two places ahead for the first head).
    pub heads: Vec<Array>,
    /// The mean of `heads`: lmxlab's `mtp_loss`.
    pub mtp: Array,
    /// `main + mtp_weight · mtp`: lmxlab's `total_loss`, the one differentiated.
    pub total: Array,
}

/// The multi-token losses of `tokens` and `targets` (`[B, T]`, `targets[t]` the token after
/// `tokens[t]`, negative where ignored) for base model `M` with `heads`.
///
/// Head `k` (1-based) reads the previous head's hidden states at positions `0 .. T - k` (the
/// base model's for head 1), with the embedding of `tokens[t + k]` (the token before its target,
/// read from the inputs so that a masked target still has its token), and predicts
/// `targets[t + k]`; its cross-entropy averages over those positions' kept targets, as lmxlab's
/// `reduction="mean"`. Two departures from lmxlab's code, both where it drops or leaks
/// positions: the main loss covers every position (lmxlab's leaves the last one out, which
/// would make it differ from the plain step's loss), and head `k` covers all `T - k` positions
/// that have a target (lmxlab's chained slicing loses one more per head); the heads' attention is
/// causal (lmxlab calls the block without a mask, so position `t` would read position `t + 1`'s
/// embedding, which is its own target).
///
/// # Errors
/// [`Error::Config`] when the sequences are not longer than the heads reach (`T <= n`).
pub fn mtp_losses<M: Backbone>(
    base: &M::Params,
    config: &M::Config,
    heads: &[MtpHead],
    mtp_weight: f32,
    tokens: &Array,
    targets: &Array,
    key: Option<&Array>,
) -> Result<MtpLosses> {
    let len = tokens.dim(1);
    if heads.is_empty() || len <= heads.len() as i32 {
        return Err(Error::Config(format!(
            "multi-token prediction with {} heads needs at least one head and sequences longer \
             than that, got sequences of {len} tokens",
            heads.len()
        )));
    }
    let attention_heads = mtp_attention_heads::<M>(config);
    let hidden = M::hidden_states(base, config, tokens, &mut Context::for_step(key))?;
    let main = nn::cross_entropy(&M::output_head(base, config, &hidden)?, targets)?;
    let mut losses = Vec::with_capacity(heads.len());
    let mut h = hidden;
    for (index, head) in heads.iter().enumerate() {
        let k = index as i32 + 1;
        let previous = M::embed(base, config, &tokens.index((.., k..)))?;
        h = head.forward(&h.index((.., ..len - k, ..)), &previous, attention_heads)?;
        let logits = M::output_head(base, config, &h)?;
        losses.push(nn::cross_entropy(&logits, &targets.index((.., k..)))?);
    }
    let mut sum = losses[0].clone();
    for loss in &losses[1..] {
        sum = sum.add(loss)?;
    }
    let mtp = sum.multiply(Array::from_f32(1.0 / losses.len() as f32))?;
    let total = main.add(mtp.multiply(Array::from_f32(mtp_weight))?)?;
    Ok(MtpLosses {
        main,
        heads: losses,
        mtp,
        total,
    })
}

/// The attention heads of a multi-token head's block over base model `M`: half the base's, at
/// least one.
pub fn mtp_attention_heads<M: Backbone>(config: &M::Config) -> usize {
    (M::attention_heads(config) / 2).max(1)
}
