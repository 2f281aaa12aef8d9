//! Data-parallel `lmx train` on the CPU with MLX's ring backend, two processes on this host: two
//! ranks at batch b each (`--batch-size 2b`, the whole batch) train as one process at 2b; a
//! sharded optimizer state, with or without gradient accumulation, and the gradients summed
//! after the step or during its backward pass bucket by bucket change no loss; a checkpoint
//! of two ranks resumes on one and the reverse; the objectives with frozen models (DPO,
//! distillation, GRPO) train on two ranks as in one process, metrics included; a rank that dies
//! or hangs ends the other with an error instead of a hang.

use crate::support::cli::{checkpoint, lmx, losses};
use crate::support::preferences;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A tiny model, 4 x 32 tokens a step (each of two ranks: 2 x 32), no evaluation.
const COMMON: [&str; 12] = [
    "--preset",
    "tiny-bytes",
    "--batch-size",
    "4",
    "--seq-len",
    "32",
    "--eval-every",
    "0",
    "--quiet",
    "--sample",
    "0",
    "--checkpoint-every",
];

fn succeeds(args: &[&str]) -> String {
    let output = lmx(args);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        output.status.success(),
        "lmx {args:?} failed:\n{}\n{stderr}",
        String::from_utf8_lossy(&output.stdout)
    );
    stderr
}

/// `lmx train` over `COMMON` for `steps`, a checkpoint every `every`, into `run`, with `extra`;
/// on `ranks` processes through `lmx launch` (with `launch`'s options) when `ranks > 1`.
fn train(ranks: usize, launch: &[&str], run: &Path, steps: &str, every: &str, extra: &[&str]) {
    let n = ranks.to_string();
    let mut args: Vec<&str> = Vec::new();
    if ranks > 1 {
        args.extend(["launch", "-n", &n]);
        args.extend(launch);
        args.push("--");
    }
    args.extend(["train", "--steps", steps]);
    args.extend(COMMON);
    args.extend([every, "--out", run.to_str().unwrap()]);
    args.extend(extra);
    succeeds(&args);
}

fn assert_same_losses(one: &Path, other: &Path) {
    let (one, other) = (losses(one), losses(other));
    assert_eq!(one.len(), 20, "{one:?}");
    assert_eq!(
        one.iter().map(|(step, _)| *step).collect::<Vec<_>>(),
        other.iter().map(|(step, _)| *step).collect::<Vec<_>>()
    );
    for ((step, a), (_, b)) in one.iter().zip(&other) {
        assert!((a - b).abs() <= 1e-5, "step {step}: {a} against {b}");
    }
}

/// The loss `run`'s checkpoint of `step` records (its parameters' on the next step's batch).
fn checkpoint_loss(run: &Path, step: u64) -> f64 {
    let path = checkpoint(run, step).join("trainer.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let trainer: serde_json::Value = serde_json::from_str(&text).unwrap();
    trainer["loss"]
        .as_f64()
        .unwrap_or_else(|| panic!("{path:?}: no loss"))
}

#[test]
fn two_ranks_train_as_one_process_on_the_whole_batch_and_resume_across_rank_counts() {
    let dir = tempfile::tempdir().unwrap();
    let single = dir.path().join("single");
    train(1, &[], &single, "20", "10", &[]);
    assert_eq!(losses(&single).len(), 20);

    let two = dir.path().join("two");
    train(2, &[], &two, "20", "10", &[]);
    assert_same_losses(&single, &two);
    // Each rank holds only its rows of a batch; a checkpoint records the whole batch's loss.
    for step in [10, 20] {
        let (a, b) = (checkpoint_loss(&single, step), checkpoint_loss(&two, step));
        assert!((a - b).abs() <= 1e-5, "checkpoint {step}: {a} against {b}");
    }

    // The flat state, as on a GPU: its buffers of one dtype summed by one collective.
    let flat = dir.path().join("flat");
    train(2, &[], &flat, "20", "10", &["--state-packing", "flat"]);
    assert_same_losses(&single, &flat);

    // The optimizer state sharded over the ranks (ZeRO-1, a flat state on the CPU).
    let sharded = dir.path().join("sharded");
    train(2, &["--shard-optimizer"], &sharded, "20", "10", &[]);
    assert_same_losses(&single, &sharded);

    // Sharded, each rank's two rows as two micro-batches of one: the update is the one of the
    // whole batch still (the flat state's accumulating step, averaged once per update).
    let accumulated = dir.path().join("accumulated");
    train(
        2,
        &["--shard-optimizer"],
        &accumulated,
        "20",
        "10",
        &["--accumulate", "2"],
    );
    assert_same_losses(&single, &accumulated);

    // The gradients summed between the step's functions.
    let after = dir.path().join("after");
    train(2, &["--reduce", "after-step"], &after, "20", "10", &[]);
    assert_same_losses(&single, &after);

    // The gradients summed during the backward pass, bucket by bucket on a stream of their own:
    // buckets of 48 KiB cut the tiny model's flat state into many, some of one parameter.
    let overlap = ["--reduce", "overlap", "--bucket-mb", "0.046875"];
    let overlapped = dir.path().join("overlapped");
    train(2, &overlap, &overlapped, "20", "10", &[]);
    assert_same_losses(&single, &overlapped);
    let overlapped_sharded = dir.path().join("overlapped-sharded");
    let sharded_overlap: Vec<&str> = overlap
        .iter()
        .copied()
        .chain(["--shard-optimizer"])
        .collect();
    train(2, &sharded_overlap, &overlapped_sharded, "20", "10", &[]);
    assert_same_losses(&single, &overlapped_sharded);

    // A checkpoint written by two ranks (sharded: gathered first) goes on in one process...
    let resume = |run: &Path| {
        vec![
            "--resume-from".to_string(),
            checkpoint(run, 10).display().to_string(),
        ]
    };
    let from_two = resume(&sharded);
    let from_two: Vec<&str> = from_two.iter().map(String::as_str).collect();
    train(1, &[], &sharded, "20", "10", &from_two);
    assert_same_losses(&single, &sharded);

    // ... and one process's on two ranks.
    let from_one = resume(&single);
    let from_one: Vec<&str> = from_one.iter().map(String::as_str).collect();
    train(2, &[], &single, "20", "10", &from_one);
    let again = losses(&single);
    assert_same_losses(&two, &single);
    assert_eq!(again.len(), 20);
}

/// Each step's `name` metric in `run`'s `metrics.jsonl`.
fn metric(run: &Path, name: &str) -> Vec<f64> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .filter(|value| value["kind"] == "step")
        .map(|value| value[name].as_f64().unwrap())
        .collect()
}

/// Every one of the `steps` steps of `one` and `other` logs `name` within 1e-5.
fn assert_same_metric(one: &Path, other: &Path, name: &str, steps: usize) {
    let (one, other) = (metric(one, name), metric(other, name));
    assert_eq!((one.len(), other.len()), (steps, steps), "{name}");
    for (step, (a, b)) in one.iter().zip(&other).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5,
            "{name} at step {}: {a} against {b}",
            step + 1
        );
    }
}

/// DPO (lmx's, and GPT-2's declared step; the frozen reference whole on each rank), distillation (a frozen teacher; the loss a
/// mean over kept targets) and multi-token prediction on two ranks train as one process on the
/// whole batch: every step's loss and metrics (DPO's reward margin and preference accuracy, the
/// heads' losses), averaged over the ranks as the loss is, within 1e-5; DPO also with its state
/// packed flat and sharded over the ranks.
#[test]
fn objectives_with_frozen_models_train_on_two_ranks_as_in_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("prefs.jsonl");
    preferences::preferences(&data);
    let data = data.display().to_string();
    // lmx's DPO, and GPT-2's own `dpo` step (declared in its .lmx file with its reference).
    for step in ["builtin:dpo", "dpo"] {
        let dpo = ["--step", step, "--data", &data];
        let name = step.replace(':', "-");
        let (single, two) = (
            dir.path().join(format!("{name}-1")),
            dir.path().join(format!("{name}-2")),
        );
        train(1, &[], &single, "20", "10", &dpo);
        train(2, &[], &two, "20", "10", &dpo);
        assert_same_losses(&single, &two);
        for name in ["reward_margin", "accuracy"] {
            assert_same_metric(&single, &two, name, 20);
        }
        assert!(metric(&single, "reward_margin")[19] > 0.0, "{step} trained");
    }
    // The same DPO with its state packed flat (the default on CUDA), sharded over the ranks, and
    // summed during the backward pass: the ranks keep different counts of targets, so each
    // sum over them is divided by the kept fraction of the global batch.
    let dpo = [
        "--step",
        "builtin:dpo",
        "--data",
        &data,
        "--state-packing",
        "flat",
    ];
    let single = dir.path().join("builtin-dpo-1");
    let overlap = ["--reduce", "overlap", "--bucket-mb", "0.046875"];
    for (name, launch) in [
        ("flat", &[][..]),
        ("sharded", &["--shard-optimizer"][..]),
        ("overlapped", &overlap[..]),
    ] {
        let two = dir.path().join(format!("dpo-{name}-2"));
        train(2, launch, &two, "20", "10", &dpo);
        assert_same_losses(&single, &two);
        for metric in ["reward_margin", "accuracy"] {
            assert_same_metric(&single, &two, metric, 20);
        }
    }

    let teacher = dir.path().join("teacher");
    train(1, &[], &teacher, "4", "0", &["--set", "d_model=64"]);
    let teacher = teacher.display().to_string();
    let distill = ["--teacher", &teacher];
    let (single, two) = (dir.path().join("distill-1"), dir.path().join("distill-2"));
    train(1, &[], &single, "20", "10", &distill);
    train(2, &[], &two, "20", "10", &distill);
    assert_same_losses(&single, &two);

    // Multi-token prediction (LLaMA's heads; each head's loss a metric).
    let mtp = |ranks: usize, run: &Path| {
        let out = run.display().to_string();
        let mut args = match ranks {
            1 => vec!["train"],
            _ => vec!["launch", "-n", "2", "--", "train"],
        };
        args.extend(["--model", "llama", "--set", "vocab=257", "--step", "mtp"]);
        args.extend(["--steps", "20"]);
        args.extend(COMMON.iter().skip(2).copied());
        args.extend(["10", "--preset", "tiny", "--out", &out]);
        succeeds(&args);
    };
    let (single, two) = (dir.path().join("mtp-1"), dir.path().join("mtp-2"));
    mtp(1, &single);
    mtp(2, &two);
    assert_same_losses(&single, &two);
    for name in ["main_loss", "mtp_loss"] {
        assert_same_metric(&single, &two, name, 20);
    }
}

/// GRPO on two ranks, each sampling and training on half of every update's prompts (its
/// completions seeded as one process seeds them), makes one process's updates: every step's
/// loss, mean reward and KL within 1e-5, and the run resumes on one process.
#[test]
fn grpo_on_two_ranks_makes_one_process_s_updates() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("prompts.jsonl");
    let lines: String = [
        "To be",
        "All the",
        "Once more",
        "Now is",
        "What is",
        "If it",
    ]
    .iter()
    .map(|prompt| format!("{}\n", serde_json::json!({"prompt": prompt})))
    .collect();
    std::fs::write(&data, lines).unwrap();
    let data = data.display().to_string();
    // About half of the completions hold a vowel: the rewards differ within groups.
    let grpo = [
        "--step",
        "grpo",
        "--data",
        &data,
        "--reward",
        "regex:(?s).*[aeiou].*",
        "--group",
        "4",
    ];
    let (single, two) = (dir.path().join("grpo-1"), dir.path().join("grpo-2"));
    let grpo_run = |ranks: usize, run: &Path, extra: &[&str]| {
        let out = run.display().to_string();
        let mut args = match ranks {
            1 => vec!["train"],
            _ => vec!["launch", "-n", "2", "--", "train"],
        };
        args.extend([
            "--model",
            "llama",
            "--set",
            "vocab=257",
            "--tokenizer",
            "byte",
        ]);
        args.extend(["--steps", "8"]);
        args.extend(COMMON.iter().skip(2).copied());
        args.extend(["4", "--preset", "tiny", "--out", &out]);
        args.extend(grpo);
        args.extend(extra);
        succeeds(&args);
    };
    grpo_run(1, &single, &[]);
    grpo_run(2, &two, &[]);
    for name in ["loss", "mean_reward", "kl"] {
        assert_same_metric(&single, &two, name, 8);
    }
    assert!(
        metric(&single, "loss").iter().any(|loss| *loss != 0.0),
        "GRPO had a gradient"
    );
    assert!(
        metric(&single, "kl")[7] > 0.0,
        "the policy moved from its reference"
    );

    // Two ranks' checkpoint goes on in one process.
    let from = two.join("checkpoints/step-000004").display().to_string();
    grpo_run(1, &two, &["--resume-from", &from]);
    assert_same_metric(&single, &two, "loss", 8);
}

#[test]
fn a_bucket_size_without_buckets_or_of_no_bytes_is_refused_before_any_rank_starts() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let refused = |launch: &[&str]| {
        let mut args = vec!["launch", "-n", "2"];
        args.extend(launch);
        args.extend(["--", "train", "--steps", "2", "--preset", "tiny-bytes"]);
        args.extend(["--out", run.to_str().unwrap()]);
        let output = lmx(&args);
        assert!(!output.status.success(), "{launch:?}");
        assert!(!run.exists(), "{launch:?} started a rank");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    assert_eq!(
        refused(&["--bucket-mb", "8"]),
        "error: --bucket-mb sizes the buckets of --reduce overlap\n"
    );
    assert_eq!(
        refused(&["--reduce", "after-step", "--bucket-mb", "8"]),
        "error: --bucket-mb sizes the buckets of --reduce overlap\n"
    );
    assert_eq!(
        refused(&["--reduce", "overlap", "--bucket-mb", "0"]),
        "error: --bucket-mb 0: give a positive size in MiB\n"
    );
}

#[test]
fn a_batch_the_ranks_cannot_share_evenly_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let output = lmx(&[
        "launch",
        "-n",
        "3",
        "--",
        "train",
        "--steps",
        "2",
        "--preset",
        "tiny-bytes",
        "--batch-size",
        "4",
        "--seq-len",
        "8",
        "--out",
        run.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains(
            "error: batch_size is 4, which 3 ranks cannot share evenly: make it a multiple of 3"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("lmx launch: rank "), "{stderr}");
}

/// Two ranks started by hand as `lmx launch` starts them, training long enough to be stopped.
struct Ranks {
    children: Vec<Child>,
    run: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Ranks {
    fn start(timeout_s: &str) -> Ranks {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        let ports: Vec<u16> = (0..2)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
            .collect::<Vec<_>>()
            .iter()
            .map(|listener| listener.local_addr().unwrap().port())
            .collect();
        let hostfile = dir.path().join("hosts.json");
        std::fs::write(
            &hostfile,
            format!(
                "[[\"127.0.0.1:{}\"], [\"127.0.0.1:{}\"]]",
                ports[0], ports[1]
            ),
        )
        .unwrap();
        let children = (0..2)
            .map(|rank| {
                Command::new(env!("CARGO_BIN_EXE_lmx"))
                    .args(["train", "--steps", "100000"])
                    .args(COMMON)
                    .args(["0", "--out", run.to_str().unwrap()])
                    .env("MLX_RANK", rank.to_string())
                    .env("MLX_HOSTFILE", &hostfile)
                    .env("LMX_DISTRIBUTED_BACKEND", "ring")
                    .env("LMX_DISTRIBUTED_TIMEOUT", timeout_s)
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let ranks = Ranks {
            children,
            run,
            _dir: dir,
        };
        // Training is under way (compiled, two steps reported) before a rank is stopped.
        let started = Instant::now();
        while losses_so_far(&ranks.run) < 2 {
            assert!(started.elapsed() < Duration::from_secs(300), "no progress");
            std::thread::sleep(Duration::from_millis(100));
        }
        ranks
    }

    fn signal(&self, rank: usize, signal: &str) {
        let pid = self.children[rank].id().to_string();
        assert!(Command::new("kill")
            .args([signal, &pid])
            .status()
            .unwrap()
            .success());
    }

    /// Rank 0's exit status and standard error, once it ends: within `limit`, or the test fails.
    fn rank_0_ends(&mut self, limit: Duration) -> (Option<i32>, String) {
        let started = Instant::now();
        loop {
            if let Some(status) = self.children[0].try_wait().unwrap() {
                let mut stderr = String::new();
                use std::io::Read;
                self.children[0]
                    .stderr
                    .take()
                    .unwrap()
                    .read_to_string(&mut stderr)
                    .unwrap();
                return (status.code(), stderr);
            }
            assert!(started.elapsed() < limit, "rank 0 hangs");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Ranks {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn losses_so_far(run: &Path) -> usize {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .map(|text| text.lines().count())
        .unwrap_or(0)
}

#[test]
fn a_killed_rank_ends_the_other_with_an_error() {
    let mut ranks = Ranks::start("20");
    ranks.signal(1, "-KILL");
    let (status, stderr) = ranks.rank_0_ends(Duration::from_secs(120));
    // The ring backend fails the collective, or, where MLX leaves the step waiting on the
    // failed one, the watchdog ends the rank at the timeout.
    match status {
        Some(1) => assert!(
            stderr.contains("error: rank 0 of 2: MLX: [ring] connection to a peer was lost"),
            "{stderr}"
        ),
        Some(75) => assert!(
            stderr.contains("error: rank 0 of 2: no training progress for 20 s"),
            "{stderr}"
        ),
        other => panic!("rank 0 ended with {other:?}:\n{stderr}"),
    }
}

#[test]
fn a_rank_that_stops_responding_ends_the_other_at_the_timeout() {
    let mut ranks = Ranks::start("10");
    ranks.signal(1, "-STOP");
    let (status, stderr) = ranks.rank_0_ends(Duration::from_secs(120));
    assert_eq!(status, Some(75), "{stderr}");
    assert!(
        stderr.contains(
            "error: rank 0 of 2: no training progress for 10 s (the distributed timeout, \
             LMX_DISTRIBUTED_TIMEOUT); another rank has most likely failed, so this one stops"
        ),
        "{stderr}"
    );
}

#[test]
fn an_interrupted_launch_stops_every_rank_after_the_same_step_with_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let launch = Command::new(env!("CARGO_BIN_EXE_lmx"))
        .args(["launch", "-n", "2", "--", "train", "--steps", "100000"])
        .args(COMMON)
        .args(["0", "--out", run.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while losses_so_far(&run) < 2 {
        assert!(started.elapsed() < Duration::from_secs(300), "no progress");
        std::thread::sleep(Duration::from_millis(100));
    }
    let pid = launch.id().to_string();
    assert!(Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    let output = launch.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("error: the ranks stopped on signal 2"),
        "{stdout}\n{stderr}"
    );
    let steps = losses(&run).len() as u64;
    assert!(checkpoint(&run, steps).is_dir(), "{stdout}\n{stderr}");
    // Both ranks stopped at that step: neither met a collective the other never joined.
    assert!(
        !stderr.contains("connection to a peer was lost"),
        "{stderr}"
    );
    assert!(!stderr.contains("rank 1 exited"), "{stderr}");
}
