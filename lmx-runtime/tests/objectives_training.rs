//! The objectives through the trainer, at tiny size on the bundled text: a distilled bigram
//! student reaches a lower validation loss than the same student trained alone, DPO raises
//! held-out preference accuracy from 0 (the policy equals its reference) to at least 0.9, and a
//! resumed run of either computes the losses of an uninterrupted one, bit for bit.

use lmx_runtime::data::sft::SftEncoder;
use lmx_runtime::data::{
    read_preferences, ByteTokenizer, DocumentEncoder, PreferenceRows, Rows, Separator, Windows,
};
use lmx_runtime::model::{Context, LanguageModel, TrainingStep};
use lmx_runtime::nn::{self, init::Keys, EmbeddingParams};
use lmx_runtime::objectives::{distillation, dpo, sequence_logprobs};
use lmx_runtime::optim::AdamW;
use lmx_runtime::schedule::Schedule;
use lmx_runtime::step::StepOptions;
use lmx_runtime::train::{
    Callback, Control, JsonlLog, Objective, StatePacking, StepReport, TrainConfig, TrainData,
    Trainer,
};
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

fn text() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../data/shakespeare.txt"
    ))
    .unwrap()
}

fn windows() -> TrainData {
    let tokenizer = ByteTokenizer::with_eos();
    let tokens = DocumentEncoder::new(&tokenizer, Separator::Eos)
        .unwrap()
        .encode(&text()[..60_000])
        .unwrap();
    TrainData::split(Windows::new(Arc::new(tokens), 32).unwrap(), 0.1, 257).unwrap()
}

fn config(out_dir: &Path, steps: u64, seq_len: usize, lr: f32) -> TrainConfig {
    TrainConfig {
        steps,
        batch_size: 8,
        seq_len,
        schedule: Schedule::Cosine {
            lr,
            warmup_steps: 2,
            total_steps: steps,
            final_lr: lr / 10.0,
        },
        eval_every: 0,
        eval_batches: 4,
        checkpoint_every: 8,
        out_dir: out_dir.to_path_buf(),
        ..TrainConfig::default()
    }
}

/// Stops the run after `0` steps, as an interruption would.
struct StopAt(u64);

impl Callback for StopAt {
    fn on_step(&mut self, report: &StepReport) -> Result<Control> {
        Ok(if report.step >= self.0 {
            Control::Stop(format!("interrupted at {}", report.step))
        } else {
            Control::Continue
        })
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
            let loss = value["loss"].as_f64().unwrap() as f32;
            (value["step"].as_u64().unwrap(), loss)
        })
        .collect()
}

/// Runs `make()`'s trainer to `stop` steps (resuming from its latest checkpoint when `resume`),
/// logging into `dir`.
fn run(dir: &Path, stop: u64, resume: bool, make: &dyn Fn() -> Trainer<Train>) -> Trainer<Train> {
    let mut trainer = make();
    if resume {
        let latest = trainer.latest_checkpoint().unwrap().expect("a checkpoint");
        trainer.resume(&latest).unwrap();
    }
    trainer.add_callback(JsonlLog::append(dir.join("metrics.jsonl")).unwrap());
    trainer.add_callback(StopAt(stop));
    trainer.run().unwrap();
    trainer
}

/// 16 steps uninterrupted, and 8 + 8 with a resume between: the same losses, bit for bit (the
/// CPU's backend is deterministic).
fn assert_exact_resume(make: &dyn Fn(&Path) -> Trainer<Train>) {
    let whole = tempfile::tempdir().unwrap();
    let done = run(whole.path(), 16, false, &|| make(whole.path()));
    assert_eq!(done.traces(), 1);
    let parts = tempfile::tempdir().unwrap();
    run(parts.path(), 8, false, &|| make(parts.path()));
    run(parts.path(), 16, true, &|| make(parts.path()));
    assert_eq!(logged_losses(parts.path()), logged_losses(whole.path()));
}

fn distilled(out_dir: &Path, teacher: &EmbeddingParams, steps: u64) -> Trainer<Train> {
    let objective: Objective<Bigram> =
        distillation::<Bigram, Bigram>(&257, teacher.clone(), 257, 2.0, 0.7).unwrap();
    Trainer::<Train>::with_objective(
        257,
        config(out_dir, steps, 32, 0.05),
        windows(),
        Bigram::init(&257, 1).unwrap(),
        objective,
    )
    .unwrap()
}

/// The cross-entropy of `params` on the validation windows, as a plain run validates.
fn validation_ce(params: &EmbeddingParams) -> f32 {
    let dir = tempfile::tempdir().unwrap();
    let mut trainer = Trainer::<Train>::with_params(
        257,
        config(dir.path(), 1, 32, 0.05),
        windows(),
        params.clone(),
    )
    .unwrap();
    trainer.validation_loss().unwrap().unwrap()
}

#[test]
fn a_distilled_student_beats_the_student_alone_and_resumes_exactly() {
    // The teacher: the same bigram trained well beforehand.
    let dir = tempfile::tempdir().unwrap();
    let once = |steps| TrainConfig {
        checkpoint_every: 1000,
        ..config(dir.path(), steps, 32, 0.1)
    };
    let mut teacher = Trainer::<Train>::new(257, once(150), {
        let tokenizer = ByteTokenizer::with_eos();
        let tokens = DocumentEncoder::new(&tokenizer, Separator::Eos)
            .unwrap()
            .encode(&text()[..60_000])
            .unwrap();
        Windows::new(Arc::new(tokens), 32).unwrap()
    })
    .unwrap();
    teacher.run().unwrap();
    let teacher = teacher.state().params.clone();

    let steps = 20;
    let alone_dir = tempfile::tempdir().unwrap();
    let mut alone = Trainer::<Train>::with_params(
        257,
        config(alone_dir.path(), steps, 32, 0.05),
        windows(),
        Bigram::init(&257, 1).unwrap(),
    )
    .unwrap();
    alone.run().unwrap();
    let student_dir = tempfile::tempdir().unwrap();
    let mut student = distilled(student_dir.path(), &teacher, steps);
    student.run().unwrap();
    let (alone, distilled_ce) = (
        validation_ce(&alone.state().params),
        validation_ce(&student.state().params),
    );
    eprintln!("validation loss: distilled {distilled_ce}, alone {alone}");
    assert!(
        distilled_ce < alone,
        "distilled {distilled_ce} against alone {alone} (teacher {})",
        validation_ce(&teacher)
    );

    assert_exact_resume(&|dir| distilled(dir, &teacher, 16));
}

/// Pairs from the bundled text's letters and spaces: a prompt of 12 bytes, the real next 6
/// bytes as the chosen response and those 6 with every letter moved 7 places along the
/// alphabet as the rejected one (a corruption whose byte pairs the text seldom has).
fn preference_file(dir: &Path, start: usize, count: usize) -> std::path::PathBuf {
    let text: Vec<char> = text()
        .chars()
        .filter(|c| c.is_ascii_alphabetic() || *c == ' ')
        .collect();
    let mut lines = String::new();
    for i in 0..count {
        let at = start + i * 18;
        let prompt: String = text[at..at + 12].iter().collect();
        let chosen: String = text[at + 12..at + 18].iter().collect();
        let rejected: String = chosen.chars().map(shifted).collect();
        if chosen == rejected {
            continue;
        }
        let line = serde_json::json!({"prompt": prompt, "chosen": chosen, "rejected": rejected});
        lines.push_str(&format!("{line}\n"));
    }
    let path = dir.join(format!("prefs-{start}.jsonl"));
    std::fs::write(&path, lines).unwrap();
    path
}

fn shifted(c: char) -> char {
    match c {
        'a'..='z' => (b'a' + (c as u8 - b'a' + 7) % 26) as char,
        'A'..='Z' => (b'A' + (c as u8 - b'A' + 7) % 26) as char,
        _ => c,
    }
}

fn preference_rows(path: &Path) -> PreferenceRows {
    let tokenizer = ByteTokenizer::with_eos();
    let encoder = SftEncoder::new(&tokenizer, None, true);
    PreferenceRows::new(path, read_preferences(path, &encoder).unwrap(), 20).unwrap()
}

fn dpo_trainer(out_dir: &Path, data: &Path, steps: u64) -> Trainer<Train> {
    let policy = Bigram::init(&257, 3).unwrap();
    let train = preference_rows(data);
    Trainer::<Train>::with_objective(
        257,
        config(out_dir, steps, 40, 0.05),
        TrainData {
            train: Arc::new(train),
            validation: None,
        },
        policy.clone(),
        dpo::<Bigram>(&policy, 0.1),
    )
    .unwrap()
}

/// The fraction of `rows`' pairs on which `policy` prefers the chosen response more than
/// `reference` does.
fn preference_accuracy(
    policy: &EmbeddingParams,
    reference: &EmbeddingParams,
    rows: &PreferenceRows,
) -> f32 {
    let (n, width) = (rows.count(), rows.seq_len());
    let (mut inputs, mut targets) = (vec![0; n * width], vec![0; n * width]);
    for i in 0..n {
        let range = i * width..(i + 1) * width;
        rows.read(i, &mut inputs[range.clone()], &mut targets[range])
            .unwrap();
    }
    let half = width / 2;
    let side = |ids: &[i32], first: bool| -> Array {
        let picked: Vec<i32> = ids
            .chunks(width)
            .flat_map(|row| if first { &row[..half] } else { &row[half..] }.to_vec())
            .collect();
        Array::from_slice(&picked, &[n as i32, half as i32])
    };
    let lp = |params: &EmbeddingParams, first: bool| -> Vec<f32> {
        let logits = nn::embedding(params, &side(&inputs, first)).unwrap();
        let lp = sequence_logprobs(&logits, &side(&targets, first)).unwrap();
        lp.eval().unwrap();
        lp.as_slice::<f32>().to_vec()
    };
    let (pc, pr, rc, rr) = (
        lp(policy, true),
        lp(policy, false),
        lp(reference, true),
        lp(reference, false),
    );
    let wins = (0..n)
        .filter(|&i| (pc[i] - rc[i]) - (pr[i] - rr[i]) > 0.0)
        .count();
    wins as f32 / n as f32
}

#[test]
fn dpo_raises_held_out_preference_accuracy_and_resumes_exactly() {
    let data = tempfile::tempdir().unwrap();
    let train = preference_file(data.path(), 0, 160);
    let held_out = preference_rows(&preference_file(data.path(), 20_000, 60));
    let dir = tempfile::tempdir().unwrap();
    let mut trainer = dpo_trainer(dir.path(), &train, 60);
    let reference = Bigram::init(&257, 3).unwrap();
    assert_eq!(preference_accuracy(&reference, &reference, &held_out), 0.0);
    trainer.run().unwrap();
    let accuracy = preference_accuracy(&trainer.state().params, &reference, &held_out);
    eprintln!("held-out preference accuracy after DPO: {accuracy}");
    assert!(accuracy >= 0.9, "held-out preference accuracy {accuracy}");

    assert_exact_resume(&|dir| dpo_trainer(dir, &train, 16));
}

/// `log p(target | input)` under a bigram table, in f64: the row's log-softmax at the target.
fn bigram_logprob(table: &[f32], vocab: usize, input: i32, target: i32) -> f64 {
    let row = &table[input as usize * vocab..(input as usize + 1) * vocab];
    let max = row.iter().fold(f64::MIN, |m, &x| m.max(f64::from(x)));
    let norm = row
        .iter()
        .map(|&x| (f64::from(x) - max).exp())
        .sum::<f64>()
        .ln()
        + max;
    f64::from(row[target as usize]) - norm
}

/// DPO's reward margin and preference accuracy come out of the compiled step with its loss and
/// are logged beside it (metrics.jsonl): on two hand-made pairs, against the margins computed
/// by hand in f64 from the same tables and rows.
#[test]
fn dpo_logs_its_reward_margin_and_preference_accuracy_with_the_loss() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pairs.jsonl");
    std::fs::write(
        &path,
        "{\"prompt\": \"to be\", \"chosen\": \" or not\", \"rejected\": \" xq zzv\"}\n\
         {\"prompt\": \"all the\", \"chosen\": \"qqqq\", \"rejected\": \" world\"}\n",
    )
    .unwrap();
    let rows = preference_rows(&path);
    let (policy, reference) = (
        Bigram::init(&257, 3).unwrap(),
        Bigram::init(&257, 4).unwrap(),
    );
    let mut config = config(dir.path(), 1, 40, 0.05);
    config.batch_size = 2;
    let mut trainer = Trainer::<Train>::with_objective(
        257,
        config,
        TrainData {
            train: Arc::new(rows.clone()),
            validation: None,
        },
        policy.clone(),
        dpo::<Bigram>(&reference, 0.1),
    )
    .unwrap();
    trainer.add_callback(JsonlLog::append(dir.path().join("metrics.jsonl")).unwrap());
    trainer.run().unwrap();
    let log = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
    let step: serde_json::Value = serde_json::from_str(log.lines().next().unwrap()).unwrap();

    let table = |params: &EmbeddingParams| -> Vec<f32> {
        params.weight.eval().unwrap();
        params.weight.as_slice::<f32>().to_vec()
    };
    let (policy, reference) = (table(&policy), table(&reference));
    let width = rows.seq_len();
    let margins: Vec<f64> = (0..rows.count())
        .map(|i| {
            let (mut inputs, mut targets) = (vec![0; width], vec![0; width]);
            rows.read(i, &mut inputs, &mut targets).unwrap();
            let logprob = |table: &[f32], half: std::ops::Range<usize>| -> f64 {
                half.filter(|&j| targets[j] >= 0)
                    .map(|j| bigram_logprob(table, 257, inputs[j], targets[j]))
                    .sum()
            };
            let (chosen, rejected) = (0..width / 2, width / 2..width);
            let delta = |half: std::ops::Range<usize>| {
                logprob(&policy, half.clone()) - logprob(&reference, half)
            };
            0.1 * (delta(chosen) - delta(rejected))
        })
        .collect();
    let n = margins.len() as f64;
    let margin = margins.iter().sum::<f64>() / n;
    let accuracy = margins.iter().filter(|&&m| m > 0.0).count() as f64 / n;
    let loss = margins
        .iter()
        .map(|&m| (1.0 + (-m).exp()).ln())
        .sum::<f64>()
        / n;
    eprintln!("margins by hand: {margins:?}; logged: {step}");
    assert!(margins.iter().any(|&m| m > 0.0) && margins.iter().any(|&m| m < 0.0));
    assert!(
        (step["loss"].as_f64().unwrap() - loss).abs() < 1e-5,
        "{step}"
    );
    assert!(
        (step["reward_margin"].as_f64().unwrap() - margin).abs() < 1e-5,
        "{step}"
    );
    assert_eq!(step["accuracy"].as_f64().unwrap(), accuracy, "{step}");
}

/// A byte-level decoding of a completion (the end-of-text id and beyond are dropped).
fn bytes_text(ids: &[u32]) -> String {
    let bytes: Vec<u8> = ids.iter().filter_map(|&id| u8::try_from(id).ok()).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// GRPO end to end at tiny size: completions sampled from the current policy by the KV-cached
/// generator (groups of 16 per prompt, temperature 1), rewarded by a built-in (the completion
/// is one lowercase letter, about 1 in 10 at the start), normalised within their group and
/// trained through the compiled step with the clipped surrogate and the KL to the frozen
/// reference. The mean reward rises from about 0.14 to above 0.9 (0.997 over the last five steps); the step's loss is the one
/// `grpo_loss` gives over the same log-probabilities; its KL starts at 0 and grows.
#[test]
fn grpo_raises_the_mean_reward_of_a_verifiable_task() {
    use lmx_runtime::generate::Sampling;
    use lmx_runtime::objectives::{
        grpo, grpo_loss, rollout, token_logprobs, Format, Prompt, ReferenceLogprobs,
    };
    use lmx_runtime::state::TrainState;
    use lmx_runtime::step::TrainStep;

    let reference = Bigram::init(&257, 5).unwrap();
    let optimizer = AdamW::default();
    let mut state = TrainState::new(reference.clone(), &optimizer, 0).unwrap();
    let objective = grpo::<Bigram>(0.04, 0.2);
    let mut reference_pass = ReferenceLogprobs::new::<Bigram>(&reference, 257, true);
    assert_eq!(objective.metrics, ["kl", "clip_fraction"]);
    let loss = objective.loss.clone();
    let mut step = TrainStep::with_frozen_metrics(
        &state,
        optimizer,
        objective.frozen.clone(),
        move |params: &EmbeddingParams, frozen: &[Array], batch: &[Array], key: &Array| {
            loss(params, &257, frozen, batch, Some(key))
        },
        2,
        StepOptions::default(),
    )
    .unwrap();
    let prompts: Vec<Prompt> = ["The ", "and ", "is ", "of "]
        .iter()
        .map(|text| Prompt {
            ids: text.bytes().map(u32::from).collect(),
            answer: None,
        })
        .collect();
    let reward = Format::new("[a-z]").unwrap();
    let mut rewards = Vec::new();
    let mut kls = Vec::new();
    for index in 0..40u64 {
        let sampling = Sampling {
            temperature: 1.0,
            top_k: None,
            seed: index * 1_000,
            max_tokens: 1,
            ..Sampling::default()
        };
        let rollouts = rollout::sample::<Bigram>(
            &state.params,
            &257,
            &prompts,
            16,
            &sampling,
            None,
            4,
            &bytes_text,
            &reward,
        )
        .unwrap();
        let batch = rollouts.batch(&mut reference_pass).unwrap();
        if index == 0 {
            // The reference's pass gives its log-probabilities, and the compiled step's loss is
            // grpo_loss over the same log-probabilities.
            let logits =
                |params: &EmbeddingParams| nn::embedding(params, &rollouts.tokens).unwrap();
            let policy = token_logprobs(&logits(&state.params), &rollouts.targets).unwrap();
            let frozen = token_logprobs(&logits(&reference), &rollouts.targets).unwrap();
            let difference = batch[3]
                .subtract(&frozen)
                .unwrap()
                .abs()
                .unwrap()
                .max(false);
            let difference = difference.unwrap().item_exact::<f32>();
            assert!(
                difference < 1e-6,
                "the reference's pass is off by {difference}"
            );
            let mask = rollouts.targets.ge(Array::from_int(0)).unwrap();
            let want = grpo_loss(
                &policy,
                &policy,
                &frozen,
                &mask,
                &rollouts.advantages,
                0.04,
                0.2,
            )
            .unwrap()
            .loss;
            let got = &(objective.loss)(&state.params, &257, &[], &batch, None).unwrap()[0];
            lmx_runtime::mlx_rs::transforms::eval([&want, got]).unwrap();
            let (want, got) = (want.item_exact::<f32>(), got.item_exact::<f32>());
            assert!((want - got).abs() < 1e-6, "{got} against {want}");
        }
        let metrics = step.step(&mut state, 0.05, &batch).unwrap();
        lmx_runtime::mlx_rs::transforms::eval(&metrics.outputs).unwrap();
        rewards.push(rollouts.mean_reward());
        kls.push(metrics.metrics[0].item_exact::<f32>());
    }
    let first = rewards[..5].iter().sum::<f32>() / 5.0;
    let last = rewards[35..].iter().sum::<f32>() / 5.0;
    eprintln!("GRPO mean reward: first five steps {first:.3}, last five {last:.3}; KL {kls:?}");
    assert!(first < 0.3, "{rewards:?}");
    assert!(last > 0.9, "{rewards:?}");
    assert_eq!(kls[0], 0.0);
    assert!(kls[39] > 0.0, "{kls:?}");
    assert_eq!(step.traces(), 1);
}

/// Records each GRPO update's loss and mean reward, and stops the run after `stop` updates.
struct Updates(std::rc::Rc<std::cell::RefCell<Vec<(u64, f32, f32)>>>, u64);

impl Callback for Updates {
    fn on_step(&mut self, report: &StepReport) -> Result<Control> {
        let reward = report.metrics["mean_reward"];
        self.0.borrow_mut().push((report.step, report.loss, reward));
        Ok(match report.step >= self.1 {
            true => Control::Stop("interrupted".into()),
            false => Control::Continue,
        })
    }
}

/// A GRPO run of the bigram on three prompts (2 an update, groups of 4, 2 tokens each) making
/// `steps` updates, with a checkpoint every `checkpoint_every`, its state laid out as `packing`
/// says.
fn tiny_grpo(
    dir: &Path,
    steps: u64,
    checkpoint_every: u64,
    packing: StatePacking,
) -> lmx_runtime::objectives::GrpoRun<Bigram, AdamW> {
    use lmx_runtime::objectives::{Format, GrpoConfig, GrpoRun, Prompt};
    let prompts = ["The ", "and ", "is "]
        .iter()
        .map(|text| Prompt {
            ids: text.bytes().map(u32::from).collect(),
            answer: None,
        })
        .collect();
    let config = GrpoConfig {
        steps,
        prompts_per_step: 2,
        group: 4,
        temperature: 1.0,
        max_tokens: 2,
        stop: None,
        beta: 0.04,
        epsilon: 0.2,
        schedule: Schedule::Constant {
            lr: 0.05,
            warmup_steps: 0,
        },
        seed: 1,
        checkpoint_every,
        out_dir: dir.to_path_buf(),
        state_packing: packing,
    };
    GrpoRun::<Bigram, AdamW>::new(
        257,
        config,
        Bigram::init(&257, 5).unwrap(),
        AdamW::default(),
        StepOptions::default(),
        prompts,
        Box::new(Format::new("[a-z]+").unwrap()),
        Box::new(bytes_text),
    )
    .unwrap()
}

/// A GRPO run (rollouts from the current policy each update, checkpoints) continued from a
/// checkpoint computes the uninterrupted run's losses and rewards, bit for bit, with its state
/// per parameter or flat (CUDA's default).
#[test]
fn a_resumed_grpo_run_computes_the_uninterrupted_one() {
    for packing in [StatePacking::PerParameter, StatePacking::Flat] {
        resumed_grpo_run_computes_the_uninterrupted_one(packing);
    }
}

fn resumed_grpo_run_computes_the_uninterrupted_one(packing: StatePacking) {
    let run = |dir: &Path, stop: u64, resume: bool| -> Vec<(u64, f32, f32)> {
        let mut grpo = tiny_grpo(dir, 6, 3, packing);
        if resume {
            let latest = grpo.latest_checkpoint().unwrap().expect("a checkpoint");
            grpo.resume(&latest).unwrap();
        }
        let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        grpo.add_callback(Updates(seen.clone(), stop));
        grpo.run().unwrap();
        let seen = seen.borrow().clone();
        seen
    };
    let whole = tempfile::tempdir().unwrap();
    let all = run(whole.path(), 6, false);
    assert_eq!(all.len(), 6);
    let parts = tempfile::tempdir().unwrap();
    let first = run(parts.path(), 3, false);
    let rest = run(parts.path(), 6, true);
    assert_eq!([first, rest].concat(), all);
}

/// Without periodic checkpoints a GRPO run still keeps its trained policy, as the plain trainer
/// does: a checkpoint of its last update, or of the update after which it was stopped.
#[test]
fn a_grpo_run_without_periodic_checkpoints_keeps_its_last_update() {
    let last = |steps: u64, stop: u64| {
        let dir = tempfile::tempdir().unwrap();
        let mut grpo = tiny_grpo(dir.path(), steps, 0, StatePacking::Auto);
        grpo.add_callback(Updates(Default::default(), stop));
        grpo.run().unwrap();
        let latest = grpo.latest_checkpoint().unwrap().expect("a checkpoint");
        latest.file_name().unwrap().to_string_lossy().into_owned()
    };
    assert_eq!(last(2, 10), "step-000002");
    assert_eq!(last(3, 1), "step-000001");
}

/// A run by length stages (`TrainConfig::length_stages`: 8, then 16, then 32 tokens of each
/// window) traces the compiled step once per declared length, and a resumed run (from inside
/// the second stage) computes the uninterrupted one's losses, bit for bit.
#[test]
fn length_stages_trace_once_per_length_and_resume_exactly() {
    use lmx_runtime::objectives::curriculum::LengthCurriculum;
    let make = |dir: &Path| {
        let mut config = config(dir, 16, 32, 0.01);
        config.checkpoint_every = 6;
        config.length_stages = Some(LengthCurriculum::new(vec![8, 16, 32], 5).unwrap());
        Trainer::<Train>::with_data(257, config, windows()).unwrap()
    };
    let whole = tempfile::tempdir().unwrap();
    let done = run(whole.path(), 16, false, &|| make(whole.path()));
    assert_eq!(done.traces(), 3);
    let parts = tempfile::tempdir().unwrap();
    run(parts.path(), 6, false, &|| make(parts.path()));
    let resumed = run(parts.path(), 16, true, &|| make(parts.path()));
    assert_eq!(resumed.traces(), 2, "the stages of 16 and 32 tokens");
    assert_eq!(logged_losses(parts.path()), logged_losses(whole.path()));
    let mut config = config(whole.path(), 16, 32, 0.01);
    config.length_stages = Some(LengthCurriculum::new(vec![8, 64], 5).unwrap());
    assert_eq!(
        config.validate().unwrap_err().to_string(),
        "configuration: the length stages reach 64 tokens, past seq_len 32"
    );
}
