//! Generation past the key-value cache's first growth step (256 positions): cached decoding still
//! gives the full forward pass's logits, plain causal and sliding-window attention alike, and
//! greedy generation (the next token queued before the current one is read) picks the tokens the
//! full forward pass ranks first, stopping at the stop token, `max_tokens` and the context.

use lmx::models::{gemma2, gemma3_text, llama, mistral};
use lmx::runtime::generate::{generate, generate_cached, PromptCache, Sampling};
use lmx::runtime::mlx_rs::ops::indexing::IndexOp;
use lmx::runtime::mlx_rs::{ops, random};
use lmx::runtime::model::{Context, LanguageModel};
use lmx::runtime::nn::{self, Subscript};
use lmx::runtime::{Array, Result};

/// The largest accepted `max |cached - full| / max |full|`.
const TOLERANCE: f32 = 1e-4;

/// Sequence length: past the first growth step of the cache.
const LEN: i32 = 300;

/// `x[:, start..end]` of `[B, T]` tokens.
fn positions(x: &Array, start: i32, end: i32) -> Result<Array> {
    nn::index(
        x,
        &[
            Subscript::Range(None, None),
            Subscript::Range(Some(start), Some(end)),
        ],
    )
}

/// Decodes `LEN` random tokens with `M` at `config` in calls of 1, 5 and 244 tokens (up to position
/// 250), then one token at a time past position 256, and checks every position's logits against
/// the full forward pass.
fn cache_crosses_growth_step<M: LanguageModel>(config: &M::Config) -> Result<()> {
    cached_matches_full::<M>(config, Context::generation()).map(drop)
}

/// [`cache_crosses_growth_step`] over `ctx`'s cache; returns the context.
fn cached_matches_full<M: LanguageModel>(config: &M::Config, ctx: Context) -> Result<Context> {
    let mut ctx = ctx;
    let params = M::init(config, 0)?;
    let vocab = M::vocab_size(config) as i32;
    let tokens = random::randint::<_, i32>(0, vocab, &[1, LEN][..], &random::key(1)?)?;
    let full = M::forward(&params, config, &tokens, &mut Context::evaluation())?;
    let mut bounds = vec![0, 1, 6, 250];
    bounds.extend(251..=LEN);
    let mut steps = Vec::new();
    for pair in bounds.windows(2) {
        let call = positions(&tokens, pair[0], pair[1])?;
        steps.push(M::forward(&params, config, &call, &mut ctx)?);
    }
    assert_eq!(
        ctx.offset(),
        LEN,
        "{}: the cache holds every token",
        M::NAME
    );
    let cached = ops::concatenate(&steps, 1)?;
    let diff = cached.subtract(&full)?.abs()?.max(false)?;
    let error = diff.divide(full.abs()?.max(false)?)?.item_exact::<f32>();
    assert!(
        error <= TOLERANCE,
        "{}: cached decoding past 256 positions differs from the full forward pass by {error:e}",
        M::NAME
    );
    Ok(ctx)
}

/// A rotating cache keeps only the last `window` positions of a sliding-window layer: decoding far
/// past the window (in calls of 1, 5 and 244 tokens, then one at a time) still gives the full
/// forward pass's logits, and each windowed layer holds `window` slots, the others every position.
fn rotating_cache_matches_full<M: LanguageModel>(config: &M::Config, window: i32) -> Result<()> {
    let ctx = cached_matches_full::<M>(config, Context::rotating_generation())?;
    let slots = ctx.cached_slots();
    assert!(
        slots.contains(&window) && slots.iter().all(|&held| held == window || held >= LEN),
        "{}: slots per layer {slots:?}, window {window}",
        M::NAME
    );
    Ok(())
}

#[test]
fn mistral_rotating_cache_keeps_the_window() -> Result<()> {
    let mut config = mistral::Config::preset("tiny").expect("mistral has a tiny preset");
    config.ctx = LEN as _;
    rotating_cache_matches_full::<mistral::Mistral>(&config, config.window as i32)
}

/// Gemma 2's local layers (soft-capped attention) and Gemma 3's.
#[test]
fn gemma_local_layers_rotate() -> Result<()> {
    let mut config = gemma2::Config::preset("tiny").expect("gemma2 has a tiny preset");
    config.ctx = LEN as _;
    rotating_cache_matches_full::<gemma2::Gemma2>(&config, config.window as i32)?;
    let mut config = gemma3_text::Config::preset("tiny").expect("gemma3 has a tiny preset");
    config.ctx = LEN as _;
    rotating_cache_matches_full::<gemma3_text::Gemma3Text>(&config, config.window as i32)
}

#[test]
fn llama_cached_decoding_crosses_the_growth_step() -> Result<()> {
    let mut config = llama::Config::preset("tiny").expect("llama has a tiny preset");
    config.ctx = LEN as _;
    cache_crosses_growth_step::<llama::Llama>(&config)
}

/// Sliding-window attention reads the cache through `Context::keys_values`.
#[test]
fn mistral_cached_decoding_crosses_the_growth_step() -> Result<()> {
    let mut config = mistral::Config::preset("tiny").expect("mistral has a tiny preset");
    config.ctx = LEN as _;
    cache_crosses_growth_step::<mistral::Mistral>(&config)
}

/// Tokens in `tiny_llama`'s prompt.
const PROMPT: usize = 20;

/// The tiny LLaMA with room for `ctx` tokens, random parameters and a random prompt.
fn tiny_llama(ctx: usize) -> Result<(llama::Config, llama::Params, Vec<u32>)> {
    tiny_llama_prompt(ctx, PROMPT)
}

/// The tiny LLaMA with room for `ctx` tokens, random parameters and a random prompt of `len`.
fn tiny_llama_prompt(ctx: usize, len: usize) -> Result<(llama::Config, llama::Params, Vec<u32>)> {
    let mut config = llama::Config::preset("tiny").expect("llama has a tiny preset");
    config.ctx = ctx as _;
    let params = llama::Llama::init(&config, 0)?;
    let prompt =
        random::randint::<_, i32>(0, config.vocab as i32, &[len as i32][..], &random::key(2)?)?;
    let prompt = prompt
        .as_slice::<i32>()
        .iter()
        .map(|&id| id as u32)
        .collect();
    Ok((config, params, prompt))
}

/// Greedy decoding of up to `max_tokens` tokens, with the tokens `on_token` saw.
fn greedy(
    config: &llama::Config,
    params: &llama::Params,
    prompt: &[u32],
    max_tokens: usize,
    stop: Option<u32>,
) -> Result<Vec<u32>> {
    let sampling = Sampling {
        temperature: 0.0,
        max_tokens,
        ..Sampling::default()
    };
    let mut seen = Vec::new();
    let generation = generate::<llama::Llama>(params, config, prompt, &sampling, stop, |token| {
        seen.push(token)
    })?;
    assert_eq!(seen, generation.tokens, "on_token sees every token once");
    Ok(generation.tokens)
}

/// 300 greedy tokens (past the cache's growth step): each is a most likely token of the full
/// forward pass over the prompt and the tokens before it (up to rounding between the two).
#[test]
fn greedy_generation_follows_the_full_forward_pass() -> Result<()> {
    follows_the_full_forward_pass(320, PROMPT, 300)
}

/// A prompt longer than two prefill chunks (512 tokens each), fed in three passes.
#[test]
fn a_prompt_fed_in_chunks_gives_the_full_forward_pass_tokens() -> Result<()> {
    follows_the_full_forward_pass(1100, 1030, 20)
}

/// `new` greedy tokens after a prompt of `len` tokens, in a context of `ctx`, against the full
/// forward pass.
fn follows_the_full_forward_pass(ctx: usize, len: usize, new: usize) -> Result<()> {
    let (config, params, prompt) = tiny_llama_prompt(ctx, len)?;
    let tokens = greedy(&config, &params, &prompt, new, None)?;
    assert_eq!(tokens.len(), new);
    let sequence: Vec<i32> = prompt
        .iter()
        .chain(&tokens[..tokens.len() - 1])
        .map(|&id| id as i32)
        .collect();
    let input = Array::from_slice(&sequence, &[1, sequence.len() as i32]);
    let logits = llama::Llama::forward(&params, &config, &input, &mut Context::evaluation())?;
    let logits = logits.index((0, prompt.len() as i32 - 1..));
    let best = logits.max_axis(-1, false)?;
    let picked = logits
        .take_along_axis(Array::from_slice(&tokens, &[tokens.len() as i32, 1]), -1)?
        .squeeze_axes(&[-1])?;
    let shortfall = best.subtract(&picked)?.max(false)?.item_exact::<f32>();
    let scale = logits.abs()?.max(false)?.item_exact::<f32>();
    assert!(
        shortfall <= TOLERANCE * scale,
        "a greedy token's logit is {shortfall} below the best of the full forward pass"
    );
    Ok(())
}

/// Greedy generation ends at the stop token (included), after `max_tokens`, or when the prompt
/// and the generated tokens fill the context, and is a prefix of a longer run otherwise.
#[test]
fn greedy_generation_stops_at_stop_token_max_tokens_and_context() -> Result<()> {
    let (config, params, prompt) = tiny_llama(256)?;
    let free = greedy(&config, &params, &prompt, 12, None)?;
    assert_eq!(free.len(), 12);
    let stop = free[5];
    let first = free
        .iter()
        .position(|&token| token == stop)
        .expect("present");
    assert_eq!(
        greedy(&config, &params, &prompt, 12, Some(stop))?,
        free[..=first]
    );
    assert_eq!(greedy(&config, &params, &prompt, 3, None)?, free[..3]);
    assert_eq!(greedy(&config, &params, &prompt, 1, None)?, free[..1]);
    assert!(greedy(&config, &params, &prompt, 0, None)?.is_empty());
    let (short, _, _) = tiny_llama(PROMPT + 7)?;
    assert_eq!(greedy(&short, &params, &prompt, 12, None)?, free[..7]);
    Ok(())
}

/// Sampling stops at the context too, and the same seed draws the same tokens.
#[test]
fn sampled_generation_is_reproducible_and_bounded() -> Result<()> {
    let (config, params, prompt) = tiny_llama(PROMPT + 10)?;
    let sampling = Sampling {
        temperature: 1.0,
        top_k: Some(20),
        seed: 3,
        max_tokens: 50,
        ..Sampling::default()
    };
    let run = || generate::<llama::Llama>(&params, &config, &prompt, &sampling, None, |_| ());
    let (a, b) = (run()?, run()?);
    assert_eq!(a.tokens, b.tokens);
    assert_eq!(a.tokens.len(), 10);
    Ok(())
}

/// A bounded prompt cache (mlx-lm's `max_kv_size` and `keep`) whose ring holds every position
/// generates the tokens of an unbounded one: its rings and their masks stand in for the plain
/// buffers in the prefill and in the traced steps. One that would keep all it holds is refused.
#[test]
fn a_bounded_cache_that_holds_every_position_generates_as_an_unbounded_one() -> Result<()> {
    let config = llama::Config::preset("tiny").expect("llama has a tiny preset");
    let params = llama::Llama::init(&config, 0)?;
    let prompt: Vec<u32> = (0..12).map(|i| (i * 37 % 256) as u32).collect();
    let sampling = Sampling {
        temperature: 0.0,
        top_k: None,
        max_tokens: 30,
        ..Sampling::default()
    };
    let plain = generate::<llama::Llama>(&params, &config, &prompt, &sampling, None, |_| ())?;
    let mut cache = PromptCache::bounded(64, 4)?;
    let bounded = generate_cached::<llama::Llama>(
        &params,
        &config,
        &mut cache,
        &prompt,
        &sampling,
        None,
        |_| true,
    )?;
    assert_eq!(bounded.tokens, plain.tokens);
    let refused = PromptCache::bounded(4, 4)
        .err()
        .expect("a ring that keeps all its slots is refused")
        .to_string();
    assert_eq!(
        refused,
        "max_kv_size is 4 with keep 4; it must be more than keep (the first positions, kept for good)"
    );
    Ok(())
}
