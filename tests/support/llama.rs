//! A small LLaMA (RMSNorm, RoPE, SwiGLU, grouped-query attention) written as Rust structs under
//! `#[lmx::model]`, its parameters named as Hugging Face's `LlamaForCausalLM` names them
//! (`model.layers.0.self_attn.q_proj.weight`, ...), a language model with its training step under
//! `#[lmx::step]`.

use lmx::runtime::nn::init::{self, Keys};
use lmx::runtime::nn::{Activation, EmbeddingParams, LinearParams, RmsNormParams};
use lmx::runtime::optim::AdamW;
use lmx::runtime::tensor::nn::{
    cross_entropy, embedding, linear, merge_heads, rms_norm, rope, split_heads,
};
use lmx::runtime::tensor::{Context, Tensor};
use lmx::runtime::Result;

/// The static shape of a LLaMA.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LlamaConfig {
    /// Vocabulary size.
    pub vocab: i32,
    /// Model width.
    pub dim: i32,
    /// Decoder layers.
    pub layers: usize,
    /// Query heads.
    pub heads: i32,
    /// Key and value heads (fewer than `heads`: grouped-query attention).
    pub kv_heads: i32,
    /// Width of the SwiGLU hidden layer.
    pub hidden: i32,
    /// RoPE base frequency.
    pub rope_base: f32,
    /// RMSNorm epsilon.
    pub eps: f32,
}

impl LlamaConfig {
    /// A model small enough for tests on a CPU.
    pub fn tiny() -> LlamaConfig {
        LlamaConfig {
            vocab: 64,
            dim: 32,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            hidden: 64,
            rope_base: 10000.0,
            eps: 1e-5,
        }
    }

    fn head_dim(&self) -> i32 {
        self.dim / self.heads
    }
}

/// `LlamaForCausalLM`: the decoder stack and the output head.
#[lmx::model(
    config = LlamaConfig,
    init = Llama::build,
    forward = forward,
    vocab_size = vocab,
    presets(tiny = LlamaConfig::tiny()),
)]
pub struct Llama {
    /// The decoder stack.
    pub model: LlamaModel,
    /// The output projection to the vocabulary.
    pub lm_head: LinearParams,
}

/// `LlamaModel`: embeddings, decoder layers, final norm.
#[lmx::model]
pub struct LlamaModel {
    /// Token embeddings.
    pub embed_tokens: EmbeddingParams,
    /// The decoder layers.
    pub layers: Vec<DecoderLayer>,
    /// The final RMSNorm.
    pub norm: RmsNormParams,
}

/// One decoder layer: pre-norm attention and pre-norm SwiGLU, each with a residual.
#[lmx::model]
pub struct DecoderLayer {
    /// The norm before attention.
    pub input_layernorm: RmsNormParams,
    /// Grouped-query self-attention.
    pub self_attn: Attention,
    /// The norm before the feed-forward layer.
    pub post_attention_layernorm: RmsNormParams,
    /// The SwiGLU feed-forward layer.
    pub mlp: Mlp,
}

/// Self-attention projections (no biases).
#[lmx::model]
pub struct Attention {
    /// Queries: `[heads * head_dim, dim]`.
    pub q_proj: LinearParams,
    /// Keys: `[kv_heads * head_dim, dim]`.
    pub k_proj: LinearParams,
    /// Values: `[kv_heads * head_dim, dim]`.
    pub v_proj: LinearParams,
    /// Output: `[dim, heads * head_dim]`.
    pub o_proj: LinearParams,
}

/// SwiGLU: `down(silu(gate(x)) * up(x))`, the down projection of the gated product one call
/// (`Context::gated_linear`), as in `llama.lmx`.
#[lmx::model]
pub struct Mlp {
    /// The gate projection.
    pub gate_proj: LinearParams,
    /// The up projection.
    pub up_proj: LinearParams,
    /// The down projection.
    pub down_proj: LinearParams,
}

impl Llama {
    /// Fresh parameters for `config`, drawn from `keys` (MLX's default initialisers);
    /// `LanguageModel::init` draws them from a seed.
    pub fn build(config: &LlamaConfig, keys: &mut Keys) -> Result<Llama> {
        let (dim, kv_dim) = (config.dim, config.kv_heads * config.head_dim());
        let layers = (0..config.layers)
            .map(|_| {
                Ok(DecoderLayer {
                    self_attn: Attention {
                        q_proj: init::linear(dim, dim, false, keys)?,
                        k_proj: init::linear(dim, kv_dim, false, keys)?,
                        v_proj: init::linear(dim, kv_dim, false, keys)?,
                        o_proj: init::linear(dim, dim, false, keys)?,
                    },
                    mlp: Mlp {
                        gate_proj: init::linear(dim, config.hidden, false, keys)?,
                        up_proj: init::linear(dim, config.hidden, false, keys)?,
                        down_proj: init::linear(config.hidden, dim, false, keys)?,
                    },
                    input_layernorm: init::rms_norm(dim)?,
                    post_attention_layernorm: init::rms_norm(dim)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Llama {
            model: LlamaModel {
                embed_tokens: init::embedding(config.vocab, dim, keys)?,
                layers,
                norm: init::rms_norm(dim)?,
            },
            lm_head: init::linear(dim, config.vocab, false, keys)?,
        })
    }
}

/// Logits `[B, T, vocab]` for tokens `[B, T]`.
pub fn forward(
    params: &Llama<Tensor>,
    tokens: &Tensor,
    config: &LlamaConfig,
    ctx: &mut Context,
) -> Result<Tensor> {
    let mut h = embedding(&params.model.embed_tokens, tokens)?;
    // Each block's last projection adds its output to the residual stream `h` (one launch in
    // decoding), as the `.lmx` LLaMA's `x + self_attn(..)` and `x + mlp(..)` do.
    for layer in &params.model.layers {
        let normed = rms_norm(&layer.input_layernorm, &h, config.eps)?;
        h = attention(&layer.self_attn, &normed, &h, config, ctx)?;
        let normed = rms_norm(&layer.post_attention_layernorm, &h, config.eps)?;
        h = mlp(&layer.mlp, &normed, &h, ctx)?;
    }
    linear(
        &params.lm_head,
        &rms_norm(&params.model.norm, &h, config.eps)?,
    )
}

/// `residual` plus the attention of `x`.
fn attention(
    params: &Attention<Tensor>,
    x: &Tensor,
    residual: &Tensor,
    config: &LlamaConfig,
    ctx: &mut Context,
) -> Result<Tensor> {
    let head_dim = config.head_dim();
    // One product on a GPU over many rows, as the `.lmx` LLaMA's three calls on `x` are.
    let [q, k, v] = ctx.linears([&params.q_proj, &params.k_proj, &params.v_proj], x)?;
    let q = split_heads(&q, config.heads)?;
    let k = split_heads(&k, config.kv_heads)?;
    let v = split_heads(&v, config.kv_heads)?;
    let q = rope(&q, head_dim, config.rope_base, &ctx.offset())?;
    let k = rope(&k, head_dim, config.rope_base, &ctx.offset())?;
    let attended = merge_heads(&ctx.attend(&q, &k, &v)?)?;
    ctx.linear_plus(&params.o_proj, &attended, residual)
}

/// `residual` plus the gated MLP of `x`.
fn mlp(params: &Mlp<Tensor>, x: &Tensor, residual: &Tensor, ctx: &mut Context) -> Result<Tensor> {
    // The gate and up projections one product where that pays, and the down projection of
    // their gated product one call (one launch in decoding), as the `.lmx` LLaMA's are.
    let [gate, up] = ctx.linears([&params.gate_proj, &params.up_proj], x)?;
    ctx.gated_linear(
        &params.down_proj,
        Activation::Silu,
        (&gate, &up),
        Some(residual),
    )
}

/// The next-token loss: mean cross-entropy of the logits for `tokens` against `targets`.
#[lmx::step(optimizer = AdamW)]
pub fn train(
    params: &Llama<Tensor>,
    tokens: &Tensor,
    targets: &Tensor,
    config: &LlamaConfig,
    ctx: &mut Context,
) -> Result<Tensor> {
    cross_entropy(&forward(params, tokens, config, ctx)?, targets)
}
