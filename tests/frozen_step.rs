//! A step that declares a frozen model (gpt2.lmx's `step dpo`: `frozen reference = policy`):
//! the generated step names it, refuses to compute its loss without it, computes what the
//! command line's DPO (`objectives::dpo`) computes through the same `Objective`, and trains
//! through `Trainer` with the reference as an input of the compiled step: no optimizer state for
//! it, and a resumed run computes the uninterrupted one's losses.

use lmx::models::gpt2::{self, Dpo, Gpt2, Train};
use lmx::runtime::data::PreferenceRows;
use lmx::runtime::data::{read_preferences, sft::SftEncoder, ByteTokenizer};
use lmx::runtime::mlx_rs::random;
use lmx::runtime::model::{Frozen, FrozenSource, LanguageModel, TrainingStep};
use lmx::runtime::objectives;
use lmx::runtime::train::{
    Callback, Control, Objective, StepReport, TrainConfig, TrainData, Trainer,
};
use lmx::runtime::{Array, Error, Result};
use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;

fn config() -> gpt2::Config {
    gpt2::Config::preset("tiny-bytes").expect("gpt2.lmx has a tiny-bytes preset")
}

fn value(loss: &Array) -> f32 {
    loss.eval().expect("evaluates");
    loss.item_exact::<f32>()
}

#[test]
fn the_step_declares_its_frozen_model_and_needs_it() -> Result<()> {
    assert_eq!(
        Dpo::FROZEN,
        [Frozen {
            name: "reference",
            source: FrozenSource::Policy
        }]
    );
    assert!(Train::FROZEN.is_empty());
    let params = Gpt2::init(&config(), 0)?;
    let tokens = Array::from_slice(&[1i32, 2, 3, 4], &[1, 4]);
    let err = Dpo::loss(&params, &config(), &[tokens.clone(), tokens], None).unwrap_err();
    assert!(matches!(
        err,
        Error::FrozenModelsMissing {
            step: "dpo",
            name: "reference"
        }
    ));
    assert_eq!(
        err.to_string(),
        "step `dpo` reads the frozen model `reference`: train it through its objective \
         (`Objective::declared`), which passes its frozen models to the compiled step"
    );
    Ok(())
}

/// Pairs `[B, 2L]` as the trainer hands them over: random ids, the first 3 targets of each
/// response (its prompt) ignored.
fn pairs() -> Result<[Array; 2]> {
    let tokens = random::randint::<_, i32>(0, 257, &[4, 16], &random::key(1)?)?;
    let targets = random::randint::<_, i32>(0, 257, &[4, 16], &random::key(2)?)?;
    targets.eval()?;
    let mut ids = targets.as_slice::<i32>().to_vec();
    for (i, id) in ids.iter_mut().enumerate() {
        if i % 8 < 3 {
            *id = -1;
        }
    }
    Ok([tokens, Array::from_slice(&ids, &[4, 16])])
}

/// The `.lmx` step's loss over its frozen reference is the command line's DPO loss, both
/// reached through an `Objective` whose frozen leaves are the step's inputs.
#[test]
fn the_declared_step_computes_the_command_lines_dpo() -> Result<()> {
    let config = config();
    let (policy, start) = (Gpt2::init(&config, 0)?, Gpt2::init(&config, 1)?);
    let batch = pairs()?;
    let declared = Objective::<Gpt2>::declared::<Dpo>(&start).expect("dpo declares a model");
    assert!(Objective::<Gpt2>::declared::<Train>(&start).is_none());
    let library = objectives::dpo::<Gpt2>(&start, 0.1);
    assert_eq!(declared.frozen.len(), library.frozen.len());
    // The step's own metrics (`metrics loss, reward_margin, accuracy`) are the library's.
    assert_eq!(Dpo::METRICS, ["reward_margin", "accuracy"]);
    assert_eq!(declared.metrics, library.metrics);
    let ours = (declared.loss)(&policy, &config, &declared.frozen, &batch, None)?;
    let theirs = (library.loss)(&policy, &config, &library.frozen, &batch, None)?;
    assert_eq!(ours.len(), 3);
    assert_eq!(theirs.len(), 3);
    for (name, (ours, theirs)) in ["loss", "reward_margin", "accuracy"]
        .iter()
        .zip(ours.iter().zip(&theirs))
    {
        let (ours, theirs) = (value(ours), value(theirs));
        assert!(
            (ours - theirs).abs() <= 1e-5,
            "{name}: {ours} against {theirs}"
        );
    }
    let loss = value(&ours[0]);
    assert!(
        (loss - std::f32::consts::LN_2).abs() > 1e-3,
        "{loss}: policy and reference differ"
    );
    Ok(())
}

/// Pairs from the bundled text: a prompt of 8 bytes, the real next 6 bytes chosen, the same
/// bytes reversed rejected.
fn preference_rows(dir: &Path) -> PreferenceRows {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/data/shakespeare.txt"))
            .expect("the bundled text");
    let chars: Vec<char> = text.chars().filter(|c| c.is_ascii_alphabetic()).collect();
    let mut lines = String::new();
    for i in 0..32 {
        let at = i * 14;
        let prompt: String = chars[at..at + 8].iter().collect();
        let chosen: String = chars[at + 8..at + 14].iter().collect();
        let rejected: String = chosen.chars().rev().collect();
        if chosen != rejected {
            let line =
                serde_json::json!({"prompt": prompt, "chosen": chosen, "rejected": rejected});
            lines.push_str(&format!("{line}\n"));
        }
    }
    let path = dir.join("prefs.jsonl");
    std::fs::write(&path, lines).unwrap();
    let tokenizer = ByteTokenizer::with_eos();
    let encoder = SftEncoder::new(&tokenizer, None, true);
    PreferenceRows::new(&path, read_preferences(&path, &encoder).unwrap(), 16).unwrap()
}

struct Losses(Rc<RefCell<Vec<(u64, f32)>>>, u64);

impl Callback for Losses {
    fn on_step(&mut self, report: &StepReport) -> Result<Control> {
        // Every step reports the step's own metrics by name.
        let names: Vec<&str> = report.metrics.keys().copied().collect();
        assert_eq!(names, ["accuracy", "reward_margin"]);
        self.0.borrow_mut().push((report.step, report.loss));
        Ok(match report.step >= self.1 {
            true => Control::Stop("interrupted".into()),
            false => Control::Continue,
        })
    }
}

fn trainer(dir: &Path, rows: &PreferenceRows) -> Trainer<Dpo> {
    let train = TrainConfig {
        steps: 8,
        batch_size: 4,
        seq_len: 32,
        eval_every: 0,
        checkpoint_every: 4,
        out_dir: dir.to_path_buf(),
        ..TrainConfig::default()
    };
    let data = TrainData {
        train: Arc::new(rows.clone()),
        validation: None,
    };
    Trainer::<Dpo>::with_data(config(), train, data).expect("a DPO run")
}

fn losses(dir: &Path, rows: &PreferenceRows, stop: u64, resume: bool) -> Vec<(u64, f32)> {
    let mut run = trainer(dir, rows);
    if resume {
        let latest = run.latest_checkpoint().unwrap().expect("a checkpoint");
        run.resume(&latest).unwrap();
    }
    let seen = Rc::new(RefCell::new(Vec::new()));
    run.add_callback(Losses(seen.clone(), stop));
    run.run().unwrap();
    let state = run.state();
    // The reference is an input of the step: the state holds the policy and its moments alone.
    let leaves = lmx::runtime::tree::leaf_count(&state.params);
    let moments = state
        .declaration()
        .iter()
        .filter(|n| n.starts_with("opt."))
        .count();
    assert_eq!(
        moments,
        2 * leaves,
        "AdamW's m and v of the policy, nothing for the reference"
    );
    let seen = seen.borrow().clone();
    seen
}

/// The declared step trains through `Trainer` (its reference the run's start), lowers its loss
/// from DPO's starting `ln 2`, and a run resumed from a checkpoint computes the uninterrupted
/// run's losses, bit for bit.
#[test]
fn the_declared_step_trains_and_resumes_exactly() {
    let data = tempfile::tempdir().unwrap();
    let rows = preference_rows(data.path());
    let whole = tempfile::tempdir().unwrap();
    let all = losses(whole.path(), &rows, 8, false);
    assert_eq!(all.len(), 8);
    assert!((all[0].1 - std::f32::consts::LN_2).abs() < 1e-6, "{all:?}");
    assert!(all[7].1 < all[0].1, "{all:?}");
    let parts = tempfile::tempdir().unwrap();
    let first = losses(parts.path(), &rows, 4, false);
    let rest = losses(parts.path(), &rows, 8, true);
    assert_eq!([first, rest].concat(), all);
}

/// `lmx check` reports the step's frozen model beside the trainable state, and lists every step
/// the model declares with the command that trains it.
#[test]
fn lmx_check_reports_the_frozen_model() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_lmx"))
        .args(["check", "gpt2", "--preset", "tiny-bytes"])
        .output()
        .expect("lmx runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines.contains(&"parameters        23,040"), "{stdout}");
    assert!(
        lines.contains(
            &"frozen            reference (step dpo): Gpt2, 23,040 parameters, 90.0 KiB (no \
              gradients, no optimizer state)"
        ),
        "{stdout}"
    );
    let steps = lines
        .iter()
        .position(|line| *line == "steps")
        .expect("a steps section");
    assert_eq!(
        lines[steps + 1..steps + 4],
        [
            "  train (default): lmx train --model gpt2",
            "  anchor: lmx train --model gpt2 --step anchor",
            "  dpo (frozen reference; metrics reward_margin, accuracy): lmx train --model gpt2 \
             --step dpo --data PAIRS.jsonl",
        ],
        "{stdout}"
    );
}
