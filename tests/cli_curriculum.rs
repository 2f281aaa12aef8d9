//! `lmx train --curriculum-easy FILE --data HARD`: the difficulty curriculum is recorded in
//! run.json as part of the run, a run continued from a checkpoint computes the uninterrupted
//! one's losses, a changed curriculum is refused on resume, and wrong flags are refused naming
//! them. (Which rows each step reads is tested in lmx-runtime's `curriculum_data`.)

use crate::support::cli;

use cli::{failed, lmx, losses, succeeded};

#[test]
fn a_difficulty_curriculum_is_recorded_and_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let easy = dir.path().join("easy.txt");
    std::fs::write(&easy, "the cat sat on the mat. ".repeat(200)).unwrap();
    let easy = easy.display().to_string();
    let run = dir.path().join("run");
    let out = run.display().to_string();
    let hard = concat!(env!("CARGO_MANIFEST_DIR"), "/data/shakespeare.txt");
    succeeded(&lmx(&[
        "train",
        "--preset",
        "tiny-bytes",
        "--data",
        hard,
        "--curriculum-easy",
        &easy,
        "--curriculum-warmup",
        "0.4",
        "--steps",
        "8",
        "--checkpoint-every",
        "4",
        "--batch-size",
        "4",
        "--seq-len",
        "32",
        "--quiet",
        "--sample",
        "0",
        "--out",
        &out,
    ]));
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("run.json")).unwrap()).unwrap();
    assert_eq!(
        record["curriculum"],
        serde_json::json!({"easy": [easy], "warmup_fraction": 0.4, "easy_tokens": 4801})
    );
    let whole = losses(&run);
    assert_eq!(whole.len(), 8);
    let from = run.join("checkpoints/step-000004").display().to_string();
    let resume = |extra: &[&str]| {
        let mut args = vec!["train", "--out", &out, "--resume-from", &from, "--quiet"];
        args.extend(["--sample", "0"]);
        args.extend(extra);
        lmx(&args)
    };
    let stderr = failed(&resume(&["--curriculum-warmup", "0.8"]));
    assert!(
        stderr.contains("curriculum.warmup_fraction: 0.4 -> 0.8"),
        "{stderr}"
    );
    succeeded(&resume(&[]));
    assert_eq!(losses(&run), whole);
}

#[test]
fn wrong_curriculum_flags_are_refused_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run").display().to_string();
    let refused = |flags: &[&str]| {
        let mut args = vec![
            "train",
            "--preset",
            "tiny-bytes",
            "--steps",
            "2",
            "--out",
            &out,
        ];
        args.extend(["--seq-len", "32"]);
        args.extend(flags);
        failed(&lmx(&args))
    };
    assert_eq!(
        refused(&["--curriculum-warmup", "0.5"]),
        "error: --curriculum-warmup applies to --curriculum-easy\n"
    );
    let data = dir.path().join("prefs.jsonl");
    std::fs::write(
        &data,
        "{\"prompt\": \"a\", \"chosen\": \"b\", \"rejected\": \"c\"}\n",
    )
    .unwrap();
    let data = data.display().to_string();
    assert_eq!(
        refused(&["--step", "dpo", "--data", &data, "--curriculum-easy", &data]),
        "error: --curriculum-easy mixes text or token files into the batches of --data's text: \
         not with supervised examples, --step dpo or --step grpo\n"
    );
    let text = concat!(env!("CARGO_MANIFEST_DIR"), "/data/shakespeare.txt");
    assert_eq!(
        refused(&["--curriculum-easy", text, "--curriculum-warmup", "0"]),
        "error: configuration: difficulty curriculum: `warmup_fraction` must be in (0, 1], got 0\n"
    );
}
