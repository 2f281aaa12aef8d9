//! Models beside the bundled ones, through the stock binary: `lmx train --model FILE.lmx` (a file
//! with errors is shown as `lmx check` shows it; a file with a bundled model's source trains as
//! that model; another is built into a program of its own, which needs lmx's source), and `lmx
//! new`'s refusals. Building a crate is tests/new_crate.rs's part.

use crate::support::cli::{lmx, ok};
use std::path::Path;
use std::process::{Command, Output};

fn stderr_of_failing(output: Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        !output.status.success(),
        "succeeded:\n{}\n{stderr}",
        String::from_utf8_lossy(&output.stdout)
    );
    stderr
}

fn fails(args: &[&str]) -> String {
    stderr_of_failing(lmx(args))
}

/// Trains `file` (a GPT-2 source) at its tiny preset for `steps` steps into `out`: the output.
fn train_tiny(file: &str, steps: &str, out: &str) -> String {
    ok(&[
        "train",
        "--model",
        file,
        "--preset",
        "tiny-bytes",
        "--steps",
        steps,
        "--batch-size",
        "2",
        "--seq-len",
        "16",
        "--quiet",
        "--sample",
        "0",
        "--out",
        out,
    ])
}

/// The stderr of `lmx args`, which must fail, with `dir` as lmx's source (no checkout) and
/// `dir/cache` as its cache.
fn fails_without_source(dir: &Path, args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_lmx"))
        .args(args)
        .env("LMX_SOURCE", dir)
        .env("LMX_CACHE_DIR", dir.join("cache"))
        .output()
        .unwrap();
    stderr_of_failing(output)
}

fn bundled_gpt2() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("models/gpt2.lmx")).unwrap()
}

#[test]
fn a_model_file_with_errors_fails_as_lmx_check_shows_it_before_any_run_is_made() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("broken.lmx");
    let broken = bundled_gpt2().replace(
        "c_proj(gelu_approx(c_fc(x)))",
        "c_proj(gelu_approx(c_fc(y)))",
    );
    std::fs::write(&file, broken).unwrap();
    let file = file.to_str().unwrap();
    let out = dir.path().join("run");
    let train = fails(&[
        "train",
        "--model",
        file,
        "--out",
        out.to_str().unwrap(),
        "--quiet",
    ]);
    let check = fails(&["check", file]);
    assert_eq!(train, check);
    assert!(
        train.contains(file),
        "the diagnostics name the file: {train}"
    );
    assert!(
        !out.exists(),
        "nothing is written for a file that does not check"
    );
    let missing = dir.path().join("missing.lmx");
    let missing = missing.to_str().unwrap();
    assert!(fails(&["train", "--model", missing])
        .starts_with(&format!("error: cannot read {missing}: ")),);
    assert_eq!(
        fails(&["train", "--model", "gpt3"]),
        "error: no trainable model `gpt3`; the registered ones are gpt2, llama, gemma, mistral, \
         mixtral, mpt, qwen2, qwen3, gemma2, gemma3_text, phi3, deepseek_v2, mamba2, hybrid, \
         qwen3_next, deepseek_v3, or give a path to a .lmx file or a Hugging Face model folder\n"
    );
}

#[test]
fn a_model_file_with_a_bundled_model_s_source_trains_and_generates_as_that_model() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("my-gpt.lmx");
    std::fs::write(&file, bundled_gpt2()).unwrap();
    let file = file.to_str().unwrap();
    let out = dir.path().join("run");
    let out = out.to_str().unwrap();
    let trained = train_tiny(file, "2", out);
    assert!(trained.contains("trained gpt2 to step 2"), "{trained}");
    let run: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(Path::new(out).join("run.json")).unwrap())
            .unwrap();
    assert_eq!(run["model"], file, "the run records the file, as given");
    let generated = ok(&["generate", "--run", out, "--max-tokens", "4"]);
    assert!(generated.starts_with("ROMEO:"), "{generated}");
}

#[test]
fn a_model_file_the_binary_does_not_hold_is_built_from_lmx_s_source_which_must_be_at_hand() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("wider.lmx");
    std::fs::write(
        &file,
        bundled_gpt2().replace("d_ff = 4 * d_model", "d_ff = 3 * d_model"),
    )
    .unwrap();
    let stderr = fails_without_source(
        dir.path(),
        &["train", "--model", file.to_str().unwrap(), "--quiet"],
    );
    assert!(
        stderr.contains(&format!(
            "{}: a .lmx file that this program does not hold runs in a program built for it \
             against lmx's source, which must be at hand (set LMX_SOURCE to an lmx checkout): {} \
             is no lmx checkout",
            file.display(),
            dir.path().display()
        )),
        "{stderr}"
    );
    assert!(!dir.path().join("cache").exists());
}

/// Every command that reads a run goes, for a run of a `.lmx` file this program does not hold,
/// to the program built for the file: each fails here only for want of lmx's source, as training
/// the file does, and none says the model is unknown.
#[test]
fn every_command_on_a_run_of_a_model_file_the_binary_does_not_hold_runs_in_its_program() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("mine.lmx");
    std::fs::write(&file, bundled_gpt2()).unwrap();
    let run = dir.path().join("run");
    let (file_arg, run_arg) = (file.to_str().unwrap(), run.to_str().unwrap());
    train_tiny(file_arg, "1", run_arg);
    // The file changes after the run: it is no longer the bundled GPT-2's source.
    std::fs::write(
        &file,
        bundled_gpt2().replace("d_ff = 4 * d_model", "d_ff = 3 * d_model"),
    )
    .unwrap();
    let exported = dir.path().join("exported");
    let exported = exported.to_str().unwrap();
    let commands: [&[&str]; 6] = [
        &["generate", "--run", run_arg, "--max-tokens", "2"],
        &["eval", "--run", run_arg, "--data", file_arg],
        &["export", "--run", run_arg, "--out", exported],
        &["fuse", "--run", run_arg, "--out", exported],
        &["quantize", "--model", run_arg, "--out", exported],
        &["serve", "--run", run_arg],
    ];
    for args in commands {
        let stderr = fails_without_source(dir.path(), args);
        assert!(
            stderr.contains(&format!(
                "{}: a .lmx file that this program does not hold runs in a program built for it",
                file.display()
            )),
            "lmx {args:?}: {stderr}"
        );
    }
    assert!(!dir.path().join("cache").exists());
    assert!(!dir.path().join("exported").exists());
}

#[test]
fn lmx_new_refuses_a_folder_that_is_not_empty_and_an_invalid_name() {
    let dir = tempfile::tempdir().unwrap();
    let taken = dir.path().join("taken");
    std::fs::create_dir(&taken).unwrap();
    std::fs::write(taken.join("notes.txt"), "mine").unwrap();
    assert_eq!(
        fails(&["new", taken.to_str().unwrap()]),
        format!(
            "error: {} exists and is not empty: lmx new writes a crate into a new or empty \
             folder\n",
            taken.display()
        )
    );
    assert_eq!(
        std::fs::read_dir(&taken).unwrap().count(),
        1,
        "the folder is left as it was"
    );
    let invalid = dir.path().join("my model");
    assert_eq!(
        fails(&["new", invalid.to_str().unwrap()]),
        "error: `my model` is no valid crate name: it must start with a letter and hold only \
         ASCII letters, digits, `-` and `_`\n"
    );
    assert!(!invalid.exists());
    let keyword = dir.path().join("struct");
    assert!(fails(&["new", keyword.to_str().unwrap()]).contains("keeps for itself"));
    let not_lmx = dir.path().join("fresh");
    assert!(fails(&[
        "new",
        not_lmx.to_str().unwrap(),
        "--lmx-path",
        dir.path().to_str().unwrap()
    ])
    .contains("is no lmx checkout"));
    assert!(!not_lmx.exists());
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "no staging folder is left"
    );
}

/// `lmx check` counts what a model's `frozen` marks leave to train (the checker's accept case:
/// an embedding, a list of blocks and a leaf of a group frozen; a tensor named `frozen` not).
#[test]
fn lmx_check_reports_what_frozen_marks_leave_to_train() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("grammar/tests/accept/param_marks.lmx");
    let checked = ok(&["check", file.to_str().unwrap()]);
    assert!(
        checked.contains("trainable         16,512 (`frozen` marks; 25,088 frozen)\n"),
        "{checked}"
    );
}
