//! The `lmx` command end to end: train the bundled GPT 50 steps with dropout (`--set`), resume to
//! 60 (a change of the run, so `--allow-changes`) in another run order (`--overlap`), generate text; refuse an unknown setting and name a
//! missing data file once; benchmark the reference GPT's step, each run in its own process, and
//! print its tables again from the runs it wrote.

use std::path::Path;
use std::process::Command;

fn lmx(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_lmx"))
        .args(args)
        .output()
        .expect("lmx runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "lmx {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

fn steps_logged(run: &Path) -> Vec<u64> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .filter(|value| value["kind"] == "step")
        .map(|value| value["step"].as_u64().unwrap())
        .collect()
}

#[test]
fn train_resume_generate() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let run_arg = run.to_str().unwrap();
    let common: [&str; 13] = [
        "--preset",
        "tiny-bytes",
        "--set",
        "pdrop=0.1",
        "--batch-size",
        "4",
        "--seq-len",
        "32",
        "--quiet",
        "--sample",
        "0",
        "--out",
        run_arg,
    ];

    let trained = lmx(&[
        &["train", "--steps", "50", "--checkpoint-every", "25"][..],
        &common,
    ]
    .concat());
    assert!(trained.contains("trained gpt2 to step 50"), "{trained}");
    let run_file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("run.json")).unwrap()).unwrap();
    assert_eq!(
        run_file["model_config"]["pdrop"], 0.1,
        "the run records --set"
    );
    assert!(run
        .join("checkpoints/step-000050/model.safetensors")
        .is_file());

    let resumed = lmx(&[
        &[
            "train",
            "--steps",
            "60",
            "--allow-changes",
            "--resume",
            "--overlap",
            "build",
        ][..],
        &common,
    ]
    .concat());
    assert!(resumed.contains("to step 60"), "{resumed}");
    let run_file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("run.json")).unwrap()).unwrap();
    assert_eq!(
        run_file["train"]["overlap"], "build",
        "the run records --overlap"
    );
    assert_eq!(
        steps_logged(&run),
        (1..=60).collect::<Vec<_>>(),
        "one log line per step, none repeated"
    );

    let text = lmx(&[
        "generate",
        "--run",
        run_arg,
        "--prompt",
        "ROMEO:",
        "--max-tokens",
        "20",
        "--temperature",
        "0",
    ]);
    assert!(text.starts_with("ROMEO:"), "{text}");
    // Whitespace counts: 60 steps of a tiny model may well decode greedily to spaces.
    assert!(
        text.trim_end_matches('\n').chars().count() > "ROMEO:".len(),
        "nothing generated: {text:?}"
    );

    let plot = lmx(&["plot", run_arg]);
    assert!(Path::new(plot.trim()).is_file());
}

#[test]
fn an_unknown_setting_is_an_error_that_names_it_before_anything_runs() {
    let output = Command::new(env!("CARGO_BIN_EXE_lmx"))
        .args(["train", "--preset", "tiny-bytes", "--set", "n_layer=2"])
        .output()
        .expect("lmx runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("gpt2 has no setting `n_layer`; its settings are ")
            && stderr.contains("n_layers"),
        "{stderr}"
    );
}

#[test]
fn a_missing_data_file_is_named_once_with_the_reason_once() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-corpus.txt");
    let output = Command::new(env!("CARGO_BIN_EXE_lmx"))
        .args(["train", "--data"])
        .arg(&missing)
        .output()
        .expect("lmx runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let reason = std::fs::read(&missing).unwrap_err().to_string();
    assert!(
        stderr.contains(&format!("error: {}: {reason}", missing.display())),
        "{stderr}"
    );
    assert_eq!(stderr.matches(&reason).count(), 1, "{stderr}");
}

#[test]
fn bench_train_measures_each_run_in_its_own_process() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("runs.jsonl");
    let table = lmx(&[
        "bench",
        "train",
        "--configs",
        "tiny",
        "--modes",
        "compiled",
        "--batch",
        "2",
        "--seq",
        "16",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--repeats",
        "2",
        "--overlap",
        "build",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(table.contains("tiny     compiled  float32"), "{table}");
    let runs: Vec<serde_json::Value> = std::fs::read_to_string(&json)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(runs.len(), 2, "{runs:?}");
    for (repeat, run) in runs.iter().enumerate() {
        assert_eq!(run["impl"], "lmx");
        assert_eq!(run["repeat"], repeat);
        assert_eq!(run["overlap"], "build", "the row records --overlap");
        assert!(run["median_ms"].as_f64().unwrap() > 0.0, "{run}");
        assert!(run["peak_mib"].as_f64().unwrap() > 0.0, "{run}");
    }
    // Two fresh processes from the same seed train the same numbers.
    assert_eq!(runs[0]["loss_first"], runs[1]["loss_first"]);
    assert_eq!(runs[0]["loss_last"], runs[1]["loss_last"]);
    assert_ne!(runs[0]["loss_first"], runs[0]["loss_last"]);
    // The runs it wrote give back the tables it printed.
    assert_eq!(lmx(&["bench", "report", json.to_str().unwrap()]), table);
    #[cfg(unix)]
    a_closed_pipe_ends_lmx_quietly(&["bench", "report", json.to_str().unwrap()]);
}

/// Runs lmx with its output going into a pipe nobody reads: SIGPIPE ends it, as it ends any Unix
/// command, with no panic.
#[cfg(unix)]
fn a_closed_pipe_ends_lmx_quietly(args: &[&str]) {
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::process::ExitStatusExt;
    let mut ends = [0; 2];
    // SAFETY: `pipe` fills `ends` with two new descriptors, each owned once below.
    assert_eq!(unsafe { libc::pipe(ends.as_mut_ptr()) }, 0);
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1])) };
    drop(read);
    let output = Command::new(env!("CARGO_BIN_EXE_lmx"))
        .args(args)
        .stdout(write)
        .output()
        .expect("lmx runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.signal(), Some(libc::SIGPIPE), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
}
