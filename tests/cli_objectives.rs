//! `lmx train --step dpo` and `lmx train --teacher DIR` end to end with the tiny byte-level GPT:
//! the objective is recorded in run.json, a run continued from a checkpoint computes the losses
//! of the uninterrupted one, and wrong combinations of flags are refused naming the flags.

use std::path::Path;
#[path = "support/cli.rs"]
mod cli;

use cli::{failed, lmx, losses, succeeded, text};

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

/// Pairs from the bundled text: a prompt, the real continuation, and a corrupted one.
fn preferences(path: &Path) {
    let source =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/data/shakespeare.txt"))
            .unwrap();
    let letters: Vec<char> = source.chars().filter(|c| c.is_ascii_lowercase()).collect();
    let mut lines = String::new();
    for i in 0..24 {
        let at = i * 16;
        let prompt: String = letters[at..at + 10].iter().collect();
        let chosen: String = letters[at + 10..at + 16].iter().collect();
        let rejected: String = chosen
            .chars()
            .map(|c| if c == 'z' { 'a' } else { 'z' })
            .collect();
        let line = serde_json::json!({"prompt": prompt, "chosen": chosen, "rejected": rejected});
        lines.push_str(&format!("{line}\n"));
    }
    std::fs::write(path, lines).unwrap();
}

#[test]
fn dpo_trains_against_a_frozen_copy_and_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("prefs.jsonl");
    preferences(&data);
    let run = dir.path().join("dpo");
    let data = data.display().to_string();
    let flags = [
        "--step",
        "dpo",
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
    let student = dir.path().join("student");
    assert_resumes_exactly(&student, &["--teacher", &out, "--seq-len", "32"]);
    assert_eq!(
        recorded_objective(&student),
        serde_json::json!({"kind": "distill", "teacher": out, "temperature": 4.0, "alpha": 0.7})
    );
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
        refused(&["--step", "dpo", "--teacher", "t"]),
        "error: --teacher distils from a teacher, --step dpo trains against a frozen copy of \
         the model: give one of them\n"
    );
    assert_eq!(
        refused(&["--step", "ppo"]),
        "error: unknown --step `ppo`: dpo, grpo, distill or mtp (leave it out to train with \
         the model's own step)\n"
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
