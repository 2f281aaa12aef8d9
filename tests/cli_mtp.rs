//! Multi-token prediction on a bundled model: Llama's split of its forward pass into hidden
//! states and output head is its forward pass (tied and untied), and `lmx train --step mtp`
//! trains the heads, records them in run.json, resumes exactly, samples with the model alone,
//! and refuses wrong flags naming them.

use crate::support::cli;
use lmx::models::llama;
use lmx::runtime::model::LanguageModel;
use lmx::runtime::objectives::check_backbone;
use lmx::runtime::Array;
use std::path::Path;

use cli::{failed, lmx, succeeded, text};

#[test]
fn llama_splits_its_forward_pass_at_the_output_head() {
    let tokens = Array::from_slice(&[3, 14, 15, 92, 65, 35, 89, 79], &[2, 4]);
    for preset in ["tiny", "tiny-llama3"] {
        let config = llama::Llama::preset(preset).unwrap();
        let params = llama::Llama::init(&config, 5).unwrap();
        let error = check_backbone::<llama::Llama>(&params, &config, &tokens).unwrap();
        assert_eq!(error, 0.0, "{preset} (tie: {})", config.tie);
    }
}

/// The step records of `RUN/metrics.jsonl`.
fn steps(run: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .filter(|value| value["kind"] == "step")
        .collect()
}

const MODEL: [&str; 6] = ["--model", "llama", "--preset", "tiny", "--set", "vocab=257"];

#[test]
fn train_step_mtp_trains_the_heads_and_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("mtp");
    let out = run.display().to_string();
    let mut args = vec!["train"];
    args.extend(MODEL);
    args.extend([
        "--step",
        "mtp",
        "--n-predict",
        "3",
        "--mtp-weight",
        "0.5",
        "--steps",
        "8",
        "--checkpoint-every",
        "4",
        "--batch-size",
        "4",
        "--seq-len",
        "24",
        "--quiet",
        "--sample",
        "0",
        "--out",
        &out,
    ]);
    let stderr = succeeded(&lmx(&args));
    assert!(
        stderr.contains("metrics main_loss, mtp_loss, mtp_loss_1, mtp_loss_2, mtp_loss_3"),
        "{stderr}"
    );
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("run.json")).unwrap()).unwrap();
    assert_eq!(record["objective"], serde_json::json!({"kind": "mtp"}));
    assert_eq!(record["model_config"]["n_predict"], 3);
    assert_eq!(record["model_config"]["mtp_weight"], 0.5);
    let whole = steps(&run);
    assert_eq!(whole.len(), 8);
    for step in &whole {
        let get = |key: &str| {
            step[key]
                .as_f64()
                .unwrap_or_else(|| panic!("{key}: {step}"))
        };
        let heads = (get("mtp_loss_1") + get("mtp_loss_2") + get("mtp_loss_3")) / 3.0;
        assert!((get("mtp_loss") - heads).abs() < 1e-5, "{step}");
        assert!(
            (get("loss") - (get("main_loss") + 0.5 * heads)).abs() < 1e-4,
            "{step}"
        );
    }

    // Continued from step 4 (the run's recorded objective and heads), the same losses.
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
    let again = steps(&run);
    for key in ["loss", "main_loss", "mtp_loss_1", "mtp_loss_3"] {
        let series = |records: &[serde_json::Value]| -> Vec<u64> {
            records
                .iter()
                .map(|r| r[key].as_f64().unwrap().to_bits())
                .collect()
        };
        assert_eq!(series(&again), series(&whole), "{key}");
    }

    // The checkpoint's model decodes alone: the heads are not read.
    let generated = lmx(&[
        "generate",
        "--run",
        &out,
        "--prompt",
        "ROMEO:",
        "--max-tokens",
        "8",
        "--temperature",
        "0",
    ]);
    succeeded(&generated);
    assert!(text(&generated.stdout).starts_with("ROMEO:"));
}

#[test]
fn wrong_multi_token_flags_are_refused_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run").display().to_string();
    let refused = |model: &[&str], flags: &[&str]| {
        let mut args = vec!["train", "--steps", "1", "--quiet", "--out", &out];
        args.extend(model);
        args.extend(flags);
        failed(&lmx(&args))
    };
    assert_eq!(
        refused(&MODEL, &["--n-predict", "2"]),
        "error: --n-predict and --mtp-weight apply to --step mtp\n"
    );
    assert_eq!(
        refused(&MODEL, &["--step", "mtp", "--teacher", "t"]),
        "error: --teacher distils from a teacher, --step mtp trains the model with multi-token \
         heads: give one of them\n"
    );
    assert_eq!(
        refused(&MODEL, &["--step", "mtp", "--n-predict", "0"]),
        "error: configuration: n_predict = 0: multi-token prediction takes 1 to 8 heads\n"
    );
    assert_eq!(
        refused(&MODEL, &["--step", "mtp", "--mtp-weight=-1"]),
        "error: configuration: mtp_weight = -1: the heads' weight is a finite number of at \
         least 0\n"
    );
    assert_eq!(
        refused(&["--preset", "tiny-bytes"], &["--step", "mtp"]),
        "error: gpt2 does not expose its hidden states, embedding and output head to \
         multi-token heads (--step mtp): its program implements \
         lmx::runtime::objectives::Backbone for it and registers it with \
         Registry::multi_token\n"
    );
}
