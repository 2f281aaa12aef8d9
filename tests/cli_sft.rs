//! `lmx train --data DIR` on the bundled supervised examples (`data/sft`): with prompt masking
//! the validation loss falls, a resumed run computes the losses of an uninterrupted one, packing
//! trains too, and `lmx eval` reports the loss the trainer's validation computed.

use std::path::Path;
use std::process::Command;

fn lmx(args: &[&str]) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_lmx"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("lmx runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn ok(args: &[&str]) -> String {
    let (success, stdout, stderr) = lmx(args);
    assert!(success, "lmx {args:?} failed:\n{stdout}\n{stderr}");
    stdout
}

/// `(kind, step, loss)` of every line of a run's `metrics.jsonl`.
fn metrics(run: &Path) -> Vec<(String, u64, f64)> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .map(|value| {
            let kind = value["kind"].as_str().unwrap().to_owned();
            let loss = if kind == "eval" {
                &value["val_loss"]
            } else {
                &value["loss"]
            };
            (
                kind,
                value["step"].as_u64().unwrap(),
                loss.as_f64().unwrap(),
            )
        })
        .collect()
}

fn train_args<'a>(run: &'a str, batching: &'a str) -> Vec<&'a str> {
    vec![
        "train",
        "--data",
        "data/sft",
        "--tokenizer",
        "byte",
        "--preset",
        "tiny-bytes",
        "--mask-prompt",
        "--batching",
        batching,
        "--steps",
        "40",
        "--batch-size",
        "8",
        "--seq-len",
        "48",
        "--lr",
        "1e-2",
        "--warmup",
        "5",
        "--eval-every",
        "10",
        "--checkpoint-every",
        "20",
        "--quiet",
        "--sample",
        "0",
        "--out",
        run,
    ]
}

#[test]
fn supervised_training_evaluation_and_resume() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let run_arg = run.to_str().unwrap();
    ok(&train_args(run_arg, "pad"));
    let logged = metrics(&run);
    let evals: Vec<f64> = logged
        .iter()
        .filter(|(kind, ..)| kind == "eval")
        .map(|&(_, _, loss)| loss)
        .collect();
    assert_eq!(evals.len(), 4);
    assert!(
        evals[3] < evals[0] * 0.5,
        "the validation loss did not fall: {evals:?}"
    );
    let recorded: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("run.json")).unwrap()).unwrap();
    assert_eq!(recorded["sft"]["mask_prompt"], true);
    assert_eq!(recorded["sft"]["batching"], "pad");

    // valid.jsonl's 8 examples make one batch of 8 for both: the same loss.
    let out = ok(&["eval", "--run", run_arg, "--data", "data/sft/valid.jsonl"]);
    let loss: f64 = out
        .split("loss ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|number| number.parse().ok())
        .unwrap_or_else(|| panic!("no loss in {out:?}"));
    assert!(
        (loss - evals[3]).abs() < 1e-3,
        "eval {loss} vs validation {}",
        evals[3]
    );
    let test = ok(&["eval", "--run", run_arg]);
    assert!(
        test.starts_with("data/sft/test.jsonl: loss ")
            && test.contains(" targets of 8 examples; checkpoint "),
        "{test}"
    );

    // From the checkpoint at step 20, the run computes again what it computed.
    let checkpoint = run.join("checkpoints/step-000020");
    ok(&[
        "train",
        "--resume-from",
        checkpoint.to_str().unwrap(),
        "--out",
        run_arg,
        "--quiet",
        "--sample",
        "0",
    ]);
    assert_eq!(metrics(&run), logged);

    let packed = dir.path().join("packed");
    ok(&train_args(packed.to_str().unwrap(), "pack"));
    let evals: Vec<f64> = metrics(&packed)
        .iter()
        .filter(|(kind, ..)| kind == "eval")
        .map(|&(_, _, loss)| loss)
        .collect();
    assert!(evals[3] < evals[0], "packed: {evals:?}");
}

#[test]
fn bad_supervised_data_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(
        data.join("train.jsonl"),
        "{\"prompt\": \"a\", \"completion\": \"b\"}\n{\"prompt\": \"a\"}\n",
    )
    .unwrap();
    let run = dir.path().join("run");
    let common = [
        "train",
        "--data",
        data.to_str().unwrap(),
        "--seq-len",
        "32",
        "--quiet",
        "--sample",
        "0",
        "--out",
        run.to_str().unwrap(),
    ];
    let (success, _, stderr) = lmx(&[
        &common[..],
        &["--tokenizer", "byte", "--preset", "tiny-bytes"],
    ]
    .concat());
    assert!(!success);
    assert!(
        stderr.contains(&format!(
            "{}:2: no key \"completion\" (completions format, as the file's first example)",
            data.join("train.jsonl").display()
        )),
        "{stderr}"
    );
    assert!(
        !run.join("run.json").exists(),
        "nothing is written for bad data"
    );
    // `auto` would train a BPE tokenizer on text; examples are read with the model's own.
    let (success, _, stderr) = lmx(&[&common[..], &["--preset", "bpe"]].concat());
    assert!(!success);
    assert!(
        stderr.contains("give --tokenizer tokenizer.json"),
        "{stderr}"
    );
}
