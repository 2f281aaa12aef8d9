//! `lmx train` as the README's first command runs it, at a tiny size: `--tokenizer auto` trains a
//! BPE tokenizer of the model's vocabulary on the data and keeps it in the run, a resumed run and
//! `generate` read that same tokenizer, and with standard error not a terminal (a pipe here) the
//! progress comes as a line every `--log-every` steps.

use lmx::runtime::data::{HfTokenizer, Tokenizer};
use std::path::Path;
use std::process::{Command, Output};

fn lmx(args: &[&str]) -> Output {
    let output = Command::new(env!("CARGO_BIN_EXE_lmx"))
        .args(args)
        .output()
        .expect("lmx runs");
    assert!(
        output.status.success(),
        "lmx {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// The progress lines of a run's standard error: `step N/TOTAL  loss ...`.
fn progress_steps(stderr: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(stderr)
        .lines()
        .filter(|line| line.contains("  loss "))
        .map(|line| line.split("  ").next().unwrap().to_owned())
        .collect()
}

#[test]
fn auto_trains_a_bpe_tokenizer_that_resume_and_generate_reuse_with_progress_lines_on_a_pipe() {
    let dir = tempfile::tempdir().unwrap();
    // 40 KB of the bundled play: enough for 320 ids, quick to learn them from.
    let text: String = std::fs::read_to_string("data/shakespeare.txt")
        .unwrap()
        .chars()
        .take(40_000)
        .collect();
    let data = dir.path().join("play.txt");
    std::fs::write(&data, &text).unwrap();
    let run = dir.path().join("run");
    let common = [
        "--preset",
        "tiny-bytes",
        "--set",
        "vocab=320",
        "--data",
        data.to_str().unwrap(),
        "--batch-size",
        "4",
        "--seq-len",
        "32",
        "--log-every",
        "4",
        "--sample",
        "0",
        "--out",
        run.to_str().unwrap(),
    ];

    let trained = lmx(&[&["train", "--steps", "10"][..], &common].concat());
    assert_eq!(
        progress_steps(&trained.stderr),
        ["step 4/10", "step 8/10", "step 10/10"],
        "{}",
        String::from_utf8_lossy(&trained.stderr)
    );
    let run_file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("run.json")).unwrap()).unwrap();
    assert_eq!(run_file["tokenizer"], "bpe");
    let tokenizer_file = run.join("tokenizer.json");
    let tokenizer = HfTokenizer::from_file(&tokenizer_file).unwrap();
    assert_eq!(tokenizer.vocab_size(), 320);
    let line = "ROMEO: What light through yonder window breaks? Café, naïve.";
    let ids = tokenizer.encode(line).unwrap();
    assert!(ids.len() < line.len(), "BPE merges bytes: {ids:?}");
    assert_eq!(tokenizer.decode(&ids).unwrap(), line);

    let saved = std::fs::read(&tokenizer_file).unwrap();
    let resumed = lmx(&[
        &["train", "--steps", "12", "--resume", "--allow-changes"][..],
        &common,
    ]
    .concat());
    assert_eq!(progress_steps(&resumed.stderr), ["step 12/12"]);
    assert_eq!(
        std::fs::read(&tokenizer_file).unwrap(),
        saved,
        "a resumed run keeps its tokenizer"
    );

    let generated = lmx(&[
        "generate",
        "--run",
        run.to_str().unwrap(),
        "--prompt",
        "ROMEO:",
        "--max-tokens",
        "8",
    ]);
    let stdout = String::from_utf8_lossy(&generated.stdout);
    assert!(stdout.starts_with("ROMEO:"), "{stdout}");
    assert!(Path::new(&run).join("checkpoints/step-000012").is_dir());
}
