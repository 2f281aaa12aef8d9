//! Running the `lmx` binary in tests, and reading what a run wrote.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `lmx ARGS`, run to completion.
pub fn lmx(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lmx"))
        .args(args)
        .output()
        .expect("lmx runs")
}

/// The standard output of `lmx ARGS`, which must succeed (the failure shows both streams).
pub fn ok(args: &[&str]) -> String {
    let output = lmx(args);
    let stdout = text(&output.stdout);
    assert!(
        output.status.success(),
        "lmx {args:?} failed:\n{stdout}\n{}",
        text(&output.stderr)
    );
    stdout
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The standard error of a run that must have succeeded.
pub fn succeeded(output: &Output) -> String {
    let stderr = text(&output.stderr);
    assert!(
        output.status.success(),
        "{}\n{stderr}",
        text(&output.stdout)
    );
    stderr
}

/// The standard error of a run that must have failed.
pub fn failed(output: &Output) -> String {
    assert!(!output.status.success(), "{}", text(&output.stdout));
    text(&output.stderr)
}

/// The `(step, loss)` of each step line of `RUN/metrics.jsonl`.
pub fn losses(run: &Path) -> Vec<(u64, f64)> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .filter(|value| value["kind"] == "step")
        .map(|value| {
            (
                value["step"].as_u64().unwrap(),
                value["loss"].as_f64().unwrap(),
            )
        })
        .collect()
}

/// The folder of `run`'s checkpoint of `step`.
pub fn checkpoint(run: &Path, step: u64) -> PathBuf {
    run.join(format!("checkpoints/step-{step:06}"))
}
