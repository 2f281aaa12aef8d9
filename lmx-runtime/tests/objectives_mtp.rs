//! Multi-token prediction over a model of one's own (a tiny transformer written here, which
//! exposes its hidden states, embedding and head through `Backbone`): the losses against a Python
//! MLX implementation of lmxlab's formula on the same weights (`fixtures/mtp/make_fixture.py`),
//! gradients against finite differences, and training through the trainer: the heads' losses
//! fall, the base model is the plain model (same initialisation, same logits, the same
//! trajectory when the heads weigh nothing), and a resumed run computes the uninterrupted one's
//! losses bit for bit.

use lmx_runtime::checkpoint::{load_tree, Checkpoints};
use lmx_runtime::data::{ByteTokenizer, DocumentEncoder, Separator, Windows};
use lmx_runtime::model::{Context, LanguageModel, TrainingStep};
use lmx_runtime::nn::{self, init::Keys, EmbeddingParams, LinearParams, RmsNormParams};
use lmx_runtime::objectives::mtp::MtpAttention;
use lmx_runtime::objectives::{
    check_backbone, mtp, mtp_losses, Backbone, Mtp, MtpConfig, MtpParams, MtpStep,
};
use lmx_runtime::optim::AdamW;
use lmx_runtime::schedule::Schedule;
use lmx_runtime::step::StepOptions;
use lmx_runtime::train::{
    Callback, Control, JsonlLog, StepReport, TrainConfig, TrainData, Trainer,
};
use lmx_runtime::tree::{self, Tree};
use lmx_runtime::{Array, Result};
use mlx_rs::transforms::value_and_grad_with_argnums;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct TinyConfig {
    vocab: usize,
    d_model: usize,
    heads: usize,
}

/// An embedding, one pre-norm causal attention layer, a final RMS norm and an untied head.
#[derive(Clone, Debug, PartialEq, lmx_macros::Tree)]
#[lmx(runtime = "lmx_runtime")]
struct TinyParams<T = Array> {
    embed: EmbeddingParams<T>,
    attn_norm: RmsNormParams<T>,
    attention: MtpAttention<T>,
    norm: RmsNormParams<T>,
    head: LinearParams<T>,
}

struct Tiny;

impl LanguageModel for Tiny {
    type Config = TinyConfig;
    type Params = TinyParams;
    const NAME: &'static str = "tiny";

    fn presets() -> &'static [&'static str] {
        &["bytes"]
    }

    fn preset(name: &str) -> Option<TinyConfig> {
        (name == "bytes").then_some(TinyConfig {
            vocab: 257,
            d_model: 32,
            heads: 4,
        })
    }

    fn init(config: &TinyConfig, seed: u64) -> Result<TinyParams> {
        let (v, d) = (config.vocab as i32, config.d_model as i32);
        let keys = &mut Keys::from_seed(seed)?;
        let linear = |i, o, keys: &mut Keys| nn::init::linear(i, o, false, keys);
        Ok(TinyParams {
            embed: nn::init::embedding(v, d, keys)?,
            attn_norm: nn::init::rms_norm(d)?,
            attention: MtpAttention {
                q_proj: linear(d, d, keys)?,
                k_proj: linear(d, d, keys)?,
                v_proj: linear(d, d, keys)?,
                o_proj: linear(d, d, keys)?,
            },
            norm: nn::init::rms_norm(d)?,
            head: linear(d, v, keys)?,
        })
    }

    fn forward(p: &TinyParams, c: &TinyConfig, tokens: &Array, ctx: &mut Context) -> Result<Array> {
        let hidden = Tiny::hidden_states(p, c, tokens, ctx)?;
        Tiny::output_head(p, c, &hidden)
    }

    fn vocab_size(config: &TinyConfig) -> usize {
        config.vocab
    }

    fn context_len(_: &TinyConfig) -> usize {
        256
    }
}

impl Backbone for Tiny {
    fn hidden_size(config: &TinyConfig) -> usize {
        config.d_model
    }

    fn attention_heads(config: &TinyConfig) -> usize {
        config.heads
    }

    fn hidden_states(
        p: &TinyParams,
        c: &TinyConfig,
        tokens: &Array,
        ctx: &mut Context,
    ) -> Result<Array> {
        let x = nn::embedding(&p.embed, tokens)?;
        let a = nn::rms_norm(&p.attn_norm, &x, 1e-5)?;
        let heads = c.heads as i32;
        let split = |layer: &LinearParams| nn::split_heads(&nn::linear(layer, &a)?, heads);
        let attention = &p.attention;
        let mixed = ctx.attend(
            0,
            &split(&attention.q_proj)?,
            &split(&attention.k_proj)?,
            &split(&attention.v_proj)?,
        )?;
        let x = x.add(nn::linear(&attention.o_proj, &nn::merge_heads(&mixed)?)?)?;
        ctx.advance(tokens.shape()[1]);
        nn::rms_norm(&p.norm, &x, 1e-5)
    }

    fn embed(p: &TinyParams, _: &TinyConfig, tokens: &Array) -> Result<Array> {
        nn::embedding(&p.embed, tokens)
    }

    fn output_head(p: &TinyParams, _: &TinyConfig, hidden: &Array) -> Result<Array> {
        nn::linear(&p.head, hidden)
    }
}

/// The plain model's step.
struct Train;

impl TrainingStep for Train {
    type Model = Tiny;
    type Optimizer = AdamW;
    const NAME: &'static str = "train";

    fn optimizer() -> AdamW {
        AdamW::default()
    }

    fn options() -> StepOptions {
        StepOptions {
            clip_norm: Some(1.0),
            ..StepOptions::default()
        }
    }

    fn loss(p: &TinyParams, c: &TinyConfig, batch: &[Array], key: Option<&Array>) -> Result<Array> {
        nn::cross_entropy(
            &Tiny::forward(p, c, &batch[0], &mut Context::for_step(key))?,
            &batch[1],
        )
    }
}

fn fixture_dir() -> &'static str {
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/mtp")
}

fn scalar(a: &Array) -> f32 {
    a.eval().expect("eval");
    a.item_exact::<f32>()
}

/// Within 1e-5 (relative above 1).
fn close(what: &str, got: f32, want: f64) {
    let tolerance = 1e-5 * want.abs().max(1.0);
    assert!(
        (f64::from(got) - want).abs() <= tolerance,
        "{what}: got {got}, the reference {want}"
    );
}

/// The fixture's configuration, weights (over `Mtp<Tiny>`'s tree, by name) and batch.
fn fixture() -> (MtpConfig<TinyConfig>, MtpParams<TinyParams>, Array, Array) {
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{}/mtp.json", fixture_dir())).unwrap(),
    )
    .unwrap();
    let config = MtpConfig {
        base: TinyConfig {
            vocab: 32,
            d_model: 16,
            heads: json["heads"].as_u64().unwrap() as usize,
        },
        n_predict: json["n_predict"].as_u64().unwrap() as usize,
        mtp_weight: json["mtp_weight"].as_f64().unwrap() as f32,
    };
    let mut tensors: HashMap<String, Array> =
        Array::load_safetensors(format!("{}/mtp.safetensors", fixture_dir())).unwrap();
    let tokens = tensors.remove("tokens").unwrap();
    let targets = tensors.remove("targets").unwrap();
    let template = Mtp::<Tiny>::init(&config, 0).unwrap();
    let names = tree::names(&template);
    let mut leaves = names.iter().map(|name| tensors.remove(name).expect(name));
    let params = template.map_same(&mut |_| leaves.next().unwrap());
    assert!(tensors.is_empty(), "unused tensors: {:?}", tensors.keys());
    (config, params, tokens, targets)
}

#[test]
fn losses_match_the_python_reference() -> Result<()> {
    let (config, params, tokens, targets) = fixture();
    let reference: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{}/mtp.json", fixture_dir())).unwrap(),
    )
    .unwrap();
    let losses = mtp_losses::<Tiny>(
        &params.base,
        &config.base,
        &params.mtp_heads,
        config.mtp_weight,
        &tokens,
        &targets,
        None,
    )?;
    close(
        "main",
        scalar(&losses.main),
        reference["main"].as_f64().unwrap(),
    );
    let heads = reference["head_losses"].as_array().unwrap();
    assert_eq!(losses.heads.len(), heads.len());
    for (k, (got, want)) in losses.heads.iter().zip(heads).enumerate() {
        close(
            &format!("head {}", k + 1),
            scalar(got),
            want.as_f64().unwrap(),
        );
    }
    close(
        "mtp",
        scalar(&losses.mtp),
        reference["mtp"].as_f64().unwrap(),
    );
    close(
        "total",
        scalar(&losses.total),
        reference["total"].as_f64().unwrap(),
    );
    // The split of the forward pass that the heads read is the forward pass.
    assert_eq!(
        check_backbone::<Tiny>(&params.base, &config.base, &tokens)?,
        0.0
    );
    Ok(())
}

#[test]
fn sequences_no_longer_than_the_heads_reach_are_refused() {
    let (config, params, tokens, targets) = fixture();
    let short = |a: &Array| mlx_rs::ops::indexing::IndexOp::index(a, (.., ..2));
    let err = mtp_losses::<Tiny>(
        &params.base,
        &config.base,
        &params.mtp_heads,
        0.3,
        &short(&tokens),
        &short(&targets),
        None,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "configuration: multi-token prediction with 2 heads needs at least one head and \
         sequences longer than that, got sequences of 2 tokens"
    );
}

/// The gradient of the total loss with respect to leaf `index` of the tree, by MLX, against
/// central differences of step 1e-2 (float32).
fn check_gradient(index: usize) {
    let (config, params, tokens, targets) = fixture();
    let loss = |leaf: &Array| -> Result<Array> {
        let mut at = 0;
        let params = params.map_same(&mut |old| {
            at += 1;
            if at - 1 == index {
                leaf.clone()
            } else {
                old.clone()
            }
        });
        let losses = mtp_losses::<Tiny>(
            &params.base,
            &config.base,
            &params.mtp_heads,
            config.mtp_weight,
            &tokens,
            &targets,
            None,
        )?;
        Ok(losses.total)
    };
    let w = tree::flatten(&params)[index].clone();
    let objective = |args: &[Array]| -> std::result::Result<Vec<Array>, mlx_rs::error::Exception> {
        loss(&args[0])
            .map(|l| vec![l])
            .map_err(lmx_runtime::Error::into_exception)
    };
    let (_, grads) =
        value_and_grad_with_argnums(objective, &[0])(std::slice::from_ref(&w)).expect("grad");
    grads[0].eval().unwrap();
    let analytic = grads[0].as_slice::<f32>().to_vec();
    w.eval().unwrap();
    let base = w.as_slice::<f32>().to_vec();
    let h = 1e-2f32;
    let mut worst = 0f32;
    // At most 48 coordinates, spread over the leaf, keep the check within a few seconds.
    let stride = base.len().div_ceil(48);
    for i in (0..base.len()).step_by(stride) {
        let at = |delta: f32| {
            let mut shifted = base.clone();
            shifted[i] += delta;
            scalar(&loss(&Array::from_slice(&shifted, w.shape())).unwrap())
        };
        let numeric = (at(h) - at(-h)) / (2.0 * h);
        worst = worst.max((numeric - analytic[i]).abs());
    }
    let scale = analytic.iter().fold(0f32, |m, g| m.max(g.abs()));
    let name = &tree::names(&params)[index];
    assert!(scale > 1e-3, "{name}: the gradient vanishes");
    assert!(
        worst < 2e-3,
        "{name}: finite differences differ by {worst} (|g| up to {scale})"
    );
}

#[test]
fn gradients_match_finite_differences() {
    let (_, params, _, _) = fixture();
    let names = tree::names(&params);
    // The embedding (read by the base model and by every head), the shared output head, and
    // of the second head its projection, its attention's values and its feed-forward's output.
    for name in [
        "embed.weight",
        "head.weight",
        "mtp_heads.1.proj.weight",
        "mtp_heads.1.block.attention.v_proj.weight",
        "mtp_heads.1.block.ffn.down.weight",
        "mtp_heads.0.hidden_norm.weight",
    ] {
        check_gradient(names.iter().position(|n| n == name).expect(name));
    }
}

fn windows() -> TrainData {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../data/shakespeare.txt"
    ))
    .unwrap();
    let tokenizer = ByteTokenizer::with_eos();
    let tokens = DocumentEncoder::new(&tokenizer, Separator::Eos)
        .unwrap()
        .encode(&text[..60_000])
        .unwrap();
    TrainData::split(Windows::new(Arc::new(tokens), 32).unwrap(), 0.1, 257).unwrap()
}

fn train_config(out_dir: &Path, steps: u64) -> TrainConfig {
    TrainConfig {
        steps,
        batch_size: 8,
        seq_len: 32,
        schedule: Schedule::Cosine {
            lr: 1e-2,
            warmup_steps: 2,
            total_steps: steps,
            final_lr: 1e-3,
        },
        eval_every: 0,
        checkpoint_every: 8,
        out_dir: out_dir.to_path_buf(),
        ..TrainConfig::default()
    }
}

fn mtp_config(weight: f32) -> MtpConfig<TinyConfig> {
    MtpConfig {
        mtp_weight: weight,
        ..Mtp::<Tiny>::preset("bytes").unwrap()
    }
}

fn mtp_trainer(dir: &Path, steps: u64, weight: f32) -> Trainer<MtpStep<Train>> {
    let config = mtp_config(weight);
    let params = Mtp::<Tiny>::init(&config, 1).unwrap();
    let objective = mtp::<Tiny>(&config);
    Trainer::with_objective(
        config,
        train_config(dir, steps),
        windows(),
        params,
        objective,
    )
    .unwrap()
}

/// Stops the run after `0` steps, as an interruption would.
struct StopAt(u64);

impl Callback for StopAt {
    fn on_step(&mut self, report: &StepReport) -> Result<Control> {
        Ok(match report.step >= self.0 {
            true => Control::Stop(format!("interrupted at {}", report.step)),
            false => Control::Continue,
        })
    }
}

/// `metrics.jsonl`'s step records in `dir`.
fn logged(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .filter(|value| value["kind"] == "step")
        .collect()
}

fn series(records: &[serde_json::Value], key: &str) -> Vec<f64> {
    records
        .iter()
        .map(|r| r[key].as_f64().unwrap_or_else(|| panic!("{key} in {r}")))
        .collect()
}

/// Whether two trees hold the same leaves, bit for bit.
fn identical<R: Tree<Array>>(a: &R, b: &R) -> bool {
    let (a, b) = (tree::flatten(a), tree::flatten(b));
    a.len() == b.len()
        && a.iter()
            .zip(&b)
            .all(|(a, b)| a.shape() == b.shape() && a.eq_values(b).unwrap())
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

#[test]
fn the_heads_learn_and_the_base_model_stays_the_plain_model() {
    // The base model's initialisation is the plain model's.
    let config = mtp_config(0.3);
    let start = Mtp::<Tiny>::init(&config, 1).unwrap();
    assert!(identical(
        &start.base,
        &Tiny::init(&config.base, 1).unwrap()
    ));

    let dir = tempfile::tempdir().unwrap();
    let mut trainer = mtp_trainer(dir.path(), 60, 0.3);
    trainer.add_callback(JsonlLog::append(dir.path().join("metrics.jsonl")).unwrap());
    trainer.run().unwrap();
    assert_eq!(trainer.traces(), 1);
    let records = logged(dir.path());
    for key in ["mtp_loss_1", "mtp_loss_2", "main_loss"] {
        let values = series(&records, key);
        let (first, last) = (mean(&values[..5]), mean(&values[values.len() - 5..]));
        assert!(
            last < first - 0.5,
            "{key} fell only from {first} to {last} over 60 steps"
        );
    }

    // The checkpoint's base weights are a plain model's: their logits are the plain model's, and
    // the model with heads decodes with them alone.
    let latest = Checkpoints::new(dir.path().join("checkpoints"))
        .latest()
        .unwrap()
        .unwrap();
    let saved = load_tree(&latest.join("model.safetensors"), &start).unwrap();
    let tokens = Array::from_slice(&[72, 101, 108, 108, 111, 44, 32, 119], &[1, 8]);
    let plain = Tiny::forward(
        &saved.base,
        &config.base,
        &tokens,
        &mut Context::evaluation(),
    )
    .unwrap();
    let with_heads =
        Mtp::<Tiny>::forward(&saved, &config, &tokens, &mut Context::evaluation()).unwrap();
    assert!(plain.eq_values(&with_heads).unwrap());
    assert!(
        !identical(&saved.base, &start.base),
        "the base model trained"
    );
    assert!(identical(&saved, &trainer.state().params));
}

/// With the heads weighing nothing, the base model follows the plain run's trajectory: the
/// main loss is the plain step's loss, step for step.
#[test]
fn heads_of_weight_zero_leave_the_plain_run_unchanged() {
    let plain_dir = tempfile::tempdir().unwrap();
    let config = mtp_config(0.0);
    let mut plain = Trainer::<Train>::with_params(
        config.base.clone(),
        train_config(plain_dir.path(), 12),
        windows(),
        Tiny::init(&config.base, 1).unwrap(),
    )
    .unwrap();
    plain.add_callback(JsonlLog::append(plain_dir.path().join("metrics.jsonl")).unwrap());
    plain.run().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut heads = mtp_trainer(dir.path(), 12, 0.0);
    heads.add_callback(JsonlLog::append(dir.path().join("metrics.jsonl")).unwrap());
    heads.run().unwrap();
    let main = series(&logged(dir.path()), "main_loss");
    assert_eq!(main, series(&logged(plain_dir.path()), "loss"));
    assert!(identical(&heads.state().params.base, &plain.state().params));
}

/// Runs an MTP trainer to `stop` of 16 steps (resuming from its latest checkpoint when
/// `resume`), logging into `dir`.
fn run(dir: &Path, stop: u64, resume: bool) {
    let mut trainer = mtp_trainer(dir, 16, 0.3);
    if resume {
        let latest = trainer.latest_checkpoint().unwrap().expect("a checkpoint");
        trainer.resume(&latest).unwrap();
    }
    trainer.add_callback(JsonlLog::append(dir.join("metrics.jsonl")).unwrap());
    trainer.add_callback(StopAt(stop));
    trainer.run().unwrap();
}

#[test]
fn a_resumed_run_computes_the_uninterrupted_runs_losses() {
    let whole = tempfile::tempdir().unwrap();
    run(whole.path(), 16, false);
    let parts = tempfile::tempdir().unwrap();
    run(parts.path(), 8, false);
    run(parts.path(), 16, true);
    let (a, b) = (logged(whole.path()), logged(parts.path()));
    assert_eq!(a.len(), 16);
    for key in ["loss", "main_loss", "mtp_loss", "mtp_loss_1", "mtp_loss_2"] {
        let (x, y) = (series(&a, key), series(&b, key));
        assert!(
            x.iter().zip(&y).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{key}: {x:?} against {y:?}"
        );
    }
}
