//! Generation past the key-value cache's first growth step (256 positions): cached decoding still
//! gives the full forward pass's logits, plain causal and sliding-window attention alike.

use lmx::models::{llama, mistral};
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
    let params = M::init(config, 0)?;
    let vocab = M::vocab_size(config) as i32;
    let tokens = random::randint::<_, i32>(0, vocab, &[1, LEN][..], &random::key(1)?)?;
    let full = M::forward(&params, config, &tokens, &mut Context::training())?;
    let mut bounds = vec![0, 1, 6, 250];
    bounds.extend(251..=LEN);
    let mut ctx = Context::generation();
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
    Ok(())
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
