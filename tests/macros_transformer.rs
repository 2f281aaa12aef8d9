//! A small transformer of this test's own, written in Rust under `#[lmx::model]` and
//! `#[lmx::step]` (learned positions plus partial rotary embeddings, a fused QKV projection split
//! three ways, dropout, a tied output head): it trains through `Trainer` as a `.lmx` model does
//! (the loss falls), checkpoints and resumes with bit-identical losses, and generates with the
//! KV cache, cached decoding equal to full forward passes.

use lmx::runtime::data::{rng::SplitMix64, Windows};
use lmx::runtime::generate::{generate, Sampling};
use lmx::runtime::mlx_rs::ops::indexing::IndexOp;
use lmx::runtime::model::{self, LanguageModel, TrainingStep};
use lmx::runtime::nn::init::{self, Keys};
use lmx::runtime::nn::{EmbeddingParams, LayerNormParams, LinearParams};
use lmx::runtime::optim::AdamW;
use lmx::runtime::schedule::Schedule;
use lmx::runtime::tensor::nn::{
    cross_entropy, embedding, embedding_as_linear, gelu_tanh, layer_norm, linear, merge_heads,
    rope, split_heads,
};
use lmx::runtime::tensor::{concatenate, Context, Tensor};
use lmx::runtime::train::{Callback, Control, StepReport, TrainConfig, Trainer};
use lmx::runtime::{Array, Error, Result};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// The shape of a [`Pico`].
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PicoConfig {
    vocab: i32,
    dim: i32,
    heads: i32,
    layers: usize,
    context: i32,
    /// Features of each head that RoPE rotates; the rest pass through.
    rotary: i32,
    dropout: f32,
}

impl PicoConfig {
    fn pico() -> PicoConfig {
        PicoConfig {
            vocab: 32,
            dim: 32,
            heads: 4,
            layers: 2,
            context: 32,
            rotary: 4,
            dropout: 0.1,
        }
    }

    fn check(&self) -> Result<()> {
        if self.heads < 1 || self.dim % self.heads != 0 {
            return Err(Error::Config(format!(
                "`heads` ({}) must divide `dim` ({})",
                self.heads, self.dim
            )));
        }
        if self.rotary % 2 != 0 || self.rotary > self.dim / self.heads {
            return Err(Error::Config(format!(
                "`rotary` ({}) must be even and at most the head width",
                self.rotary
            )));
        }
        Ok(())
    }
}

/// A GPT-style decoder whose output head is its token embedding.
#[lmx::model(
    config = PicoConfig,
    init = Pico::build,
    forward = pico,
    vocab_size = vocab,
    context_len = context,
    presets(pico = PicoConfig::pico()),
    validate = PicoConfig::check,
)]
pub struct Pico {
    wte: EmbeddingParams,
    wpe: EmbeddingParams,
    blocks: Vec<PicoBlock>,
    ln_f: LayerNormParams,
    #[lmx(tied = "wte")]
    head: EmbeddingParams,
}

/// Pre-norm attention and MLP, each with a residual.
#[lmx::model]
pub struct PicoBlock {
    ln_1: LayerNormParams,
    qkv: LinearParams,
    proj: LinearParams,
    ln_2: LayerNormParams,
    up: LinearParams,
    down: LinearParams,
}

impl Pico {
    fn build(config: &PicoConfig, keys: &mut Keys) -> Result<Pico> {
        let dim = config.dim;
        let blocks = (0..config.layers)
            .map(|_| {
                Ok(PicoBlock {
                    ln_1: init::layer_norm(dim, true)?,
                    qkv: init::linear(dim, 3 * dim, true, keys)?,
                    proj: init::linear(dim, dim, true, keys)?,
                    ln_2: init::layer_norm(dim, true)?,
                    up: init::linear(dim, 4 * dim, true, keys)?,
                    down: init::linear(4 * dim, dim, true, keys)?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Pico {
            wte: init::embedding(config.vocab, dim, keys)?,
            wpe: init::embedding(config.context, dim, keys)?,
            blocks,
            ln_f: init::layer_norm(dim, true)?,
        })
    }
}

/// RoPE over the first `rotary` features of each head, from position `offset`.
fn partial_rope(x: &Tensor, rotary: i32, offset: &Tensor) -> Result<Tensor> {
    let rotated = rope(&x.slice(-1, ..rotary)?, rotary, 10_000.0, offset)?;
    concatenate(&[rotated, x.slice(-1, rotary..)?], -1)
}

/// Logits `[B, T, vocab]` for tokens `[B, T]`.
fn pico(
    params: &Pico<Tensor>,
    tokens: &Tensor,
    config: &PicoConfig,
    ctx: &mut Context,
) -> Result<Tensor> {
    let positions = Tensor::arange(&ctx.offset(), tokens.dim(-1))?;
    let mut h = embedding(&params.wte, tokens)?.add(&embedding(&params.wpe, &positions)?)?;
    h = ctx.dropout(&h, config.dropout)?;
    for block in &params.blocks {
        let x = layer_norm(&block.ln_1, &h, 1e-5)?;
        let [q, k, v] = linear(&block.qkv, &x)?.split(-1)?;
        let q = partial_rope(
            &split_heads(&q, config.heads)?,
            config.rotary,
            &ctx.offset(),
        )?;
        let k = partial_rope(
            &split_heads(&k, config.heads)?,
            config.rotary,
            &ctx.offset(),
        )?;
        let v = split_heads(&v, config.heads)?;
        let attended = linear(&block.proj, &merge_heads(&ctx.attend(&q, &k, &v)?)?)?;
        h = h.add(&ctx.dropout(&attended, config.dropout)?)?;
        let x = layer_norm(&block.ln_2, &h, 1e-5)?;
        let mixed = linear(&block.down, &gelu_tanh(&linear(&block.up, &x)?)?)?;
        h = h.add(&ctx.dropout(&mixed, config.dropout)?)?;
    }
    embedding_as_linear(params.head(), &layer_norm(&params.ln_f, &h, 1e-5)?)
}

/// The next-token loss.
#[lmx::step(optimizer = AdamW { weight_decay: 0.01, ..AdamW::default() }, clip_norm = 1.0)]
pub fn train(
    params: &Pico<Tensor>,
    tokens: &Tensor,
    targets: &Tensor,
    config: &PicoConfig,
    ctx: &mut Context,
) -> Result<Tensor> {
    cross_entropy(&pico(params, tokens, config, ctx)?, targets)
}

/// The next-token loss plus `0.1 ·` the mean squared distance of the logits to those of a
/// frozen copy of the policy, which runs without dropout and without gradients; the step
/// reports that pull as a metric of its own.
#[lmx::step(optimizer = AdamW, frozen(reference = policy), metrics(pull))]
pub fn anchored(
    params: &Pico<Tensor>,
    reference: &Pico<Tensor>,
    tokens: &Tensor,
    targets: &Tensor,
    config: &PicoConfig,
    ctx: &mut Context,
) -> Result<(Tensor, Tensor)> {
    let logits = pico(params, tokens, config, ctx)?;
    let anchor = Context::frozen(|frozen| pico(reference, tokens, config, frozen))?;
    let pull = logits.subtract(&anchor)?.square()?.mean()?.scale(0.1)?;
    Ok((cross_entropy(&logits, targets)?.add(&pull)?, pull))
}

/// A stream with structure to learn: runs of a few tokens repeated with noise between.
fn tokens() -> Vec<u32> {
    let mut rng = SplitMix64::new(5);
    (0..1_500)
        .map(|i| match i % 8 {
            7 => rng.below(32) as u32,
            step => (step * 3 + 1) as u32,
        })
        .collect()
}

/// Collects a run's training losses.
struct Losses(Arc<Mutex<Vec<f32>>>);

impl Callback for Losses {
    fn on_step(&mut self, report: &StepReport) -> Result<Control> {
        self.0.lock().expect("not poisoned").push(report.loss);
        Ok(Control::Continue)
    }
}

/// A run of `steps` steps in `dir` (resumed from `checkpoint` if given) and its losses.
fn run(dir: &Path, steps: u64, checkpoint: Option<&Path>) -> Result<(Trainer<Train>, Vec<f32>)> {
    let windows = Windows::new(Arc::new(tokens()), 16)?;
    let config = TrainConfig {
        steps,
        batch_size: 4,
        seq_len: 16,
        schedule: Schedule::Constant {
            lr: 1e-2,
            warmup_steps: 0,
        },
        validation_fraction: 0.0,
        eval_every: 0,
        checkpoint_every: 6,
        out_dir: dir.to_path_buf(),
        ..TrainConfig::default()
    };
    let preset = Pico::preset("pico").expect("the pico preset");
    let mut trainer = Trainer::<Train>::new(preset, config, windows)?;
    if let Some(checkpoint) = checkpoint {
        trainer.resume(checkpoint)?;
    }
    let losses = Arc::new(Mutex::new(Vec::new()));
    trainer.add_callback(Losses(losses.clone()));
    trainer.run()?;
    let losses = losses.lock().expect("not poisoned").clone();
    Ok((trainer, losses))
}

/// The last position's logits of `logits` (`[1, T, vocab]`).
fn last_row(logits: &Array) -> Vec<f32> {
    let t = logits.dim(1);
    logits.index((0, t - 1)).as_slice::<f32>().to_vec()
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in row.iter().enumerate() {
        if *x > row[best] {
            best = i;
        }
    }
    best as u32
}

#[test]
fn a_rust_model_trains_checkpoints_resumes_and_generates_through_the_runtime() -> Result<()> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (trainer, losses) = run(&dir.path().join("full"), 12, None)?;
    assert_eq!(losses.len(), 12);
    assert!(
        losses[11] < losses[0] - 0.5,
        "the loss does not fall: {losses:?}"
    );
    assert_eq!(trainer.traces(), 1);

    // Resumed from the checkpoint at step 6, the run computes the very same losses.
    let checkpoint = dir.path().join("full/checkpoints/step-000006");
    let (_, resumed) = run(&dir.path().join("resumed"), 12, Some(&checkpoint))?;
    assert_eq!(resumed, losses[6..], "resumed {resumed:?} vs {losses:?}");

    // Greedy generation with the KV cache picks what full forward passes over the whole
    // sequence pick, token after token.
    let params = trainer.state().params.clone();
    let config = PicoConfig::pico();
    let prompt = [1u32, 4, 7];
    let sampling = Sampling {
        temperature: 0.0,
        max_tokens: 10,
        ..Sampling::default()
    };
    let generated = generate::<Pico>(&params, &config, &prompt, &sampling, None, |_| ())?;
    assert_eq!(generated.tokens.len(), 10);
    let mut sequence = prompt.to_vec();
    let mut cache = model::Context::generation();
    let mut cached_row = {
        let ids: Vec<i32> = prompt.iter().map(|&t| t as i32).collect();
        let tokens = Array::from_slice(&ids, &[1, ids.len() as i32]);
        last_row(&Pico::forward(&params, &config, &tokens, &mut cache)?)
    };
    for &token in &generated.tokens {
        let ids: Vec<i32> = sequence.iter().map(|&t| t as i32).collect();
        let tokens = Array::from_slice(&ids, &[1, ids.len() as i32]);
        let full_row = last_row(&Pico::forward(
            &params,
            &config,
            &tokens,
            &mut model::Context::evaluation(),
        )?);
        for (cached, full) in cached_row.iter().zip(&full_row) {
            assert!(
                (cached - full).abs() < 1e-4,
                "at {} tokens: cached {cached} vs full {full}",
                sequence.len()
            );
        }
        assert_eq!(token, argmax(&full_row), "after {sequence:?}");
        sequence.push(token);
        let next = Array::from_slice(&[token as i32], &[1, 1]);
        cached_row = last_row(&Pico::forward(&params, &config, &next, &mut cache)?);
    }
    // The pattern was learnt: after 1, 4, 7 comes 10.
    assert_eq!(generated.tokens[0], 10, "{:?}", generated.tokens);
    Ok(())
}

#[test]
fn dropout_draws_from_the_step_key_and_is_off_without_one() -> Result<()> {
    let config = PicoConfig::pico();
    let params = Pico::init(&config, 0)?;
    let ids: Vec<i32> = tokens()[..17].iter().map(|&t| t as i32).collect();
    let batch = [
        Array::from_slice(&ids[..16], &[1, 16]),
        Array::from_slice(&ids[1..], &[1, 16]),
    ];
    let loss = |key: Option<&Array>| -> Result<f32> {
        Ok(Train::loss(&params, &config, &batch, key)?.item_exact::<f32>())
    };
    let (key, other) = (
        lmx::runtime::mlx_rs::random::key(1)?,
        lmx::runtime::mlx_rs::random::key(2)?,
    );
    assert_eq!(loss(None)?, loss(None)?);
    assert_eq!(loss(Some(&key))?, loss(Some(&key))?);
    assert_ne!(loss(Some(&key))?, loss(Some(&other))?);
    assert_ne!(loss(Some(&key))?, loss(None)?);
    let off = PicoConfig {
        dropout: 0.0,
        ..config.clone()
    };
    let unkeyed = Train::loss(&params, &off, &batch, None)?.item_exact::<f32>();
    assert_eq!(
        Train::loss(&params, &off, &batch, Some(&key))?.item_exact::<f32>(),
        unkeyed
    );
    Ok(())
}

#[test]
fn the_model_and_its_step_declare_what_a_lmx_model_declares() -> Result<()> {
    assert_eq!(Pico::NAME, "pico");
    assert_eq!(Pico::presets(), ["pico"]);
    assert!(Pico::preset("large").is_none());
    let config = PicoConfig::pico();
    assert_eq!(
        (Pico::vocab_size(&config), Pico::context_len(&config)),
        (32, 32)
    );
    assert_eq!(Train::NAME, "train");
    assert_eq!(Train::options().clip_norm, Some(1.0));
    assert_eq!(Train::optimizer().weight_decay, 0.01);
    // `init` validates first: a configuration that breaks the model's rule is refused by name.
    let bad = PicoConfig {
        heads: 5,
        ..config.clone()
    };
    match Pico::init(&bad, 0) {
        Err(Error::Config(message)) => assert_eq!(message, "`heads` (5) must divide `dim` (32)"),
        other => panic!("expected a configuration error, got {other:?}"),
    }
    let names = Pico::init(&config, 0)?.names();
    assert_eq!(
        names[..3],
        ["wte.weight", "wpe.weight", "blocks.0.ln_1.weight"]
    );
    Ok(())
}

/// A step under `#[lmx::step]` declares its frozen copy of the policy as a `.lmx` step does: it
/// is in `FROZEN`, its loss needs it, `frozen_loss` reads it without dropout, and `Trainer`
/// passes the run's start as it.
#[test]
fn a_step_reads_its_declared_frozen_copy_of_the_policy() -> Result<()> {
    use lmx::runtime::mlx_rs::random;
    use lmx::runtime::model::{Frozen, FrozenSource};
    assert_eq!(
        Anchored::FROZEN,
        [Frozen {
            name: "reference",
            source: FrozenSource::Policy
        }]
    );
    let config = PicoConfig::pico();
    let (params, other) = (Pico::init(&config, 0)?, Pico::init(&config, 1)?);
    let ids = random::randint::<_, i32>(0, 32, &[2, 8], &random::key(3)?)?;
    let targets = random::randint::<_, i32>(0, 32, &[2, 8], &random::key(4)?)?;
    let batch = [ids.clone(), targets.clone()];
    assert!(matches!(
        Anchored::loss(&params, &config, &batch, None),
        Err(Error::FrozenModelsMissing {
            step: "anchored",
            name: "reference"
        })
    ));
    let value = |loss: Array| -> Result<f32> {
        loss.eval()?;
        Ok(loss.item_exact::<f32>())
    };
    // Against itself the pull is 0, with the step's dropout on the policy only (a key given):
    // the reference runs without dropout, so the two differ there.
    let plain = value(Train::loss(&params, &config, &batch, None)?)?;
    let same = value(Anchored::frozen_loss(
        &params,
        &config,
        std::slice::from_ref(&params),
        &batch,
        None,
    )?)?;
    assert!((plain - same).abs() < 1e-6, "{plain} against {same}");
    let logits = |p: &Pico| Pico::forward(p, &config, &ids, &mut model::Context::evaluation());
    let pull = logits(&params)?
        .subtract(logits(&other)?)?
        .square()?
        .mean(false)?;
    let pull = 0.1 * value(pull)?;
    let want = plain + pull;
    let got = value(Anchored::frozen_loss(
        &params,
        &config,
        std::slice::from_ref(&other),
        &batch,
        None,
    )?)?;
    assert!((got - want).abs() < 1e-5, "{got} against {want}");
    // The loss and then the declared metric, in one computation.
    assert_eq!(Anchored::METRICS, ["pull"]);
    assert!(Train::METRICS.is_empty());
    let values =
        Anchored::loss_and_metrics(&params, &config, std::slice::from_ref(&other), &batch, None)?;
    assert_eq!(values.len(), 2);
    let [loss, reported] = [values[0].clone(), values[1].clone()].map(value);
    assert!((loss? - want).abs() < 1e-5);
    let reported = reported?;
    assert!((reported - pull).abs() < 1e-6, "{reported} against {pull}");
    assert!(pull > 1e-4, "{pull}: the two models differ");
    let key = random::key(9)?;
    let keyed = value(Anchored::frozen_loss(
        &params,
        &config,
        std::slice::from_ref(&params),
        &batch,
        Some(&key),
    )?)?;
    assert!(keyed > value(Train::loss(&params, &config, &batch, Some(&key))?)?);

    // Trained through `Trainer`, its reference is the run's start and has no optimizer state.
    let dir = tempfile::tempdir().expect("a temporary directory");
    let train_config = TrainConfig {
        steps: 4,
        batch_size: 2,
        seq_len: 8,
        eval_every: 0,
        checkpoint_every: 0,
        out_dir: dir.path().to_path_buf(),
        ..TrainConfig::default()
    };
    let windows = Windows::new(Arc::new(tokens()), 8)?;
    let mut trainer = Trainer::<Anchored>::new(config, train_config, windows)?;
    let pulls = Arc::new(Mutex::new(Vec::new()));
    trainer.add_callback(Pulls(pulls.clone()));
    trainer.run()?;
    // Every step reports its pull: a mean of squares, which the policy's dropout and updates
    // move away from its start.
    let pulls = pulls.lock().unwrap().clone();
    assert_eq!(pulls.len(), 4);
    assert!(pulls.iter().all(|p| p.is_finite() && *p > 0.0), "{pulls:?}");
    let state = trainer.state();
    let moments = state
        .declaration()
        .iter()
        .filter(|n| n.starts_with("opt."))
        .count();
    assert_eq!(moments, 2 * lmx::runtime::tree::leaf_count(&state.params));
    Ok(())
}

/// Collects each step's `pull` metric.
struct Pulls(Arc<Mutex<Vec<f32>>>);

impl Callback for Pulls {
    fn on_step(&mut self, report: &StepReport) -> Result<Control> {
        let pull = report.metrics.get("pull").copied();
        self.0
            .lock()
            .unwrap()
            .push(pull.expect("the step reports `pull`"));
        Ok(Control::Continue)
    }
}
