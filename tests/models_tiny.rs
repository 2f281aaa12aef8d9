//! Every bundled model at its `tiny` preset: the generated parameter tree has exactly the names,
//! shapes and count that `lmx_grammar::report` derives from the `.lmx` file, and a few compiled
//! training steps on one batch lower the loss.

use lmx::models::{
    deepseek_v2, deepseek_v3, gemma, gemma2, gemma3_text, gpt2, llama, mistral, mixtral, mpt, phi3,
    qwen2, qwen3,
};
use lmx::runtime::model::{LanguageModel, TrainingStep};
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
    let config = M::preset(preset).expect("the generated code knows the preset");
    let params = M::init(&config, 0)?;
    let names = tree::names(&params);
    let expected: Vec<String> = report.params.iter().map(|p| p.name.clone()).collect();
    assert_eq!(names, expected, "{file}: parameter names");
    let mut shapes = Vec::new();
    params.for_each(&mut |leaf: &Array| {
        shapes.push(leaf.shape().iter().map(|&d| d as u64).collect::<Vec<_>>())
    });
    let expected: Vec<Vec<u64>> = report.params.iter().map(|p| p.shape.clone()).collect();
    assert_eq!(shapes, expected, "{file}: parameter shapes");
    let count: u64 = shapes.iter().map(|s| s.iter().product::<u64>()).sum();
    assert_eq!(count, report.param_count, "{file}: parameter count");
    Ok(())
}

#[test]
fn parameter_names_shapes_and_counts_match_the_report() -> Result<()> {
    names_match_report::<gpt2::Gpt2>("gpt2.lmx", "tiny")?;
    names_match_report::<llama::Llama>("llama.lmx", "tiny")?;
    names_match_report::<llama::Llama>("llama.lmx", "tiny-mqa")?;
    names_match_report::<gemma::Gemma>("gemma.lmx", "tiny")?;
    names_match_report::<mistral::Mistral>("mistral.lmx", "tiny")?;
    names_match_report::<mixtral::Mixtral>("mixtral.lmx", "tiny")?;
    names_match_report::<mpt::Mpt>("mpt.lmx", "tiny")?;
    names_match_report::<llama::Llama>("llama.lmx", "tiny-llama3")?;
    names_match_report::<qwen2::Qwen2>("qwen2.lmx", "tiny")?;
    names_match_report::<qwen3::Qwen3>("qwen3.lmx", "tiny")?;
    names_match_report::<gemma2::Gemma2>("gemma2.lmx", "tiny")?;
    names_match_report::<gemma3_text::Gemma3Text>("gemma3_text.lmx", "tiny")?;
    names_match_report::<phi3::Phi3>("phi3.lmx", "tiny")?;
    names_match_report::<deepseek_v2::DeepseekV2>("deepseek_v2.lmx", "tiny")?;
    names_match_report::<deepseek_v2::DeepseekV2>("deepseek_v2.lmx", "tiny-q-rank")?;
    names_match_report::<deepseek_v3::DeepseekV3>("deepseek_v3.lmx", "tiny")
}

/// Trains 8 compiled steps of `$step` at `tiny` (or `$preset`) on one fixed batch at rate `$lr` and checks that
/// the loss falls. (A macro: the step's concrete state types carry the bounds `TrainStep` needs.)
macro_rules! assert_learns {
    ($step:ty, $lr:expr) => {
        assert_learns!($step, "tiny", $lr)
    };
    ($step:ty, $preset:literal, $lr:expr) => {{
        type Model = <$step as TrainingStep>::Model;
        let config = Model::preset($preset).expect("the preset exists");
        let vocab = Model::vocab_size(&config) as i32;
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
        let key = mlx_rs::random::key(1)?;
        let tokens = mlx_rs::random::randint::<_, i32>(0, vocab, &[4, 16], &key)?;
        // A learnable target: each token's successor in the vocabulary.
        let targets = tokens
            .add(Array::from_int(1))?
            .remainder(Array::from_int(vocab))?;
        let batch = [tokens, targets];
        let mut losses = Vec::new();
        for _ in 0..8 {
            let metrics = step.step(&mut state, $lr, &batch)?;
            metrics.loss.eval()?;
            losses.push(metrics.loss.item_exact::<f32>());
        }
        assert_eq!(
            step.traces(),
            1,
            "{}: the compiled step is traced once",
            Model::NAME
        );
        let (first, last) = (losses[0], losses[losses.len() - 1]);
        assert!(
            losses.iter().all(|l| l.is_finite()),
            "{}: {losses:?}",
            Model::NAME
        );
        assert!(
            last < 0.9 * first,
            "{}: the loss fell from {first} to {last} only ({losses:?})",
            Model::NAME
        );
        Ok(())
    }};
}

#[test]
fn gpt2_trains() -> Result<()> {
    assert_learns!(gpt2::Train, 1e-2)
}

#[test]
fn llama_trains() -> Result<()> {
    assert_learns!(llama::Train, 1e-2)
}

#[test]
fn gemma_trains() -> Result<()> {
    assert_learns!(gemma::Train, 1e-2)
}

#[test]
fn mistral_trains() -> Result<()> {
    assert_learns!(mistral::Train, 1e-2)
}

#[test]
fn mixtral_trains() -> Result<()> {
    assert_learns!(mixtral::Train, 1e-2)
}

#[test]
fn mpt_trains() -> Result<()> {
    // Lion: unit-size updates, so a smaller rate.
    assert_learns!(mpt::Train, 2e-3)
}

/// Llama 3's scaled RoPE and tied head.
#[test]
fn llama3_trains() -> Result<()> {
    assert_learns!(llama::Train, "tiny-llama3", 1e-2)
}

#[test]
fn qwen2_trains() -> Result<()> {
    assert_learns!(qwen2::Train, 1e-2)
}

#[test]
fn qwen3_trains() -> Result<()> {
    assert_learns!(qwen3::Train, 1e-2)
}

/// Through soft-capped attention and logits, over sliding and global layers.
#[test]
fn gemma2_trains() -> Result<()> {
    assert_learns!(gemma2::Train, 1e-2)
}

#[test]
fn gemma3_text_trains() -> Result<()> {
    assert_learns!(gemma3_text::Train, 1e-2)
}

#[test]
fn phi3_trains() -> Result<()> {
    assert_learns!(phi3::Train, 1e-2)
}

#[test]
fn deepseek_v2_trains() -> Result<()> {
    assert_learns!(deepseek_v2::Train, 1e-2)
}

#[test]
fn deepseek_v3_trains() -> Result<()> {
    assert_learns!(deepseek_v3::Train, 1e-2)
}
