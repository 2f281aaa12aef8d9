//! `lmx lora`, `lmx generate --adapter` and `lmx fuse` end to end: adapters trained on a trained
//! base run, then the base with the adapters loaded, the LoRA run itself and the fused model
//! all decode the same greedy text, which the base alone does not; the base's checkpoint is
//! untouched, and the adapters folder is mlx-lm's.

use crate::support::cli::{lmx, ok};
use std::path::Path;

fn greedy(run: &Path, adapter: Option<&Path>) -> String {
    let mut args = vec![
        "generate",
        "--run",
        run.to_str().unwrap(),
        "--max-tokens",
        "24",
        "--temperature",
        "0",
    ];
    if let Some(adapter) = adapter {
        args.extend(["--adapter", adapter.to_str().unwrap()]);
    }
    ok(&args)
}

#[test]
fn lora_generate_with_adapter_and_fuse() {
    let dir = tempfile::tempdir().unwrap();
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/data/shakespeare.txt");
    let (base, lora, fused) = (
        dir.path().join("base"),
        dir.path().join("lora"),
        dir.path().join("fused"),
    );
    let common = [
        "--batch-size",
        "4",
        "--seq-len",
        "32",
        "--quiet",
        "--sample",
        "0",
        "--data",
        data,
    ];
    let s = |path: &Path| path.to_str().unwrap().to_owned();
    ok(&[
        &[
            "train",
            "--preset",
            "tiny-bytes",
            "--steps",
            "10",
            "--out",
            &s(&base),
        ][..],
        &common,
    ]
    .concat());
    let base_model = base.join("checkpoints/step-000010/model.safetensors");
    let before = std::fs::read(&base_model).unwrap();
    // Refused once its run directory is locked (the model has one block): the folder it made
    // goes with it.
    let refused = dir.path().join("refused");
    let output = lmx(&[
        &["lora", "--base", &s(&base), "--num-layers", "16"][..],
        &["--steps", "1", "--out", &s(&refused)],
        &common,
    ]
    .concat());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("num_layers is 16, but the model has 1"),
        "{stderr}"
    );
    assert!(!refused.exists(), "a refused run leaves no folder");
    let output = lmx(&[
        &[
            "lora",
            "--base",
            &s(&base),
            "--num-layers",
            "-1",
            "--rank",
            "4",
            "--lr",
            "1e-2",
        ][..],
        &["--steps", "10", "--out", &s(&lora)],
        &common,
    ]
    .concat());
    assert!(output.status.success(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    // GPT-2 at tiny-bytes: one block, four linear layers of d_model 32 at rank 4.
    assert!(
        stderr.contains("trainable parameters 2,048 (8.163% of 25,088), frozen 23,040, optimizer state 16.0 KiB"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read(&base_model).unwrap(),
        before,
        "the base run is untouched"
    );
    let adapters = lora.join("adapters");
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(adapters.join("adapter_config.json")).unwrap())
            .unwrap();
    assert_eq!(
        config,
        serde_json::json!({
            "fine_tune_type": "lora",
            "num_layers": -1,
            "lora_parameters": {"rank": 4, "scale": 20.0, "dropout": 0.0}
        })
    );
    assert!(adapters.join("adapters.safetensors").is_file());

    let adapted = greedy(&base, Some(&adapters));
    assert_eq!(greedy(&lora, None), adapted);
    // The LoRA run's checkpoint holds these adapters already: a second copy, or any other adapter
    // folder (here one that does not exist), is refused, saying so.
    for folder in [adapters.clone(), lora.join("no-such-adapters")] {
        let twice = lmx(&[
            "generate",
            "--run",
            &s(&lora),
            "--adapter",
            &s(&folder),
            "--prompt",
            "a",
            "--max-tokens",
            "1",
        ]);
        assert!(!twice.status.success());
        assert_eq!(
            String::from_utf8_lossy(&twice.stderr).trim(),
            format!(
                "error: {} is a LoRA run's, which holds its adapters already: leave out --adapter \
                 to use them, or fuse them first (`lmx fuse`) to add others over them",
                lora.join("checkpoints/step-000010").display(),
            )
        );
    }
    ok(&["fuse", "--run", &s(&lora), "--out", &s(&fused)]);
    assert_eq!(greedy(&fused, None), adapted);
    assert_ne!(
        greedy(&base, None),
        adapted,
        "the adapters changed the model"
    );

    let refused = lmx(&[
        "fuse",
        "--run",
        &s(&base),
        "--out",
        &s(&dir.path().join("none")),
    ]);
    assert!(!refused.status.success());
    assert_eq!(
        String::from_utf8_lossy(&refused.stderr).trim(),
        format!(
            "error: {} has no adapters to fuse: give --adapter DIR, or the run of `lmx lora`",
            base.join("checkpoints/step-000010").display()
        )
    );
    let full = lmx(&[
        &[
            "lora",
            "--base",
            &s(&base),
            "--fine-tune-type",
            "full",
            "--out",
            &s(&dir.path().join("d")),
        ][..],
        &common,
    ]
    .concat());
    assert!(!full.status.success());
    assert!(
        String::from_utf8_lossy(&full.stderr).contains(
            "`full` is not an adapter kind: `lora` or `dora` (mlx-lm's `full` trains the whole \
             model: use `lmx train`)"
        ),
        "{full:?}"
    );
}

/// The validation losses of a run, in order, from its `metrics.jsonl`.
fn val_losses(run: &Path) -> Vec<f64> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .filter_map(|entry| entry["val_loss"].as_f64())
        .collect()
}

/// The end-to-end path at tiny size: a Hugging Face folder (`--model DIR`, read as
/// `--init DIR`), adapters trained
/// on the bundled supervised examples with the loss on completions only, the validation loss
/// falling, then a fused run, an exported folder, and that folder loaded again: it decodes what
/// the LoRA run does.
#[test]
fn lora_on_a_folder_with_supervised_examples_fuses_and_exports() {
    let dir = tempfile::tempdir().unwrap();
    let folder = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/hf/llama");
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/data/sft");
    let s = |name: &str| dir.path().join(name).to_str().unwrap().to_owned();
    let output = lmx(&[
        "lora",
        "--model",
        folder,
        "--num-layers",
        "1",
        "--keys",
        "self_attn.q_proj,mlp.down_proj",
        "--rank",
        "4",
        "--steps",
        "30",
        "--lr",
        "0.01",
        "--warmup",
        "0",
        "--eval-every",
        "10",
        "--batch-size",
        "4",
        "--seq-len",
        "48",
        "--mask-prompt",
        "--quiet",
        "--sample",
        "0",
        "--data",
        data,
        "--out",
        &s("lora"),
    ]);
    assert!(output.status.success(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    // The fixture's LLaMA: hidden size 32, intermediate size 64; rank 4 on q_proj (32 -> 32)
    // and down_proj (64 -> 32) of the last block.
    let trainable = 4 * (32 + 32) + 4 * (64 + 32);
    assert!(
        stderr.contains(&format!("trainable parameters {trainable} (")),
        "{stderr}"
    );
    let losses = val_losses(s("lora").as_ref());
    assert!(losses.len() >= 2, "{losses:?}");
    assert!(
        losses.last().unwrap() < &(losses[0] - 0.1),
        "the validation loss does not fall: {losses:?}"
    );
    ok(&["fuse", "--run", &s("lora"), "--out", &s("fused")]);
    ok(&["export", "--run", &s("fused"), "--out", &s("exported")]);
    let greedy_of = |flag: &str, target: &str| {
        ok(&[
            "generate",
            flag,
            target,
            "--prompt",
            "Double 3.\n",
            "--max-tokens",
            "12",
            "--temperature",
            "0",
        ])
    };
    assert_eq!(
        greedy_of("--model", &s("exported")),
        greedy_of("--run", &s("lora"))
    );
}

/// QLoRA from the command line: adapters over a folder quantized by `lmx quantize` train, and
/// the run is read back with its packed layers (generation, evaluation, fusing). The fused
/// layers are quantized again, as mlx-lm fuses, so the fused run's text may differ from the
/// LoRA run's on this random model; both decode.
#[test]
fn lora_over_a_quantized_folder_trains_and_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let folder = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/hf/llama");
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/data/sft");
    let s = |name: &str| dir.path().join(name).to_str().unwrap().to_owned();
    ok(&[
        "quantize",
        "--model",
        folder,
        "--bits",
        "4",
        "--group-size",
        "32",
        "--out",
        &s("q4"),
    ]);
    ok(&[
        "lora",
        "--init",
        &s("q4"),
        "--rank",
        "4",
        "--num-layers",
        "-1",
        "--steps",
        "6",
        "--lr",
        "0.01",
        "--batch-size",
        "4",
        "--seq-len",
        "48",
        "--mask-prompt",
        "--quiet",
        "--data",
        data,
        "--out",
        &s("qlora"),
    ]);
    let eval = ok(&["eval", "--run", &s("qlora")]);
    assert!(eval.contains("perplexity"), "{eval}");
    ok(&["fuse", "--run", &s("qlora"), "--out", &s("fused")]);
    let greedy_of = |run: &str| {
        ok(&[
            "generate",
            "--run",
            run,
            "--prompt",
            "Double 3.\n",
            "--max-tokens",
            "8",
            "--temperature",
            "0",
        ])
    };
    for run in [s("qlora"), s("fused")] {
        assert!(greedy_of(&run).starts_with("Double 3.\n"), "{run}");
    }
}

/// A LoRA run continued from its middle checkpoint ends with the adapters, bit for bit, of the
/// uninterrupted run: the checkpoints carry the adapters and their optimizer state, the resumed
/// run rebuilds the adapted tree from `run.json`, and the adapters' dropout draws its masks from
/// the step's key, which the checkpoint holds. (DoRA adapters, whose magnitudes train too.)
#[test]
fn a_resumed_lora_run_ends_with_the_same_adapters() {
    let dir = tempfile::tempdir().unwrap();
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/data/shakespeare.txt");
    let run = dir.path().join("run");
    let run_arg = run.to_str().unwrap();
    ok(&[
        "lora",
        "--preset",
        "tiny-bytes",
        "--num-layers",
        "1",
        "--rank",
        "2",
        "--lora-dropout",
        "0.25",
        "--fine-tune-type",
        "dora",
        "--steps",
        "6",
        "--checkpoint-every",
        "3",
        "--batch-size",
        "2",
        "--seq-len",
        "16",
        "--quiet",
        "--sample",
        "0",
        "--data",
        data,
        "--out",
        run_arg,
    ]);
    let adapters = run.join("adapters/adapters.safetensors");
    let uninterrupted = std::fs::read(&adapters).unwrap();
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(run.join("adapters/adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(config["fine_tune_type"], "dora");
    assert_eq!(config["lora_parameters"]["dropout"], 0.25);
    std::fs::remove_dir_all(run.join("adapters")).unwrap();
    let middle = run.join("checkpoints/step-000003");
    ok(&[
        "lora",
        "--preset",
        "tiny-bytes",
        // The adapters' settings are the recorded ones.
        "--resume-from",
        middle.to_str().unwrap(),
        "--quiet",
        "--sample",
        "0",
        "--out",
        run_arg,
    ]);
    assert_eq!(std::fs::read(&adapters).unwrap(), uninterrupted);
    // Other adapters would be another run.
    let changed = lmx(&[
        "lora",
        "--preset",
        "tiny-bytes",
        "--resume",
        "--fine-tune-type",
        "lora",
        "--dropout",
        "0.5",
        "--quiet",
        "--out",
        run_arg,
    ]);
    assert_eq!(
        String::from_utf8_lossy(&changed.stderr),
        format!(
            "error: resuming would change the run in {}:\n  \
             lora.fine_tune_type: dora -> lora\n  \
             lora.parameters.dropout: 0.25 -> 0.5\n\
             leave these settings out to continue the run as recorded, or give --allow-changes\n",
            run.display()
        )
    );
}

/// A LoRA run over a Hugging Face folder checkpoints its adapters alone, with their optimizer
/// state: the frozen base is the folder's, read from it again to resume (bit for bit the
/// uninterrupted run's adapters) and to decode, and refused once the folder's weights change.
/// (DoRA adapters with dropout: their magnitudes are adapters too, and the masks follow the
/// step's key.)
#[test]
fn a_lora_run_over_a_folder_checkpoints_its_adapters_alone() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/llama");
    let base = dir.path().join("base");
    std::fs::create_dir(&base).unwrap();
    for entry in std::fs::read_dir(&fixture).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, base.join(path.file_name().unwrap())).unwrap();
    }
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/data/shakespeare.txt");
    let run = dir.path().join("run");
    let (base_arg, run_arg) = (base.to_str().unwrap(), run.to_str().unwrap());
    ok(&[
        "lora",
        "--model",
        base_arg,
        "--num-layers",
        "1",
        "--rank",
        "2",
        "--lora-dropout",
        "0.25",
        "--fine-tune-type",
        "dora",
        "--steps",
        "6",
        "--checkpoint-every",
        "3",
        "--batch-size",
        "2",
        "--seq-len",
        "16",
        "--quiet",
        "--sample",
        "0",
        "--data",
        data,
        "--out",
        run_arg,
    ]);
    let saved = lmx::runtime::hf::Weights::open(&run.join("checkpoints/step-000006")).unwrap();
    let names: Vec<&str> = saved.names().collect();
    assert!(!names.is_empty());
    assert!(
        names.iter().all(|name| [".lora_a", ".lora_b", ".m"]
            .iter()
            .any(|leaf| name.ends_with(leaf))),
        "{names:?}"
    );
    let decoded = greedy(&run, None);

    let adapters = run.join("adapters/adapters.safetensors");
    let uninterrupted = std::fs::read(&adapters).unwrap();
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(run.join("adapters/adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(config["fine_tune_type"], "dora");
    assert_eq!(config["lora_parameters"]["dropout"], 0.25);
    std::fs::remove_dir_all(run.join("adapters")).unwrap();
    let middle = run.join("checkpoints/step-000003");
    let resume = [
        "lora",
        "--model",
        base_arg,
        "--resume-from",
        middle.to_str().unwrap(),
        "--quiet",
        "--sample",
        "0",
        "--out",
        run_arg,
    ];
    ok(&resume);
    assert_eq!(std::fs::read(&adapters).unwrap(), uninterrupted);
    assert_eq!(greedy(&run, None), decoded);

    // The first stored value of the base changes: its fingerprint does.
    let weights = base.join("model.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    bytes[8 + header] ^= 1;
    std::fs::write(&weights, bytes).unwrap();
    let output = lmx(&["generate", "--run", run_arg, "--max-tokens", "2"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains(&format!(
            "the weights of {base_arg} changed since the run started from them"
        )),
        "{stderr}"
    );
    let output = lmx(&resume);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("init_weights: "), "{stderr}");
}
