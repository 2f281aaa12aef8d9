//! The difficulty curriculum in the trainer's data path: each step reads lmxlab's mix of easy
//! and hard rows (`int(batch_size · min(i / max(n - 1, 1) / warmup_fraction, 1))` hard rows in
//! batch `i` of `n`), and a resumed run reads exactly the rows of an uninterrupted one.
//!
//! The easy text is all 2s and the hard text all 3s, and the step's loss is the batch's mean of
//! `token mod 2`: each step's logged loss is the share of hard rows the trainer gave it.

use lmx_runtime::data::{Rows, Windows};
use lmx_runtime::model::{Context, LanguageModel, TrainingStep};
use lmx_runtime::nn::{self, init::Keys, EmbeddingParams};
use lmx_runtime::objectives::curriculum::DifficultyCurriculum;
use lmx_runtime::objectives::{Difficulty, DifficultyRows};
use lmx_runtime::optim::AdamW;
use lmx_runtime::schedule::Schedule;
use lmx_runtime::step::StepOptions;
use lmx_runtime::train::{
    Callback, Control, JsonlLog, StepReport, TrainConfig, TrainData, Trainer,
};
use lmx_runtime::{Array, Result};
use std::path::Path;
use std::sync::Arc;

struct Table;

impl LanguageModel for Table {
    type Config = usize;
    type Params = EmbeddingParams;
    const NAME: &'static str = "table";

    fn presets() -> &'static [&'static str] {
        &["four"]
    }

    fn preset(_: &str) -> Option<usize> {
        Some(4)
    }

    fn init(vocab: &usize, seed: u64) -> Result<EmbeddingParams> {
        nn::init::embedding(*vocab as i32, *vocab as i32, &mut Keys::from_seed(seed)?)
    }

    fn forward(p: &EmbeddingParams, _: &usize, tokens: &Array, ctx: &mut Context) -> Result<Array> {
        ctx.advance(tokens.shape()[1]);
        nn::embedding(p, tokens)
    }

    fn vocab_size(vocab: &usize) -> usize {
        *vocab
    }

    fn context_len(_: &usize) -> usize {
        64
    }
}

/// The share of odd (hard) tokens in the batch; the table enters with weight 0 so that the
/// step has a gradient to take.
struct HardShare;

impl TrainingStep for HardShare {
    type Model = Table;
    type Optimizer = AdamW;
    const NAME: &'static str = "hard_share";

    fn optimizer() -> AdamW {
        AdamW::default()
    }

    fn options() -> StepOptions {
        StepOptions::default()
    }

    fn loss(p: &EmbeddingParams, _: &usize, batch: &[Array], _: Option<&Array>) -> Result<Array> {
        let odd = batch[0]
            .remainder(Array::from_int(2))?
            .as_dtype(mlx_rs::Dtype::Float32)?
            .mean(false)?;
        Ok(odd.add(p.weight.sum(false)?.multiply(Array::from_f32(0.0))?)?)
    }
}

const BATCH: usize = 8;
const STEPS: u64 = 12;
const WARMUP: f64 = 0.5;

fn windows(token: u32) -> Arc<dyn Rows> {
    Arc::new(Windows::new(Arc::new(vec![token; 400]), 8).unwrap())
}

fn curriculum() -> DifficultyRows {
    let schedule = DifficultyCurriculum::new(STEPS as usize, WARMUP).unwrap();
    DifficultyRows::new(windows(2), windows(3), schedule, BATCH, 7).unwrap()
}

/// lmxlab's `difficulty_curriculum`, as its source computes `n_hard`.
fn seed_hard_rows(i: u64) -> usize {
    let progress = i as f64 / (STEPS - 1).max(1) as f64;
    let hard_fraction = (progress / WARMUP).min(1.0);
    (BATCH as f64 * hard_fraction) as usize
}

#[test]
fn each_batch_holds_the_seeds_mix_easy_rows_first() {
    let rows = curriculum();
    assert_eq!(rows.count(), STEPS as usize * BATCH);
    for batch in 0..STEPS {
        let hard = (0..BATCH)
            .map(|slot| rows.source(batch as usize * BATCH + slot).0)
            .collect::<Vec<_>>();
        let want = seed_hard_rows(batch);
        let mut expected = vec![Difficulty::Easy; BATCH - want];
        expected.extend(vec![Difficulty::Hard; want]);
        assert_eq!(hard, expected, "batch {batch}");
    }
}

fn config(dir: &Path) -> TrainConfig {
    TrainConfig {
        steps: STEPS,
        batch_size: BATCH,
        seq_len: 8,
        schedule: Schedule::Constant {
            lr: 1e-3,
            warmup_steps: 0,
        },
        eval_every: 0,
        checkpoint_every: 4,
        validation_fraction: 0.0,
        out_dir: dir.to_path_buf(),
        ..TrainConfig::default()
    }
}

struct StopAt(u64);

impl Callback for StopAt {
    fn on_step(&mut self, report: &StepReport) -> Result<Control> {
        Ok(match report.step >= self.0 {
            true => Control::Stop(format!("interrupted at {}", report.step)),
            false => Control::Continue,
        })
    }
}

fn run(dir: &Path, stop: u64, resume: bool) {
    let data = TrainData {
        train: Arc::new(curriculum()),
        validation: None,
    };
    let mut trainer =
        Trainer::<HardShare>::with_params(4, config(dir), data, Table::init(&4, 0).unwrap())
            .unwrap();
    if resume {
        let latest = trainer.latest_checkpoint().unwrap().expect("a checkpoint");
        trainer.resume(&latest).unwrap();
    }
    trainer.add_callback(JsonlLog::append(dir.join("metrics.jsonl")).unwrap());
    trainer.add_callback(StopAt(stop));
    trainer.run().unwrap();
}

fn logged_shares(dir: &Path) -> Vec<(u64, f64)> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .filter(|value| value["kind"] == "step")
        .map(|v| (v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap()))
        .collect()
}

#[test]
fn the_trainer_reads_the_seeds_mix_step_by_step_and_after_a_resume() {
    let whole = tempfile::tempdir().unwrap();
    run(whole.path(), STEPS, false);
    let shares = logged_shares(whole.path());
    let expected: Vec<(u64, f64)> = (0..STEPS)
        .map(|i| (i + 1, seed_hard_rows(i) as f64 / BATCH as f64))
        .collect();
    assert_eq!(shares, expected);

    let parts = tempfile::tempdir().unwrap();
    run(parts.path(), 5, false);
    run(parts.path(), STEPS, true);
    assert_eq!(logged_shares(parts.path()), expected);
}

#[test]
fn sets_of_other_widths_are_refused() {
    let schedule = DifficultyCurriculum::new(4, 0.5).unwrap();
    let wide: Arc<dyn Rows> = Arc::new(Windows::new(Arc::new(vec![3u32; 400]), 16).unwrap());
    let err = DifficultyRows::new(windows(2), wide, schedule, BATCH, 0).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid data setting: the easy data's rows are 8 tokens, the hard data's 16"
    );
}
