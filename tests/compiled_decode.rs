//! The compiled decode step (`lmx_runtime::generate`'s traced step) for every bundled family:
//! greedy decoding past the cache's first growth block (and past the sliding windows, whose
//! layers keep rotating buffers) picks the tokens the full forward pass ranks first and the
//! tokens an op-by-op decoding loop over a cache that keeps every position picks, the step is traced once per cache
//! capacity block, and sampled decoding with a seed is reproducible and draws what the op-by-op
//! loop draws from the same key.

use lmx::models::{
    gemma, gemma2, gemma3_text, gpt2, llama, mistral, mixtral, mpt, phi3, qwen2, qwen3,
};
use lmx::runtime::generate::sampler::Sampler;
use lmx::runtime::generate::{generate, Sampling};
use lmx::runtime::mlx_rs::ops::indexing::IndexOp;
use lmx::runtime::mlx_rs::random;
use lmx::runtime::model::{Context, LanguageModel};
use lmx::runtime::{Array, Result};

/// The largest accepted shortfall of a greedy token's logit below the best, relative to the
/// logits' scale.
const TOLERANCE: f32 = 1e-4;

/// Prompt tokens.
const PROMPT: usize = 20;

/// Generated tokens: prompt and generation cross the cache's first block of 256 slots.
const NEW: usize = 260;

/// `M`'s tiny preset with room for the prompt and the generated tokens, random parameters and a
/// random prompt.
fn tiny<M: LanguageModel>(
    set_ctx: impl FnOnce(&mut M::Config),
) -> Result<(M::Config, M::Params, Vec<u32>)> {
    let mut config = M::preset("tiny").expect("every bundled family has a tiny preset");
    set_ctx(&mut config);
    let params = M::init(&config, 0)?;
    let vocab = M::vocab_size(&config) as i32;
    let prompt = random::randint::<_, i32>(0, vocab, &[PROMPT as i32][..], &random::key(2)?)?;
    let prompt = prompt
        .as_slice::<i32>()
        .iter()
        .map(|&id| id as u32)
        .collect();
    Ok((config, params, prompt))
}

fn ids(tokens: &[u32]) -> Array {
    let ids: Vec<i32> = tokens.iter().map(|&id| id as i32).collect();
    Array::from_slice(&ids, &[1, ids.len() as i32])
}

/// The tokens an op-by-op loop decodes: the prompt in one pass, then one forward pass of one
/// token at a time over the growing cache, the sampler on each pass's last logits.
fn op_by_op<M: LanguageModel>(
    config: &M::Config,
    params: &M::Params,
    prompt: &[u32],
    sampling: &Sampling,
) -> Result<Vec<u32>> {
    let mut sampler = Sampler::new(sampling, prompt)?;
    let mut ctx = Context::generation();
    let mut input = ids(prompt);
    let mut tokens = Vec::new();
    while tokens.len() < sampling.max_tokens {
        let logits = M::forward(params, config, &input, &mut ctx)?;
        let token = sampler.next(&logits.index((0, -1)))?.item_exact::<u32>();
        tokens.push(token);
        input = ids(&[token]);
    }
    Ok(tokens)
}

/// Greedy decoding of `NEW` tokens through the compiled step: traced twice (the cache's blocks of
/// 256 and 512 slots), each token a most likely one of the full forward pass over the tokens
/// before it, and the op-by-op loop's tokens.
/// `traces` is 1 for a model whose every layer attends in a sliding window: their buffers are
/// rings of the window's size, which never grow.
fn greedy_follows_the_full_forward_pass<M: LanguageModel>(
    set_ctx: impl FnOnce(&mut M::Config),
    traces: usize,
) -> Result<()> {
    let (config, params, prompt) = tiny::<M>(set_ctx)?;
    let sampling = Sampling {
        temperature: 0.0,
        max_tokens: NEW,
        ..Sampling::default()
    };
    let generation = generate::<M>(&params, &config, &prompt, &sampling, None, |_| ())?;
    let tokens = generation.tokens;
    assert_eq!(tokens.len(), NEW, "{}", M::NAME);
    assert_eq!(
        generation.decode_traces,
        traces,
        "{}: one trace per cache block",
        M::NAME
    );
    let sequence: Vec<u32> = prompt.iter().chain(&tokens[..NEW - 1]).copied().collect();
    let logits = M::forward(
        &params,
        &config,
        &ids(&sequence),
        &mut Context::evaluation(),
    )?;
    let logits = logits.index((0, PROMPT as i32 - 1..));
    let best = logits.max_axis(-1, false)?;
    let picked = logits
        .take_along_axis(Array::from_slice(&tokens, &[NEW as i32, 1]), -1)?
        .squeeze_axes(&[-1])?;
    let shortfall = best.subtract(&picked)?.max(false)?.item_exact::<f32>();
    let scale = logits.abs()?.max(false)?.item_exact::<f32>();
    assert!(
        shortfall <= TOLERANCE * scale,
        "{}: a greedy token's logit is {shortfall} below the full forward pass's best",
        M::NAME
    );
    assert_eq!(
        tokens,
        op_by_op::<M>(&config, &params, &prompt, &sampling)?,
        "{}: the compiled step and the op-by-op loop decode alike",
        M::NAME
    );
    Ok(())
}

macro_rules! families {
    ($($test:ident: $module:ident :: $model:ident, $traces:expr;)*) => {$(
        #[test]
        fn $test() -> Result<()> {
            greedy_follows_the_full_forward_pass::<$module::$model>(|config| {
                config.ctx = (PROMPT + NEW) as _
            }, $traces)
        }
    )*};
}

families! {
    gpt2_greedy_decoding_is_compiled: gpt2::Gpt2, 2;
    llama_greedy_decoding_is_compiled: llama::Llama, 2;
    mistral_greedy_decoding_is_compiled: mistral::Mistral, 2;
    mixtral_greedy_decoding_is_compiled: mixtral::Mixtral, 2;
    gemma_greedy_decoding_is_compiled: gemma::Gemma, 2;
    gemma2_greedy_decoding_is_compiled: gemma2::Gemma2, 2;
    gemma3_greedy_decoding_is_compiled: gemma3_text::Gemma3Text, 2;
    mpt_greedy_decoding_is_compiled: mpt::Mpt, 2;
    phi3_greedy_decoding_is_compiled: phi3::Phi3, 1;
    qwen2_greedy_decoding_is_compiled: qwen2::Qwen2, 2;
    qwen3_greedy_decoding_is_compiled: qwen3::Qwen3, 2;
}

/// LLaMA with a gated MLP of 256 features, a shape lmx's fused decoding kernel takes on CUDA (the
/// output projection and the pre-norm gated MLP as one launch, `cuda::MlpBlock`, in the traced
/// step as in the op-by-op loop; the tiny preset's 172 features are not a whole number of the
/// kernel's vectors): the same tokens as the full forward pass and the op-by-op loop.
#[test]
fn llama_greedy_decoding_through_the_fused_mlp() -> Result<()> {
    greedy_follows_the_full_forward_pass::<llama::Llama>(
        |config| {
            config.ctx = (PROMPT + NEW) as _;
            config.d_ff = 256;
        },
        2,
    )
}

/// LLaMA with heads of 64 (4 query heads over 2 key heads), a shape lmx's decode attention kernel
/// takes on CUDA: the traced step's kernel rotates the query and the key and writes the key and
/// value into the cache's buffers in place as it attends, across the buffers' growth past their
/// first block; the same tokens as the full forward pass and the op-by-op loop.
#[test]
fn llama_greedy_decoding_through_the_decode_attention_kernel() -> Result<()> {
    greedy_follows_the_full_forward_pass::<llama::Llama>(
        |config| {
            config.ctx = (PROMPT + NEW) as _;
            config.d_model = 256;
            config.d_ff = 256;
        },
        2,
    )
}

/// Sampling with a seed, top-k and a presence penalty: two runs draw the same tokens, the op-by-op
/// loop draws them too, another seed draws others; within one cache block the step is traced
/// once per length of the penalty's look-back window while it fills, then never again.
#[test]
fn sampled_decoding_is_reproducible_and_draws_as_the_op_by_op_loop() -> Result<()> {
    let (config, params, prompt) = tiny::<llama::Llama>(|_| ())?;
    let sampling = Sampling {
        temperature: 1.0,
        top_k: Some(20),
        presence_penalty: Some(0.5),
        penalty_context: PROMPT + 4,
        seed: 3,
        max_tokens: 40,
        ..Sampling::default()
    };
    let run = |sampling: &Sampling| {
        generate::<llama::Llama>(&params, &config, &prompt, sampling, None, |_| ())
    };
    let (a, b) = (run(&sampling)?, run(&sampling)?);
    assert_eq!(a.tokens, b.tokens);
    assert_eq!(a.tokens.len(), 40);
    // The window holds the prompt's 20 tokens and the first drawn one when the first step runs:
    // lengths 21, 22, 23 and 24 (full).
    assert_eq!(a.decode_traces, 4);
    assert_eq!(
        a.tokens,
        op_by_op::<llama::Llama>(&config, &params, &prompt, &sampling)?
    );
    let other = run(&Sampling {
        seed: 4,
        ..sampling.clone()
    })?;
    assert_ne!(a.tokens, other.tokens);
    Ok(())
}
