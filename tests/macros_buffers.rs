//! `#[lmx::model]` and `#[lmx::step(buffers)]`: a Rust model's buffer (`#[lmx(role = buffer)]`),
//! given its next value by the forward pass (`Context::write_buffer`), is state the compiled
//! step writes, as a `.lmx` forward pass's `next` is: no gradient, no optimizer state, no decay,
//! and no effect outside a training step.

use lmx::runtime::data::Windows;
use lmx::runtime::model::{self, LanguageModel, TrainingStep};
use lmx::runtime::nn::init::{self, Keys};
use lmx::runtime::nn::EmbeddingParams;
use lmx::runtime::optim::AdamW;
use lmx::runtime::schedule::Schedule;
use lmx::runtime::tensor::nn::{cross_entropy, embedding, embedding_as_linear};
use lmx::runtime::tensor::{Context, Tensor};
use lmx::runtime::train::{TrainConfig, Trainer};
use lmx::runtime::tree::{self, LeafRole};
use lmx::runtime::{Array, Result};
use std::sync::Arc;

/// The shape of a [`Counting`].
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CountingConfig {
    vocab: i32,
    dim: i32,
}

/// A bigram model that counts the training steps its forward pass ran in.
#[lmx::model(
    config = CountingConfig,
    init = Counting::build,
    forward = counting,
    vocab_size = vocab,
    context_len = vocab,
    presets(tiny = CountingConfig { vocab: 16, dim: 8 }),
)]
pub struct Counting {
    wte: EmbeddingParams,
    #[lmx(role = buffer)]
    steps: Array,
}

impl Counting {
    fn build(config: &CountingConfig, keys: &mut Keys) -> Result<Counting> {
        Ok(Counting {
            wte: init::embedding(config.vocab, config.dim, keys)?,
            steps: Array::from_f32(0.0),
        })
    }
}

/// Logits `[B, T, vocab]`; the buffer's next value is one more step.
fn counting(
    params: &Counting<Tensor>,
    tokens: &Tensor,
    _config: &CountingConfig,
    ctx: &mut Context,
) -> Result<Tensor> {
    ctx.write_buffer(&params.steps, &params.steps.add(&Tensor::scalar(1.0))?)?;
    embedding_as_linear(&params.wte, &embedding(&params.wte, tokens)?)
}

/// The next-token loss.
#[lmx::step(optimizer = AdamW { weight_decay: 0.5, ..AdamW::default() }, buffers)]
pub fn train(
    params: &Counting<Tensor>,
    tokens: &Tensor,
    targets: &Tensor,
    config: &CountingConfig,
    ctx: &mut Context,
) -> Result<Tensor> {
    cross_entropy(&counting(params, tokens, config, ctx)?, targets)
}

#[test]
fn the_step_writes_the_buffer_the_forward_pass_gave() -> Result<()> {
    const { assert!(Train::WRITES_BUFFERS) };
    let config = Counting::preset("tiny").expect("the preset");
    let params = Counting::init(&config, 0)?;
    let specs = tree::specs(&params);
    assert_eq!(specs[1].name, "steps");
    assert_eq!(specs[1].role, LeafRole::Buffer);
    assert!(!specs[1].trainable && !specs[1].decay);
    // Outside a step the write is dropped.
    let tokens = Array::from_slice(&[1, 2, 3, 4], &[1, 4]);
    Counting::forward(&params, &config, &tokens, &mut model::Context::evaluation())?;
    assert_eq!(params.steps.item_exact::<f32>(), 0.0);

    let ids: Vec<u32> = (0..513u32).map(|i| (i * 5 + 1) % 16).collect();
    let dir = tempfile::tempdir().unwrap();
    let train = TrainConfig {
        steps: 3,
        batch_size: 2,
        seq_len: 8,
        schedule: Schedule::Constant {
            lr: 1e-2,
            warmup_steps: 0,
        },
        validation_fraction: 0.0,
        out_dir: dir.path().to_path_buf(),
        ..TrainConfig::default()
    };
    let mut trainer = Trainer::<Train>::new(config, train, Windows::new(Arc::new(ids), 8)?)?;
    trainer.run()?;
    let state = trainer.state();
    state.params.steps.eval()?;
    assert_eq!(
        state.params.steps.item_exact::<f32>(),
        3.0,
        "one per step, undecayed"
    );
    assert!(!state
        .declaration()
        .iter()
        .any(|name| name.starts_with("opt.steps")));
    Ok(())
}
