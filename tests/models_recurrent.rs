//! The recurrent models (`ssd`, `gated_delta` and `causal_conv1d` layers: Mamba-2, the Jamba-like
//! hybrid of Mamba-2 mixers and attention, Qwen3-Next's Gated DeltaNet and gated attention) at
//! their `tiny` presets: the generated
//! tree matches the report, the compiled training step (traced once) lowers the loss, and
//! decoding through the cache's recurrent states, in prefill chunks and single tokens that cross
//! the scan's chunk boundaries, gives the full forward pass's logits.

use crate::support::reference::max_error;
use lmx::models::{hybrid, mamba2, qwen3_next};
use lmx::runtime::generate::{
    generate, generate_cached, speculative_generate, Models, PromptCache, Sampling,
};
use lmx::runtime::model::{Context, LanguageModel, TrainingStep};
use lmx::runtime::state::TrainState;
use lmx::runtime::step::TrainStep;
use lmx::runtime::tree::{self, Tree};
use lmx::runtime::{mlx_rs, Array, Result};

/// The generated tree of `M` at `preset` against the report of `file`.
fn names_match_report<M: LanguageModel>(file: &str, preset: &str) -> Result<()> {
    let path = format!("{}/models/{file}", env!("CARGO_MANIFEST_DIR"));
    let source = std::fs::read_to_string(&path).expect("the model file is readable");
    let checked = lmx_grammar::check_source(&path, &source).expect("bundled models check");
    let report = lmx_grammar::report::report(&checked, preset, 1, None).expect("the preset exists");
    let params = M::init(&M::preset(preset).expect("the preset"), 0)?;
    let expected: Vec<String> = report.params.iter().map(|p| p.name.clone()).collect();
    assert_eq!(tree::names(&params), expected, "{file}: parameter names");
    let mut count = 0u64;
    params.for_each(&mut |leaf: &Array| count += leaf.size() as u64);
    assert_eq!(count, report.param_count, "{file}: parameter count");
    Ok(())
}

/// Random tokens `[2, len]` below `vocab`.
fn tokens(vocab: usize, len: i32) -> Result<Array> {
    let key = mlx_rs::random::key(3)?;
    Ok(mlx_rs::random::randint::<_, i32>(
        0,
        vocab as i32,
        &[2, len],
        &key,
    )?)
}

/// Feeds `tokens` through a generation context in the pieces `bounds` cut, and compares the
/// logits with one forward pass over the whole sequence.
fn recurrent_decoding_matches_full<M: LanguageModel>(preset: &str, bounds: &[i32]) -> Result<()> {
    let config = M::preset(preset).expect("the preset");
    let params = M::init(&config, 1)?;
    let len = *bounds.last().unwrap();
    let tokens = tokens(M::vocab_size(&config), len)?;
    let full = M::forward(&params, &config, &tokens, &mut Context::evaluation())?;
    let mut ctx = Context::generation();
    let mut pieces = Vec::new();
    for pair in bounds.windows(2) {
        let picked = Array::arange::<_, i32>(pair[0], pair[1], None)?;
        let part = tokens.take_axis(&picked, 1)?;
        pieces.push(M::forward(&params, &config, &part, &mut ctx)?);
    }
    let decoded = mlx_rs::ops::concatenate(&pieces, 1)?;
    let error = max_error(&decoded, &full);
    println!("{}: max |recurrent - full| = {error:.2e}", M::NAME);
    assert!(
        error <= 1e-4,
        "{}: recurrent decoding differs by {error:e}",
        M::NAME
    );
    Ok(())
}

/// Trains 8 compiled steps of `$step` at `tiny` on one batch; the step is traced once and the
/// loss falls. (A macro: the step's concrete state types carry the bounds `TrainStep` needs.)
macro_rules! assert_learns {
    ($step:ty, $lr:expr) => {{
        type Model = <$step as TrainingStep>::Model;
        let config = Model::preset("tiny").expect("tiny");
        let vocab = Model::vocab_size(&config);
        let optimizer = <$step>::optimizer();
        let mut state = TrainState::new(Model::init(&config, 0)?, &optimizer, 0)?;
        let cfg = config.clone();
        let mut step = TrainStep::new(
            &state,
            optimizer,
            move |p: &<Model as LanguageModel>::Params, b: &[Array], k: &Array| {
                <$step>::loss(p, &cfg, b, Some(k))
            },
            <$step>::options(),
        )?;
        // 40 positions: more than two of the tiny presets' 16-position chunks.
        let tokens = tokens(vocab, 40)?;
        let targets = tokens
            .add(Array::from_int(1))?
            .remainder(Array::from_int(vocab as i32))?;
        let batch = [tokens, targets];
        let mut losses = Vec::new();
        for _ in 0..8 {
            let metrics = step.step(&mut state, $lr, &batch)?;
            metrics.loss.eval()?;
            losses.push(metrics.loss.item_exact::<f32>());
        }
        assert_eq!(step.traces(), 1, "the compiled step is traced once");
        let (first, last) = (losses[0], losses[losses.len() - 1]);
        assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
        assert!(
            last < 0.9 * first,
            "the loss fell from {first} to {last} only ({losses:?})"
        );
        Ok(())
    }};
}

#[test]
fn mamba2_tree_matches_the_report() -> Result<()> {
    names_match_report::<mamba2::Mamba2>("mamba2.lmx", "tiny")
}

#[test]
fn mamba2_trains_through_the_compiled_step() -> Result<()> {
    assert_learns!(mamba2::Train, 1e-2)
}

#[test]
fn mamba2_recurrent_decoding_matches_the_full_forward() -> Result<()> {
    // The tiny preset's chunk is 16 positions: a prefill of 21 spans two chunks, then single
    // tokens (the step form), then a second prefill that starts mid-chunk.
    recurrent_decoding_matches_full::<mamba2::Mamba2>("tiny", &[0, 21, 22, 23, 24, 37, 38, 40])
}

#[test]
fn hybrid_tree_matches_the_report() -> Result<()> {
    names_match_report::<hybrid::Hybrid>("hybrid.lmx", "tiny")
}

#[test]
fn hybrid_trains_through_the_compiled_step() -> Result<()> {
    assert_learns!(hybrid::Train, 1e-2)
}

#[test]
fn hybrid_decoding_through_both_caches_matches_the_full_forward() -> Result<()> {
    // Layers 1 and 3 attend (KV cache), 0 and 2 are mixers (recurrent states).
    recurrent_decoding_matches_full::<hybrid::Hybrid>("tiny", &[0, 17, 18, 19, 33, 34])
}

#[test]
fn qwen3_next_tree_matches_the_report() -> Result<()> {
    names_match_report::<qwen3_next::Qwen3Next>("qwen3_next.lmx", "tiny")?;
    names_match_report::<qwen3_next::Qwen3Next>("qwen3_next.lmx", "dense-tiny")
}

#[test]
fn qwen3_next_trains_through_the_compiled_step() -> Result<()> {
    assert_learns!(qwen3_next::Train, 1e-2)
}

#[test]
fn qwen3_next_decoding_through_both_caches_matches_the_full_forward() -> Result<()> {
    // tiny: layers 1 and 3 attend (KV cache), 0 and 2 run the delta rule (recurrent and
    // convolution states), chunks of 8: prefills that end and start mid-chunk, single steps.
    recurrent_decoding_matches_full::<qwen3_next::Qwen3Next>("tiny", &[0, 11, 12, 13, 29, 30])?;
    // dense-tiny: three DeltaNet layers, then one attending, dense MLPs only.
    recurrent_decoding_matches_full::<qwen3_next::Qwen3Next>("dense-tiny", &[0, 5, 6, 21, 22])
}

/// A prompt cache of a recurrent model: a prompt that extends what it holds continues from its
/// states; one that shares only a prefix (the states hold no earlier position) is fed from the
/// start. Either way the tokens are those of a fresh generation.
#[test]
fn mamba2_prompt_cache_continues_or_starts_over() -> Result<()> {
    type M = mamba2::Mamba2;
    let config = mamba2::Config::preset("tiny").expect("tiny");
    let params = M::init(&config, 0)?;
    let greedy = Sampling {
        temperature: 0.0,
        max_tokens: 6,
        ..Sampling::default()
    };
    let ids = |len: i32, seed: u64| -> Result<Vec<u32>> {
        let key = mlx_rs::random::key(seed)?;
        let ids = mlx_rs::random::randint::<_, i32>(0, 256, &[len][..], &key)?;
        Ok(ids.as_slice::<i32>().iter().map(|&id| id as u32).collect())
    };
    let mut cache = PromptCache::new();
    let mut run = |prompt: &[u32]| -> Result<(Vec<u32>, Vec<u32>)> {
        let cached =
            generate_cached::<M>(&params, &config, &mut cache, prompt, &greedy, None, |_| {
                true
            })?;
        let fresh = generate::<M>(&params, &config, prompt, &greedy, None, |_| ())?;
        Ok((cached.tokens, fresh.tokens))
    };
    let first = ids(20, 1)?;
    let (cached, fresh) = run(&first)?;
    assert_eq!(cached, fresh);
    // Everything the cache holds, then more: its states carry on.
    let mut longer = [&first[..], &cached[..5]].concat();
    longer.extend(ids(4, 2)?);
    let (cached, fresh) = run(&longer)?;
    assert_eq!(cached, fresh, "continued from the cached states");
    // Only the first 12 tokens shared: fed again from the start.
    let mut other = first[..12].to_vec();
    other.extend(ids(3, 3)?);
    let (cached, fresh) = run(&other)?;
    assert_eq!(cached, fresh, "a prefix of the cached tokens");
    Ok(())
}

/// Speculative decoding must drop the tokens the target rejects, which a recurrent state cannot:
/// with a Mamba-2 target it fails with the error naming the model, not with wrong tokens.
#[test]
fn speculative_decoding_with_a_recurrent_target_is_refused() -> Result<()> {
    let config = mamba2::Config::preset("tiny").expect("tiny");
    let (target, draft) = (
        mamba2::Mamba2::init(&config, 0)?,
        mamba2::Mamba2::init(&config, 1)?,
    );
    let models = Models::<mamba2::Mamba2, mamba2::Mamba2> {
        target: (&target, &config),
        draft: (&draft, &config),
    };
    let greedy = Sampling {
        temperature: 0.0,
        max_tokens: 20,
        ..Sampling::default()
    };
    let error = speculative_generate(models, &[1, 2, 3, 4], &greedy, 4, None, |_| ()).unwrap_err();
    assert_eq!(
        error.to_string(),
        "speculative decoding needs caches that can drop rejected tokens; mamba2's recurrent \
         layers keep states that cannot (generate without a draft model)"
    );
    Ok(())
}
