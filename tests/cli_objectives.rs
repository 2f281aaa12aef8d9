//! `lmx train --step dpo` and `lmx train --teacher DIR` end to end with the tiny byte-level GPT:
//! the objective is recorded in run.json, a run continued from a checkpoint computes the losses
//! of the uninterrupted one, and wrong combinations of flags are refused naming the flags.

use crate::support::cli;
use crate::support::preferences;
use std::path::Path;

use cli::{failed, lmx, losses, succeeded, text};
use preferences::preferences;

/// Trains `flags` 8 steps into `run` with checkpoints every 4, continues from step 4, and
/// asserts the same losses, bit for bit.
fn assert_resumes_exactly(run: &Path, flags: &[&str]) -> Vec<(u64, f64)> {
    let out = run.display().to_string();
    let mut args = vec![
        "train",
        "--preset",
        "tiny-bytes",
        "--batch-size",
        "4",
        "--quiet",
    ];
    args.extend([
        "--sample",
        "0",
        "--steps",
        "8",
        "--checkpoint-every",
        "4",
        "--out",
        &out,
    ]);
    args.extend(flags);
    succeeded(&lmx(&args));
    let whole = losses(run);
    assert_eq!(whole.len(), 8);
    let from = run.join("checkpoints/step-000004").display().to_string();
    let resume = [
        "train",
        "--out",
        &out,
        "--resume-from",
        &from,
        "--quiet",
        "--sample",
        "0",
    ];
    let stderr = succeeded(&lmx(&resume));
    assert!(stderr.contains("resumed from"), "{stderr}");
    assert_eq!(
        losses(run),
        whole,
        "a continued run computes the same losses"
    );
    whole
}

fn recorded_objective(run: &Path) -> serde_json::Value {
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("run.json")).unwrap()).unwrap();
    record["objective"].clone()
}

#[test]
fn dpo_trains_against_a_frozen_copy_and_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("prefs.jsonl");
    preferences(&data);
    let run = dir.path().join("dpo");
    let data = data.display().to_string();
    // GPT-2 declares a step `dpo` of its own: `builtin:` picks lmx's.
    let flags = [
        "--step",
        "builtin:dpo",
        "--data",
        &data,
        "--seq-len",
        "20",
        "--beta",
        "0.5",
    ];
    let whole = assert_resumes_exactly(&run, &flags);
    // The policy starts as its reference: every margin is 0, the loss ln 2.
    assert!(
        (whole[0].1 - std::f64::consts::LN_2).abs() < 1e-6,
        "{whole:?}"
    );
    assert_eq!(
        recorded_objective(&run),
        serde_json::json!({"kind": "dpo", "beta": 0.5, "chat_template": null})
    );
    // Each step logs its reward margin and preference accuracy with its loss: at the start the
    // policy is its reference (margin 0, no pair preferred), then the margin grows.
    let steps: Vec<serde_json::Value> = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .filter(|value| value["kind"] == "step")
        .collect();
    assert_eq!(steps[0]["reward_margin"], 0.0, "{}", steps[0]);
    assert_eq!(steps[0]["accuracy"], 0.0, "{}", steps[0]);
    let last = &steps[steps.len() - 1];
    assert!(last["reward_margin"].as_f64().unwrap() > 0.0, "{last}");
    assert!(
        (0.0..=1.0).contains(&last["accuracy"].as_f64().unwrap()),
        "{last}"
    );
}

#[test]
fn grpo_trains_on_sampled_completions_and_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("prompts.jsonl");
    let lines: String = ["To be", "All the", "Once more", "Now is", "What is"]
        .iter()
        .map(|prompt| format!("{}\n", serde_json::json!({"prompt": prompt, "answer": "a"})))
        .collect();
    std::fs::write(&data, lines).unwrap();
    let run = dir.path().join("grpo");
    let data = data.display().to_string();
    let flags = [
        "--step",
        "grpo",
        "--data",
        &data,
        "--reward",
        "regex:[a-z ]+",
        "--group",
        "4",
        "--seq-len",
        "3",
    ];
    assert_resumes_exactly(&run, &flags);
    assert_eq!(
        recorded_objective(&run),
        serde_json::json!({"kind": "grpo", "reward": "regex:[a-z ]+", "group": 4,
                           "temperature": 1.0, "beta": 0.04})
    );
    let step: serde_json::Value = serde_json::from_str(
        std::fs::read_to_string(run.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    for metric in ["mean_reward", "kl", "clip_fraction"] {
        assert!(step[metric].is_number(), "{step}");
    }
    // The policy starts as its reference.
    assert_eq!(step["kl"], 0.0, "{step}");
}

#[test]
fn distillation_from_a_larger_teacher_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let teacher = dir.path().join("teacher");
    let out = teacher.display().to_string();
    succeeded(&lmx(&[
        "train",
        "--preset",
        "tiny-bytes",
        "--set",
        "d_model=64",
        "--batch-size",
        "4",
        "--seq-len",
        "32",
        "--steps",
        "4",
        "--quiet",
        "--sample",
        "0",
        "--out",
        &out,
    ]));
    assert_distillation_resumes_exactly(&dir.path().join("student"), &out);
}

#[test]
fn wrong_objective_flags_are_refused_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run").display().to_string();
    let refused = |flags: &[&str]| {
        let mut args = vec![
            "train",
            "--preset",
            "tiny-bytes",
            "--seq-len",
            "32",
            "--out",
            &out,
        ];
        args.extend(flags);
        failed(&lmx(&args))
    };
    assert_eq!(
        refused(&["--step", "builtin:dpo", "--teacher", "t"]),
        "error: --teacher distils from a teacher, --step dpo trains against a frozen copy of \
         the model: give one of them\n"
    );
    // GPT-2's own `step dpo` declares its frozen reference and its beta.
    assert_eq!(
        refused(&["--step", "dpo", "--beta", "0.5"]),
        "error: --beta applies to lmx's own objectives, and --step dpo trains the step `dpo` \
         that gpt2 declares, whose frozen models and settings its declaration holds (--step \
         builtin:dpo trains lmx's own dpo)\n"
    );
    assert_eq!(
        refused(&["--step", "ppo"]),
        "error: unknown --step `ppo`: gpt2 declares the steps train (its default), anchor and \
         dpo; lmx's own objectives are dpo, grpo, distill and mtp (builtin:NAME where the \
         model declares a step of that name)\n"
    );
    assert_eq!(
        refused(&["--step", "builtin:anchor"]),
        "error: unknown --step `builtin:anchor`: lmx's own objectives are dpo, grpo, distill \
         and mtp\n"
    );
    assert_eq!(
        refused(&["--step", "grpo"]),
        "error: --step grpo needs --reward: exact, regex:PATTERN or length\n"
    );
    assert_eq!(
        refused(&["--step", "grpo", "--reward", "smile"]),
        "error: unknown --reward `smile`: exact, regex:PATTERN, length or length:CHARS\n"
    );
    assert_eq!(
        refused(&["--reward", "exact"]),
        "error: --reward and --group apply to --step grpo\n"
    );
    assert_eq!(
        refused(&["--beta", "0.2"]),
        "error: --beta applies to --step dpo and --step grpo\n"
    );
    let missing = dir.path().join("nowhere").display().to_string();
    assert_eq!(
        refused(&["--teacher", &missing]),
        format!(
            "error: --teacher {missing}: neither a run directory (run.json) nor a Hugging Face \
             model folder (config.json)\n"
        )
    );
}

/// `--length-stages`: the first steps train on the first 8 tokens of each window, the rest on
/// 16, one compiled trace per length; misuse is refused naming the flags.
#[test]
fn length_stages_train_one_trace_per_length() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run").display().to_string();
    let args = |extra: &[&'static str]| {
        let mut args = vec![
            "train",
            "--preset",
            "tiny-bytes",
            "--batch-size",
            "4",
            "--seq-len",
            "16",
            "--steps",
            "4",
            "--quiet",
            "--sample",
            "0",
            "--out",
            &out,
        ];
        args.extend(extra);
        args.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let run = |extra: &[&'static str]| {
        let args = args(extra);
        lmx(&args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let output = run(&["--length-stages", "8,16", "--stage-steps", "2"]);
    succeeded(&output);
    let stdout = text(&output.stdout);
    assert!(stdout.contains("traced 2 time(s)"), "{stdout}");
    assert_eq!(
        failed(&run(&["--stage-steps", "2", "--overwrite"])),
        "error: --stage-steps applies to --length-stages\n"
    );
    assert_eq!(
        failed(&run(&["--length-stages", "8,32", "--overwrite"])),
        "error: configuration: the length stages reach 32 tokens, past seq_len 16\n"
    );
}

/// A model's own declared step by name: GPT-2's `step dpo` (its frozen reference, its metrics)
/// trains on preference pairs as lmx's DPO reads them, is recorded by name, and resumes exactly.
#[test]
fn a_declared_step_trains_by_name_with_its_frozen_model_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("prefs.jsonl");
    preferences(&data);
    let run = dir.path().join("own-dpo");
    let data = data.display().to_string();
    let flags = ["--step", "dpo", "--data", &data, "--seq-len", "20"];
    let whole = assert_resumes_exactly(&run, &flags);
    // The policy starts as its reference: every margin is 0, the loss ln 2.
    assert!(
        (whole[0].1 - std::f64::consts::LN_2).abs() < 1e-6,
        "{whole:?}"
    );
    assert_eq!(
        recorded_objective(&run),
        serde_json::json!({"kind": "step", "name": "dpo"})
    );
    let steps: Vec<serde_json::Value> = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .filter(|value| value["kind"] == "step")
        .collect();
    assert_eq!(steps[0]["reward_margin"], 0.0, "{}", steps[0]);
    assert_eq!(steps[0]["accuracy"], 0.0, "{}", steps[0]);
    let last = &steps[steps.len() - 1];
    assert!(last["reward_margin"].as_f64().unwrap() > 0.0, "{last}");
    // The model's default step by name is the run without --step.
    let plain = dir.path().join("plain");
    let out = plain.display().to_string();
    let stderr = succeeded(&lmx(&[
        "train",
        "--preset",
        "tiny-bytes",
        "--step",
        "train",
        "--steps",
        "1",
        "--seq-len",
        "16",
        "--quiet",
        "--sample",
        "0",
        "--out",
        &out,
    ]));
    assert_eq!(
        recorded_objective(&plain),
        serde_json::Value::Null,
        "{stderr}"
    );
}

/// A tiny LLaMA of bytes (257 ids), trained 2 steps into `dir`: a teacher of another
/// architecture than the byte-level GPT-2 students.
fn llama_teacher(dir: &Path) -> String {
    let out = dir.display().to_string();
    succeeded(&lmx(&[
        "train",
        "--model",
        "llama",
        "--preset",
        "tiny",
        "--set",
        "vocab=257",
        "--batch-size",
        "4",
        "--seq-len",
        "32",
        "--steps",
        "2",
        "--quiet",
        "--sample",
        "0",
        "--out",
        &out,
    ]));
    out
}

/// `--teacher` of another architecture: GPT-2 distils from LLaMA. On a corpus of one window,
/// the first step's loss at `--alpha 1` is the seed's soft loss of GPT-2's initialisation
/// against the LLaMA run's weights, computed here with the typed models; the run resumes
/// exactly.
#[test]
fn distillation_from_another_architecture_computes_the_seed_loss_and_resumes_exactly() {
    use lmx::cli::run_file::{checkpoint_of, load_params, RunFile};
    use lmx::models::{gpt2, llama};
    use lmx::runtime::model::{Context, LanguageModel};
    use lmx::runtime::objectives::distillation_loss;
    use lmx::runtime::Array;

    let dir = tempfile::tempdir().unwrap();
    let teacher_dir = dir.path().join("teacher");
    let teacher = llama_teacher(&teacher_dir);
    // 40 bytes and the end-of-sequence id: one window of 32, all of it in training.
    let text: String = "To be, or not to be, that is the question"[..40].to_owned();
    let corpus = dir.path().join("one-window.txt");
    std::fs::write(&corpus, &text).unwrap();
    let toml = dir.path().join("train.toml");
    std::fs::write(&toml, "validation_fraction = 0.0\n").unwrap();
    let student = dir.path().join("one");
    let out = student.display().to_string();
    let stderr = succeeded(&lmx(&[
        "train",
        "--preset",
        "tiny-bytes",
        "--teacher",
        &teacher,
        "--alpha",
        "1",
        "--data",
        corpus.to_str().unwrap(),
        "--config",
        toml.to_str().unwrap(),
        "--batch-size",
        "1",
        "--seq-len",
        "32",
        "--steps",
        "1",
        "--quiet",
        "--sample",
        "0",
        "--out",
        &out,
    ]));
    assert!(
        stderr.contains(&format!("teacher: llama from {teacher}, ")),
        "the run names its frozen teacher: {stderr}"
    );
    let logged = losses(&student)[0].1;

    let run = RunFile::read(&student).unwrap();
    let config: gpt2::Config = serde_json::from_value(run.model_config.clone()).unwrap();
    let params = gpt2::Gpt2::init(&config, run.train.seed).unwrap();
    let teacher_run = RunFile::read(&teacher_dir).unwrap();
    let teacher_config: llama::Config =
        serde_json::from_value(teacher_run.model_config.clone()).unwrap();
    let checkpoint = checkpoint_of(&teacher_dir, None).unwrap();
    let teacher_params =
        load_params::<llama::Llama>(&teacher_run, &teacher_config, &checkpoint, None).unwrap();
    let ids: Vec<i32> = text.bytes().map(i32::from).collect();
    let inputs = Array::from_slice(&ids[..32], &[1, 32]);
    let targets = Array::from_slice(&ids[1..33], &[1, 32]);
    let student_logits =
        gpt2::Gpt2::forward(&params, &config, &inputs, &mut Context::evaluation()).unwrap();
    let teacher_logits = llama::Llama::forward(
        &teacher_params,
        &teacher_config,
        &inputs,
        &mut Context::evaluation(),
    )
    .unwrap();
    let expected = distillation_loss(&student_logits, &teacher_logits, &targets, 4.0, 1.0)
        .unwrap()
        .item_exact::<f32>() as f64;
    assert!(
        (logged - expected).abs() <= 1e-5 * expected.abs(),
        "logged {logged}, the seed's soft loss {expected}"
    );

    assert_distillation_resumes_exactly(&dir.path().join("student"), &teacher);
}

/// A distillation run from `teacher` in `run` resumes bit for bit, recording the teacher and
/// the default temperature and alpha as its objective.
fn assert_distillation_resumes_exactly(run: &Path, teacher: &str) {
    assert_resumes_exactly(run, &["--teacher", teacher, "--seq-len", "32"]);
    assert_eq!(
        recorded_objective(run),
        serde_json::json!({"kind": "distill", "teacher": teacher, "temperature": 4.0, "alpha": 0.7})
    );
}

/// A teacher of other ids is refused before anything is trained, naming both sides: another
/// vocabulary size, or the same size read by another tokenizer. A Hugging Face folder of
/// another architecture with the student's tokenizer teaches.
#[test]
fn distillation_refuses_a_teacher_of_other_ids_and_reads_a_folder_of_another_architecture() {
    let dir = tempfile::tempdir().unwrap();
    let teacher = llama_teacher(&dir.path().join("teacher"));
    let out = dir.path().join("student").display().to_string();
    let student = |flags: &[&str]| {
        let mut args = vec![
            "train",
            "--preset",
            "tiny-bytes",
            "--seq-len",
            "16",
            "--batch-size",
            "2",
            "--steps",
            "2",
            "--quiet",
            "--sample",
            "0",
            "--out",
            &out,
        ];
        args.extend(flags);
        lmx(&args)
    };
    assert_eq!(
        failed(&student(&[
            "--teacher",
            &teacher,
            "--set",
            "vocab=300",
            "--tokenizer",
            "byte",
        ])),
        "error: configuration: the teacher (llama) has a vocabulary of 257 ids, the student \
         (gpt2) one of 300\n"
    );
    let folder = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/hf/llama");
    assert_eq!(
        failed(&student(&[
            "--teacher",
            folder,
            "--set",
            "vocab=288",
            "--tokenizer",
            "byte",
        ])),
        format!(
            "error: the teacher {folder} reads text with another tokenizer \
             ({folder}/tokenizer.json) than the student: 288 ids against the student's 257; \
             distillation needs the same ids for the same text\n"
        )
    );
    assert!(!Path::new(&out).join("run.json").exists());
    let tokenizer = format!("{folder}/tokenizer.json");
    let stderr = succeeded(&student(&[
        "--teacher",
        folder,
        "--set",
        "vocab=288",
        "--tokenizer",
        &tokenizer,
    ]));
    assert!(
        stderr.contains(&format!("teacher: llama from {folder}, ")),
        "{stderr}"
    );
    assert_eq!(losses(Path::new(&out)).len(), 2);
}
