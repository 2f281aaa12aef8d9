//! `lmx train`'s run directory as an unlucky user meets it, with real processes: two trainings
//! into one directory, Ctrl-C and resume, a resume that would change the run, a fresh run into a
//! used directory, a log with lines past the checkpoint, and a diverged run continued from the
//! checkpoint it names.

use crate::support::cli::checkpoint;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The tiny byte-level GPT, a few steps' worth of flags: `--out RUN` and no sample.
fn tiny(run: &Path) -> Vec<String> {
    [
        "train",
        "--preset",
        "tiny-bytes",
        "--batch-size",
        "4",
        "--seq-len",
        "32",
        "--quiet",
        "--sample",
        "0",
        "--out",
    ]
    .iter()
    .map(|arg| arg.to_string())
    .chain([run.display().to_string()])
    .collect()
}

fn lmx(args: &[String], extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lmx"))
        .args(args)
        .args(extra)
        .output()
        .expect("lmx runs")
}

fn spawn(args: &[String], extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_lmx"))
        .args(args)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("lmx starts")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Asserts that `output` succeeded, returning its stderr.
fn succeeded(output: &Output) -> String {
    let stderr = text(&output.stderr);
    assert!(
        output.status.success(),
        "{}\n{stderr}",
        text(&output.stdout)
    );
    stderr
}

/// Asserts that `output` failed, returning its stderr.
fn failed(output: &Output) -> String {
    let stderr = text(&output.stderr);
    assert!(!output.status.success(), "{}", text(&output.stdout));
    stderr
}

/// The `(step, loss)` of each step line of `RUN/metrics.jsonl`.
fn losses(run: &Path) -> Vec<(u64, f64)> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|value| value["kind"] == "step")
        .map(|value| {
            (
                value["step"].as_u64().unwrap(),
                value["loss"].as_f64().unwrap(),
            )
        })
        .collect()
}

/// Waits until the run has logged a step after `after`, failing if the process ends first.
fn wait_for_step_after(child: &mut Child, run: &Path, after: u64) -> u64 {
    let started = Instant::now();
    loop {
        if let Some(&(step, _)) = losses(run).last() {
            if step > after {
                return step;
            }
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("lmx ended ({status}) before logging a step after {after}");
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no step logged"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn signal(child: &Child, signal: i32) {
    // SAFETY: sends a signal to the child this test started and has not reaped yet.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
}

#[test]
fn ctrl_c_saves_a_checkpoint_and_resume_gives_the_losses_of_an_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let (whole, parts) = (dir.path().join("whole"), dir.path().join("parts"));
    let steps = ["--steps", "60", "--checkpoint-every", "1000"];
    succeeded(&lmx(&tiny(&whole), &steps));
    let expected = losses(&whole);
    assert_eq!(expected.len(), 60);

    let mut child = spawn(&tiny(&parts), &steps);
    wait_for_step_after(&mut child, &parts, 0);
    signal(&child, libc::SIGINT);
    let output = child.wait_with_output().unwrap();
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "{stderr}");
    let step = losses(&parts).last().unwrap().0;
    assert!(step < 60, "stopped before the end: {stderr}");
    assert!(
        stderr.ends_with(&format!(
            "interrupted by SIGINT at step {step}; checkpoint {}; continue with: lmx train --out {} --resume\n",
            checkpoint(&parts, step).display(),
            parts.display()
        )),
        "{stderr}"
    );
    assert!(checkpoint(&parts, step).join("model.safetensors").is_file());

    // The resume takes the run's recorded settings: --steps need not be given again.
    let stderr = succeeded(&lmx(&tiny(&parts), &["--resume"]));
    assert!(
        stderr.contains(&format!(
            "resumed from {} at step {step}",
            checkpoint(&parts, step).display()
        )),
        "{stderr}"
    );
    assert_eq!(
        losses(&parts),
        expected,
        "bit-identical on the CPU, each step once"
    );
}

#[test]
fn a_second_training_into_a_run_directory_in_use_fails_naming_it_and_its_process() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let mut first = spawn(&tiny(&run), &["--steps", "100000"]);
    wait_for_step_after(&mut first, &run, 0);
    let second = lmx(&tiny(&run), &["--steps", "5", "--resume"]);
    let stderr = failed(&second);
    assert_eq!(
        stderr,
        format!(
            "error: run folder {} is in use by process {}\n",
            run.display(),
            first.id()
        )
    );
    // Killed at once, the first leaves its lock behind in the file system, but not in the
    // kernel: the next training goes ahead.
    first.kill().unwrap();
    first.wait().unwrap();
    let stderr = succeeded(&lmx(
        &tiny(&run),
        &["--resume", "--steps", "3", "--allow-changes"],
    ));
    assert!(stderr.contains("train.steps: 100000 -> 3"), "{stderr}");
}

#[test]
fn a_fresh_run_into_a_used_directory_is_refused_unless_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    succeeded(&lmx(
        &tiny(&run),
        &["--steps", "4", "--checkpoint-every", "2"],
    ));
    let stderr = failed(&lmx(&tiny(&run), &["--steps", "3"]));
    assert_eq!(
        stderr,
        format!(
            "error: run directory {} is not empty (it holds checkpoints, metrics.jsonl, \
             run.json): give --resume to continue its run, --overwrite to replace it, or \
             another --out\n",
            run.display()
        )
    );
    assert!(checkpoint(&run, 4).is_dir(), "the old run is untouched");
    succeeded(&lmx(&tiny(&run), &["--steps", "3", "--overwrite"]));
    let left: Vec<u64> = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .map(|entry| {
            entry.unwrap().file_name().to_string_lossy()[5..]
                .parse()
                .unwrap()
        })
        .collect();
    assert_eq!(left, [3], "only the new run's checkpoint");
    assert_eq!(losses(&run).len(), 3);

    // Unwritable places are named before any training.
    let file = dir.path().join("file");
    std::fs::write(&file, "").unwrap();
    let stderr = failed(&lmx(&tiny(&file), &["--steps", "3"]));
    assert!(
        stderr.starts_with(&format!("error: {}: ", file.display())),
        "{stderr}"
    );
    let stderr = failed(&lmx(&tiny(&run), &["--steps", "0", "--overwrite"]));
    assert_eq!(stderr, "error: configuration: steps must be at least 1\n");
    let log = std::fs::read(run.join("metrics.jsonl")).unwrap();
    std::fs::remove_dir_all(run.join("checkpoints")).unwrap();
    std::fs::write(run.join("checkpoints"), "").unwrap();
    let stderr = failed(&lmx(&tiny(&run), &["--resume"]));
    let checkpoints = run.join("checkpoints");
    assert!(
        stderr.starts_with(&format!("error: {}: ", checkpoints.display())),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read(run.join("metrics.jsonl")).unwrap(),
        log,
        "untouched"
    );
}

#[test]
fn a_resume_that_would_change_the_run_names_each_change_and_rewrites_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    succeeded(&lmx(
        &tiny(&run),
        &["--steps", "6", "--checkpoint-every", "3"],
    ));
    let recorded = std::fs::read(run.join("run.json")).unwrap();
    let stderr = failed(&lmx(
        &tiny(&run),
        &[
            "--resume",
            "--seed",
            "3",
            "--set",
            "pdrop=0.1",
            "--lr",
            "1e-2",
        ],
    ));
    assert_eq!(
        stderr,
        format!(
            "error: resuming would change the run in {}:\n  \
             model_config.pdrop: 0 -> 0.1\n  \
             train.schedule.final_lr: 0.0003 -> 0.001\n  \
             train.schedule.lr: 0.003 -> 0.01\n  \
             train.seed: 0 -> 3\n\
             leave these settings out to continue the run as recorded, or give --allow-changes\n",
            run.display()
        )
    );
    assert_eq!(std::fs::read(run.join("run.json")).unwrap(), recorded);

    // A finished run has nothing to train.
    let output = lmx(&tiny(&run), &["--resume"]);
    let stderr = succeeded(&output);
    assert!(
        stderr.starts_with(&format!(
            "nothing to train: the run in {} has made 6 of its 6 steps",
            run.display()
        )),
        "{stderr}"
    );
    assert_eq!(std::fs::read(run.join("run.json")).unwrap(), recorded);

    // More steps, accepted: the cosine stretches from where the run is, as the warning says.
    let stderr = succeeded(&lmx(
        &tiny(&run),
        &["--resume", "--steps", "8", "--allow-changes"],
    ));
    assert!(
        stderr.contains("  train.schedule.total_steps: 6 -> 8\n")
            && stderr
                .contains("warning: from step 7 on the learning rate follows the new schedule"),
        "{stderr}"
    );
    let steps: Vec<u64> = losses(&run).iter().map(|(step, _)| *step).collect();
    assert_eq!(steps, (1..=8).collect::<Vec<_>>());
}

#[test]
fn a_resumed_run_drops_the_log_lines_written_after_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    succeeded(&lmx(
        &tiny(&run),
        &["--steps", "6", "--checkpoint-every", "4"],
    ));
    // As a run killed after step 6's log line but before its checkpoint leaves it, the last
    // line cut short.
    std::fs::remove_dir_all(checkpoint(&run, 6)).unwrap();
    let mut log = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    log.push_str("{\"kind\":\"step\",\"st");
    std::fs::write(run.join("metrics.jsonl"), log).unwrap();
    let plotted = lmx(&["plot".into(), run.display().to_string()], &[]);
    assert!(text(&plotted.stderr).contains("skipped an incomplete last line"));
    succeeded(&plotted);

    succeeded(&lmx(&tiny(&run), &["--resume"]));
    let steps: Vec<u64> = losses(&run).iter().map(|(step, _)| *step).collect();
    assert_eq!(steps, (1..=6).collect::<Vec<_>>(), "each step once");
}

#[test]
fn a_diverged_run_continues_from_the_checkpoint_it_names_at_a_lower_rate() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    // The warm-up starts at rate 0, so step 1 leaves the parameters as they were; from step 2
    // on, 1e38 blows them up.
    let stderr = failed(&lmx(
        &tiny(&run),
        &["--steps", "8", "--checkpoint-every", "1", "--lr", "1e38"],
    ));
    let named = checkpoint(&run, 1);
    assert!(
        stderr.contains(&format!(
            "; training can continue from {} (its parameters' loss",
            named.display()
        )) && stderr.ends_with(&format!(
            "to continue from it at a lower learning rate: lmx train --out {} --resume-from {} \
                 --lr LR --allow-changes\n",
            run.display(),
            named.display()
        )),
        "{stderr}"
    );
    assert!(checkpoint(&run, 2).is_dir(), "a later, blown-up checkpoint");

    let stderr = succeeded(&lmx(
        &tiny(&run),
        &[
            "--resume-from",
            named.to_str().unwrap(),
            "--lr",
            "1e-3",
            "--allow-changes",
        ],
    ));
    assert!(
        stderr.contains(&format!(
            "removed {}, a later checkpoint",
            checkpoint(&run, 2).display()
        )),
        "{stderr}"
    );
    let losses = losses(&run);
    assert_eq!(
        losses.iter().map(|(step, _)| *step).collect::<Vec<_>>(),
        (1..=8).collect::<Vec<_>>()
    );
    assert!(
        losses.iter().all(|(_, loss)| loss.is_finite()),
        "{losses:?}"
    );
}
