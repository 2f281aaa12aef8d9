//! The training loop: exact resume, validation, logs, and a non-finite loss stopping the run.

use lmx_runtime::data::{ByteTokenizer, DocumentEncoder, Separator, Windows};
use lmx_runtime::device::DeviceKind;
use lmx_runtime::model::{Context, LanguageModel, TrainingStep};
use lmx_runtime::nn::{self, init::Keys, EmbeddingParams};
use lmx_runtime::optim::AdamW;
use lmx_runtime::schedule::Schedule;
use lmx_runtime::step::StepOptions;
use lmx_runtime::train::{JsonlLog, Overlap, Precision, TrainConfig, Trainer};
use lmx_runtime::{Array, Result};
use std::path::Path;
use std::sync::Arc;

/// A bigram model: the logits of the next byte are a row of one table.
struct Bigram;

impl LanguageModel for Bigram {
    type Config = usize;
    type Params = EmbeddingParams;
    const NAME: &'static str = "bigram";

    fn presets() -> &'static [&'static str] {
        &["bytes"]
    }

    fn preset(name: &str) -> Option<usize> {
        (name == "bytes").then_some(257)
    }

    fn init(vocab: &usize, seed: u64) -> Result<EmbeddingParams> {
        nn::init::embedding(*vocab as i32, *vocab as i32, &mut Keys::from_seed(seed)?)
    }

    fn forward(
        params: &EmbeddingParams,
        _: &usize,
        tokens: &Array,
        ctx: &mut Context,
    ) -> Result<Array> {
        ctx.advance(tokens.shape()[1]);
        nn::embedding(params, tokens)
    }

    fn vocab_size(vocab: &usize) -> usize {
        *vocab
    }

    fn context_len(_: &usize) -> usize {
        1024
    }
}

struct Train;

impl TrainingStep for Train {
    type Model = Bigram;
    type Optimizer = AdamW;
    const NAME: &'static str = "train";

    fn optimizer() -> AdamW {
        AdamW::default()
    }

    fn options() -> StepOptions {
        StepOptions::default()
    }

    fn loss(
        params: &EmbeddingParams,
        config: &usize,
        batch: &[Array],
        key: Option<&Array>,
    ) -> Result<Array> {
        let logits = Bigram::forward(params, config, &batch[0], &mut Context::for_step(key))?;
        nn::cross_entropy(&logits, &batch[1])
    }
}

fn windows() -> Windows {
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
    Windows::new(Arc::new(tokens), 32).unwrap()
}

fn config(out_dir: &Path, steps: u64) -> TrainConfig {
    TrainConfig {
        steps,
        batch_size: 8,
        seq_len: 32,
        schedule: Schedule::Cosine {
            lr: 0.05,
            warmup_steps: 5,
            total_steps: 24,
            final_lr: 0.005,
        },
        eval_every: 8,
        eval_batches: 2,
        checkpoint_every: 8,
        out_dir: out_dir.to_path_buf(),
        ..TrainConfig::default()
    }
}

/// Asserts that two runs logged the same losses: bit for bit on the CPU, whose backend is
/// deterministic. On the GPU (measured on MLX's CUDA backend; Metal is not tested here) the
/// embedding table's gradient is summed with atomic adds, whose order varies from run to run, so
/// two identical runs already differ in the last bits of a loss; there the losses must agree to
/// 1e-6, relative.
fn assert_same_losses(got: &[(u64, f32)], expected: &[(u64, f32)], what: &str) {
    if lmx_runtime::device::default_kind().unwrap() == DeviceKind::Cpu {
        assert_eq!(got, expected, "{what}: bit-identical losses");
        return;
    }
    assert_eq!(got.len(), expected.len(), "{what}: {got:?} vs {expected:?}");
    for (&(step, a), &(expected_step, b)) in got.iter().zip(expected) {
        assert_eq!(step, expected_step, "{what}: {got:?} vs {expected:?}");
        assert!(
            (a - b).abs() <= 1e-6 * b.abs(),
            "{what}: step {step}: loss {a} vs {b}"
        );
    }
}

/// The training losses logged in `dir/metrics.jsonl`, by step.
fn logged_losses(dir: &Path) -> Vec<(u64, f32)> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .filter(|value| value["kind"] == "step")
        .map(|value| {
            (
                value["step"].as_u64().unwrap(),
                value["loss"].as_f64().unwrap() as f32,
            )
        })
        .collect()
}

fn train(dir: &Path, steps: u64, resume: bool, overlap: Overlap) -> Trainer<Train> {
    let config = TrainConfig {
        overlap,
        ..config(dir, 24)
    };
    let mut trainer = Trainer::<Train>::new(257, config, windows()).unwrap();
    if resume {
        let latest = trainer
            .latest_checkpoint()
            .unwrap()
            .expect("a checkpoint to resume from");
        trainer.resume(&latest).unwrap();
    }
    trainer.add_callback(JsonlLog::append(dir.join("metrics.jsonl")).unwrap());
    trainer.add_callback(StopAt(steps));
    trainer.run().unwrap();
    trainer
}

/// Stops the run after `0` steps, as an interruption would.
struct StopAt(u64);

impl lmx_runtime::train::Callback for StopAt {
    fn on_step(
        &mut self,
        report: &lmx_runtime::train::StepReport,
    ) -> Result<lmx_runtime::train::Control> {
        Ok(if report.step >= self.0 {
            lmx_runtime::train::Control::Stop(format!("interrupted at {}", report.step))
        } else {
            lmx_runtime::train::Control::Continue
        })
    }
}

#[test]
fn resuming_gives_the_losses_of_an_uninterrupted_run() {
    let whole = tempfile::tempdir().unwrap();
    let uninterrupted = train(whole.path(), 24, false, Overlap::default());
    assert_eq!(uninterrupted.traces(), 1, "one trace for the whole run");
    let expected = logged_losses(whole.path());
    assert_eq!(expected.len(), 24);
    assert!(
        expected[23].1 < expected[0].1 * 0.7,
        "the loss falls: {:?}",
        expected
    );

    for overlap in [Overlap::Off, Overlap::Build, Overlap::Submit] {
        let parts = tempfile::tempdir().unwrap();
        let first = train(parts.path(), 16, false, overlap);
        assert_eq!(first.steps_done(), 16, "{overlap:?}");
        let resumed = train(parts.path(), 24, true, overlap);
        assert_eq!(resumed.steps_done(), 24, "{overlap:?}");
        let got = logged_losses(parts.path());
        assert_same_losses(&got, &expected, &format!("{overlap:?}, resumed at step 16"));
    }
}

#[test]
fn validation_is_reported_and_logged() {
    for overlap in [Overlap::Off, Overlap::Build, Overlap::Submit] {
        let dir = tempfile::tempdir().unwrap();
        let config = TrainConfig {
            overlap,
            ..config(dir.path(), 8)
        };
        let mut trainer = Trainer::<Train>::new(257, config, windows()).unwrap();
        let before = trainer
            .validation_loss()
            .unwrap()
            .expect("a validation split");
        let summary = trainer.run().unwrap();
        let after = summary.last_val_loss.expect("evaluated at step 8");
        assert!(
            after < before,
            "{overlap:?}: validation loss {after} after training, {before} before"
        );
        assert_eq!(
            summary.checkpoint,
            Some(dir.path().join("checkpoints/step-000008"))
        );
    }
}

/// The error of a run whose learning rate blows the loss up, with a checkpoint every
/// `checkpoint_every` steps, and the trainer after it.
fn diverged_run(dir: &Path, checkpoint_every: u64, overlap: Overlap) -> (String, Trainer<Train>) {
    let mut config = config(dir, 24);
    config.overlap = overlap;
    config.schedule = Schedule::Constant {
        lr: 1e38,
        warmup_steps: 0,
    };
    config.checkpoint_every = checkpoint_every;
    let mut trainer = Trainer::<Train>::new(257, config, windows()).unwrap();
    let err = trainer.run().unwrap_err().to_string();
    (err, trainer)
}

#[test]
fn a_non_finite_loss_stops_the_run_naming_the_step_and_a_checkpoint_to_continue_from() {
    let dir = tempfile::tempdir().unwrap();
    // Without a sane checkpoint: the first update at 1e38 already blows the parameters up, so the
    // checkpoint after it, which a report of its step's loss would call good, is not named.
    let (err, trainer) = diverged_run(dir.path(), 1, Overlap::default());
    let step = trainer.steps_done();
    assert!(err.starts_with("the loss became"), "{err}");
    assert!(
        err.ends_with(&format!(
            "at step {step}; no checkpoint saved before it has a sane loss to continue from"
        )),
        "{err}"
    );

    // 8 sane steps, then the rate of a blow-up from there.
    let dir = tempfile::tempdir().unwrap();
    run_plain(dir.path(), 8, Overlap::Off, None);
    let mut config = config(dir.path(), 24);
    config.schedule = Schedule::Constant {
        lr: 1e38,
        warmup_steps: 0,
    };
    config.checkpoint_every = 1;
    let mut trainer = Trainer::<Train>::new(257, config, windows()).unwrap();
    let sane = dir.path().join("checkpoints/step-000008");
    trainer.resume(&sane).unwrap();
    let err = trainer.run().unwrap_err().to_string();
    let loss = lmx_runtime::checkpoint::Checkpoints::loss(&sane)
        .unwrap()
        .unwrap();
    assert!(
        err.ends_with(&format!(
            "; training can continue from {} (its parameters' loss {loss:.4})",
            sane.display()
        )),
        "{err}"
    );
    assert!(
        trainer.latest_checkpoint().unwrap() > Some(sane),
        "checkpoints were saved after it"
    );
}

#[test]
fn with_steps_overlapped_a_non_finite_loss_stops_the_run_at_the_step_that_made_it() {
    assert_eq!(TrainConfig::default().overlap, Overlap::Submit);
    for overlap in [Overlap::Build, Overlap::Submit] {
        let dir = tempfile::tempdir().unwrap();
        let (err, trainer) = diverged_run(dir.path(), 0, overlap);
        let step = trainer.steps_done();
        assert!(err.starts_with("the loss became"), "{overlap:?}: {err}");
        // The step built after it is not counted, whether or not it reached the device.
        assert!(
            err.contains(&format!("at step {step}")),
            "{overlap:?}: {err}"
        );
        assert!(step < 24, "{overlap:?}: {err}");
    }
}

#[test]
fn bfloat16_training_keeps_parameters_and_moments_in_bfloat16_and_learns() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path(), 16);
    config.precision = Precision::Bfloat16;
    let mut trainer = Trainer::<Train>::new(257, config, windows()).unwrap();
    let before = trainer.validation_loss().unwrap().unwrap();
    let summary = trainer.run().unwrap();
    assert!(
        summary.last_val_loss.unwrap() < before * 0.9,
        "{summary:?} from {before}"
    );
    let state = trainer.state();
    assert_eq!(state.params.weight.dtype(), mlx_rs::Dtype::Bfloat16);
    let moments = state.opt.weight.as_ref().expect("the table is trainable");
    assert_eq!(
        (moments.m.dtype(), moments.v.dtype()),
        (mlx_rs::Dtype::Bfloat16, mlx_rs::Dtype::Bfloat16)
    );
    assert_eq!(
        state.step.dtype(),
        mlx_rs::Dtype::Float32,
        "the step count stays float32"
    );
}

/// One step at a constant rate of 1e-4 in `precision`, with validation: the trainer after it and
/// the validation losses before and after.
fn one_step(dir: &Path, precision: Precision) -> (Trainer<Train>, f32, f32) {
    let config = TrainConfig {
        precision,
        schedule: Schedule::Constant {
            lr: 1e-4,
            warmup_steps: 0,
        },
        eval_every: 0,
        checkpoint_every: 0,
        ..config(dir, 1)
    };
    let mut trainer = Trainer::<Train>::new(257, config, windows()).unwrap();
    let before = trainer.validation_loss().unwrap().unwrap();
    let summary = trainer.run().unwrap();
    (trainer, before, summary.last_loss)
}

fn values(array: &Array) -> Vec<f32> {
    array
        .as_dtype(mlx_rs::Dtype::Float32)
        .unwrap()
        .as_slice::<f32>()
        .to_vec()
}

#[test]
fn mixed_precision_computes_in_bfloat16_and_updates_float32_parameters_in_float32() {
    let dirs = [(); 3].map(|_| tempfile::tempdir().unwrap());
    let (mixed, mixed_val, mixed_loss) = one_step(dirs[0].path(), Precision::Mixed);
    let (_, bf16_val, bf16_loss) = one_step(dirs[1].path(), Precision::Bfloat16);
    let (_, f32_val, f32_loss) = one_step(dirs[2].path(), Precision::Float32);

    // The model reads the same bfloat16 table in both: the same batch gives the same loss.
    assert_eq!((mixed_val, mixed_loss), (bf16_val, bf16_loss));
    assert_ne!((mixed_val, mixed_loss), (f32_val, f32_loss));

    let state = mixed.state();
    let moments = state.opt.weight.as_ref().expect("the table is trainable");
    let float32 = mlx_rs::Dtype::Float32;
    assert_eq!(
        (
            state.params.weight.dtype(),
            moments.m.dtype(),
            moments.v.dtype()
        ),
        (float32, float32, float32)
    );
    // AdamW's first step, as MLX defines it (no bias correction; embeddings do not decay):
    // m = (1 - b1) g, v = (1 - b2) g², w' = w - lr m / (sqrt(v) + 1e-8), all in float32. In bfloat16 the
    // table's values near 0.02 are 2^-13 apart, so a step of lr sqrt(10) would be rounded by up
    // to a fifth of itself.
    let init = Bigram::init(&257, TrainConfig::default().seed).unwrap();
    let (w0, w1) = (values(&init.weight), values(&state.params.weight));
    let (m, v) = (values(&moments.m), values(&moments.v));
    // The moments' factors as the update makes them, 1 - beta in float32.
    let (c1, c2) = ((1.0f32 - 0.9) as f64, (1.0f32 - 0.999) as f64);
    let mut moved = 0;
    for i in 0..w0.len() {
        let expected = w0[i] as f64 - 1e-4 * m[i] as f64 / ((v[i] as f64).sqrt() + 1e-8);
        assert!(
            (w1[i] as f64 - expected).abs() <= 1e-8,
            "entry {i}: {} from {}, expected {expected}",
            w1[i],
            w0[i]
        );
        assert!(
            (v[i] as f64 - c2 * (m[i] as f64 / c1).powi(2)).abs() <= 1e-6 * v[i] as f64,
            "entry {i}: m {} and v {} are not one gradient's",
            m[i],
            v[i]
        );
        moved += usize::from(m[i] != 0.0);
    }
    assert!(moved > 1000, "only {moved} entries had a gradient");
}

/// A run of `steps` with no validation or checkpoint before the end, in the order `overlap`.
fn run_plain(dir: &Path, steps: u64, overlap: Overlap, stop_at: Option<u64>) -> Trainer<Train> {
    let config = TrainConfig {
        eval_every: 0,
        checkpoint_every: 0,
        overlap,
        ..config(dir, steps)
    };
    let mut trainer = Trainer::<Train>::new(257, config, windows()).unwrap();
    trainer.add_callback(JsonlLog::append(dir.join("metrics.jsonl")).unwrap());
    if let Some(step) = stop_at {
        trainer.add_callback(StopAt(step));
    }
    trainer.run().unwrap();
    trainer
}

#[test]
fn overlapping_steps_changes_no_number() {
    let sequential = tempfile::tempdir().unwrap();
    let b = run_plain(sequential.path(), 20, Overlap::Off, None);
    let losses_b = logged_losses(sequential.path());
    for overlap in [Overlap::Build, Overlap::Submit] {
        let overlapped = tempfile::tempdir().unwrap();
        let a = run_plain(overlapped.path(), 20, overlap, None);
        let losses_a = logged_losses(overlapped.path());
        assert_eq!(losses_a.len(), 20);
        assert_same_losses(&losses_a, &losses_b, &format!("{overlap:?}"));
        let (weights_a, weights_b) = (&a.state().params.weight, &b.state().params.weight);
        let difference = weights_a
            .subtract(weights_b)
            .and_then(|d| d.abs())
            .and_then(|d| d.max(None))
            .unwrap()
            .item_exact::<f32>();
        let largest = weights_b
            .abs()
            .and_then(|w| w.max(None))
            .unwrap()
            .item_exact::<f32>();
        // CUDA's scatter-add (the embedding's gradient) adds in no fixed order. 1e-5 of the
        // largest weight (3.5 on the CPU) is about 30 times the difference that order made on an
        // H100 (1.2e-6); one step on stale parameters would move weights by about a learning
        // rate, 1e-2 here.
        let deterministic = lmx_runtime::device::default_kind().unwrap() == DeviceKind::Cpu;
        let tolerance = if deterministic { 0.0 } else { 1e-5 * largest };
        assert!(
            difference <= tolerance,
            "{overlap:?}: the same parameters after 20 steps: they differ by {difference:e}, \
             more than {tolerance:e}"
        );
    }
}

#[test]
fn a_stop_from_a_step_report_lands_after_the_step_in_flight() {
    for overlap in [Overlap::Build, Overlap::Submit] {
        let overlapped = tempfile::tempdir().unwrap();
        let a = run_plain(overlapped.path(), 20, overlap, Some(5));
        assert_eq!(
            a.steps_done(),
            6,
            "{overlap:?}: step 6 was built before step 5's report"
        );
        assert_eq!(
            a.latest_checkpoint().unwrap(),
            Some(overlapped.path().join("checkpoints/step-000006"))
        );
    }
    let sequential = tempfile::tempdir().unwrap();
    let b = run_plain(sequential.path(), 20, Overlap::Off, Some(5));
    assert_eq!(b.steps_done(), 5);
}

#[test]
fn runs_continued_after_a_stop_train_on_the_batches_an_unstopped_run_would() {
    let whole = tempfile::tempdir().unwrap();
    run_plain(whole.path(), 20, Overlap::Off, None);
    let expected = logged_losses(whole.path());
    for overlap in [Overlap::Off, Overlap::Build, Overlap::Submit] {
        // Stopped after step 5, then at the first report of each later run (one step in `off`,
        // two with steps overlapped): eight runs or more, each of which had drawn batches ahead
        // of the steps it ran.
        let stopped = tempfile::tempdir().unwrap();
        let mut trainer = run_plain(stopped.path(), 20, overlap, Some(5));
        let mut runs = 1;
        while trainer.steps_done() < 20 {
            trainer.run().unwrap();
            runs += 1;
        }
        assert!(runs >= 8, "{overlap:?}: {runs} runs");
        let losses = logged_losses(stopped.path());
        assert_same_losses(&losses, &expected, &format!("{overlap:?}, continued"));
    }
}

/// Keeps every step report of a run.
struct Reports(std::rc::Rc<std::cell::RefCell<Vec<lmx_runtime::train::StepReport>>>);

impl lmx_runtime::train::Callback for Reports {
    fn on_step(
        &mut self,
        report: &lmx_runtime::train::StepReport,
    ) -> Result<lmx_runtime::train::Control> {
        self.0.borrow_mut().push(report.clone());
        Ok(lmx_runtime::train::Control::Continue)
    }
}

#[test]
fn every_step_reports_where_its_time_went_in_every_order() {
    for overlap in [Overlap::Off, Overlap::Build, Overlap::Submit] {
        let dir = tempfile::tempdir().unwrap();
        let config = TrainConfig {
            overlap,
            eval_every: 0,
            ..config(dir.path(), 6)
        };
        let mut trainer = Trainer::<Train>::new(257, config, windows()).unwrap();
        let reports = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        trainer.add_callback(Reports(reports.clone()));
        let started = std::time::Instant::now();
        trainer.run().unwrap();
        let run_ms = started.elapsed().as_secs_f64() * 1e3;
        let reports = reports.borrow();
        assert_eq!(reports.len(), 6, "{overlap:?}");
        // Building a step's graph and handing it to the device take time in every order; the
        // wait may be nothing when the device was done first. Together the parts of all steps,
        // the waits included, fit in the run.
        for report in reports.iter() {
            let parts = [report.build_ms, report.submit_ms, report.wait_ms];
            assert!(
                report.build_ms > 0.0 && report.submit_ms > 0.0,
                "{overlap:?}: step {}: build, submit, wait {parts:?} ms",
                report.step
            );
        }
        let total: f64 = reports
            .iter()
            .map(|report| report.build_ms + report.submit_ms + report.wait_ms)
            .sum();
        assert!(total <= run_ms, "{overlap:?}: {total} ms of {run_ms}");
    }
}
