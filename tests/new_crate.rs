//! A crate of one's own, as a user makes it: `lmx new` into a folder outside the workspace (with a
//! path dependency on this checkout), a model of its own added beside the template's, `cargo
//! build` (sharing this workspace's target folder, so that only lmx's own packages build anew,
//! once), and through the crate's binary each model trains a few steps, saves, resumes,
//! generates, quantizes into a run that generates, and trains adapters over that.

use std::path::{Path, PathBuf};
use std::process::Command;

/// What the test adds to the new crate for one more model: its files and how `main.rs`
/// registers it. Another kind of model (one under `#[lmx::model]`) is one more entry.
struct Addition {
    /// The model's name, as `--model` gives it.
    name: &'static str,
    /// `(path in the crate, contents)`.
    files: &'static [(&'static str, &'static str)],
    /// The registration added to `main.rs`'s `Registry` chain.
    register: &'static str,
    /// A module of Rust source the crate declares in `main.rs`, if the model is written in Rust.
    module: Option<&'static str>,
}

const ADDITIONS: &[Addition] = &[
    Addition {
        name: "gated_mixer",
        files: &[("models/gated_mixer.lmx", GATED_MIXER)],
        register: ".model::<models::gated_mixer::Train>()",
        module: None,
    },
    Addition {
        name: "causal_mixer",
        files: &[("src/causal_mixer.rs", CAUSAL_MIXER)],
        register: ".model::<causal_mixer::Train>()",
        module: Some("causal_mixer"),
    },
];

/// A model of the crate's own written in Rust under `#[lmx::model]` and `#[lmx::step]`: one
/// causal attention layer over learned positions with a feed-forward, an untied head. Its
/// configuration derives serde through lmx (the crate names no other dependency).
const CAUSAL_MIXER: &str = r#"//! One attention layer and a feed-forward, written in Rust.

use lmx::runtime::nn::init::{self, Keys};
use lmx::runtime::nn::{EmbeddingParams, LayerNormParams, LinearParams};
use lmx::runtime::optim::AdamW;
use lmx::runtime::tensor::nn::{
    cross_entropy, embedding, gelu_tanh, layer_norm, linear, merge_heads, split_heads,
};
use lmx::runtime::tensor::{Context, Tensor};
use lmx::runtime::{Error, Result};

/// The mixer's sizes.
#[derive(Clone, Debug, lmx::serde::Serialize, lmx::serde::Deserialize)]
#[serde(crate = "lmx::serde")]
pub struct MixerConfig {
    vocab: i32,
    dim: i32,
    heads: i32,
    context: i32,
}

impl MixerConfig {
    fn tiny() -> MixerConfig {
        MixerConfig { vocab: 257, dim: 16, heads: 2, context: 64 }
    }

    fn check(&self) -> Result<()> {
        if self.heads < 1 || self.dim % self.heads != 0 {
            return Err(Error::Config(format!("`heads` ({}) must divide `dim` ({})", self.heads, self.dim)));
        }
        Ok(())
    }
}

/// Token and position embeddings, one attention layer, a feed-forward and a head.
#[lmx::model(
    config = MixerConfig,
    init = CausalMixer::build,
    forward = mix,
    vocab_size = vocab,
    context_len = context,
    presets(tiny = MixerConfig::tiny()),
    validate = MixerConfig::check,
)]
pub struct CausalMixer {
    tokens: EmbeddingParams,
    positions: EmbeddingParams,
    norm: LayerNormParams,
    qkv: LinearParams,
    out: LinearParams,
    up: LinearParams,
    down: LinearParams,
    head: LinearParams,
}

impl CausalMixer {
    fn build(config: &MixerConfig, keys: &mut Keys) -> Result<CausalMixer> {
        let d = config.dim;
        Ok(CausalMixer {
            tokens: init::embedding(config.vocab, d, keys)?,
            positions: init::embedding(config.context, d, keys)?,
            norm: init::layer_norm(d, true)?,
            qkv: init::linear(d, 3 * d, false, keys)?,
            out: init::linear(d, d, false, keys)?,
            up: init::linear(d, 2 * d, true, keys)?,
            down: init::linear(2 * d, d, true, keys)?,
            head: init::linear(d, config.vocab, false, keys)?,
        })
    }
}

fn mix(params: &CausalMixer<Tensor>, tokens: &Tensor, config: &MixerConfig, ctx: &mut Context) -> Result<Tensor> {
    let at = Tensor::arange(&ctx.offset(), tokens.dim(-1))?;
    let h = embedding(&params.tokens, tokens)?.add(&embedding(&params.positions, &at)?)?;
    let x = layer_norm(&params.norm, &h, 1e-5)?;
    let [q, k, v] = linear(&params.qkv, &x)?.split(-1)?;
    let (q, k, v) = (split_heads(&q, config.heads)?, split_heads(&k, config.heads)?, split_heads(&v, config.heads)?);
    let h = h.add(&linear(&params.out, &merge_heads(&ctx.attend(&q, &k, &v)?)?)?)?;
    let h = h.add(&linear(&params.down, &gelu_tanh(&linear(&params.up, &h)?)?)?)?;
    linear(&params.head, &h)
}

/// The next-token loss.
#[lmx::step(optimizer = AdamW { weight_decay: 0.0, ..AdamW::default() }, clip_norm = 1.0)]
pub fn train(params: &CausalMixer<Tensor>, tokens: &Tensor, targets: &Tensor, config: &MixerConfig, ctx: &mut Context) -> Result<Tensor> {
    cross_entropy(&mix(params, tokens, config, ctx)?, targets)
}
"#;

/// A model of the crate's own, unlike the template and the bundled models: no attention, each
/// position mixed with the previous one's embedding through a sigmoid-gated feed-forward.
const GATED_MIXER: &str = r#"// A gated feed-forward over each token and its predecessor: a bigram model with depth.
model GatedMixer {
    config {
        vocab: int = 257
        d_model: int = 64
        n_layers: int = 2
        eps: float = 1e-5
        d_ff = 2 * d_model
    }

    preset tiny { d_model = 16, n_layers = 1 }

    block Gated {
        params {
            norm: rms_norm(d_model, eps = eps)
            gate: linear(d_model, d_ff, bias = false)
            up: linear(d_model, d_ff, bias = false)
            down: linear(d_ff, d_model, bias = false)
        }
        forward(x: [B, T, d_model]) -> [B, T, d_model] {
            let h = norm(x)
            x + down(sigmoid(gate(h)) * up(h))
        }
    }

    // The predecessor's embedding stays as initialised: no gradient, no optimizer state.
    params {
        embed: embedding(vocab, d_model)
        frozen previous: embedding(vocab, d_model)
        layers: [Gated; n_layers]
        norm: rms_norm(d_model, eps = eps)
        head: linear(d_model, vocab, bias = false)
    }

    forward(tokens: [B, T] int) -> [B, T, vocab] {
        let shifted = concat([tokens[:, 0:1], tokens[:, 0:T - 1]], axis = 1)
        let x = embed(tokens) + previous(shifted)
        for layer in layers {
            x = layer(x)
        }
        head(norm(x))
    }

    step train(tokens: [B, T] int, targets: [B, T] int) {
        optimizer adamw(beta1 = 0.9, beta2 = 0.99, eps = 1e-8, weight_decay = 0.0)
        let loss = cross_entropy(forward(tokens), targets)
        let grads = grad(loss)
        update grads
        metrics loss
    }

    // A second step, trained by name (`--step dpo`) with no edit of main.rs: DPO against a frozen
    // copy of the model as the run starts, over preference pairs (each row chosen then rejected).
    step dpo(tokens: [B, T] int, targets: [B, T] int) {
        optimizer adamw(beta1 = 0.9, beta2 = 0.99, eps = 1e-8, weight_decay = 0.0)
        frozen reference = policy
        let chosen, rejected = split(tokens, 2)
        let chosen_next, rejected_next = split(targets, 2)
        let rows = concat([chosen, rejected], axis = 0)
        let next = concat([chosen_next, rejected_next], axis = 0)
        let kept = as_float(next >= 0)
        let picked = expand_dims(maximum(next, 0), -1)
        let policy = sum(squeeze(take_along_axis(log_softmax(forward(rows)), picked), -1) * kept, axis = -1)
        let frozen = sum(squeeze(take_along_axis(log_softmax(reference(rows)), picked), -1) * kept, axis = -1)
        let policy_chosen, policy_rejected = split(policy, 2)
        let frozen_chosen, frozen_rejected = split(frozen, 2)
        let margin = 0.2 * ((policy_chosen - frozen_chosen) - (policy_rejected - frozen_rejected))
        let loss = mean(softplus(-margin))
        let reward_margin = mean(margin)
        update grad(loss)
        metrics loss, reward_margin
    }
}
"#;

/// Runs `command`, failing the test with its output unless it succeeds; its standard output.
fn run(command: &mut Command) -> String {
    let output = command.output().expect("the command runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{command:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// This workspace's target folder (the `lmx` binary's grandparent: `TARGET/debug/lmx`).
fn target_dir() -> PathBuf {
    let lmx = Path::new(env!("CARGO_BIN_EXE_lmx"));
    lmx.parent().and_then(Path::parent).unwrap().to_owned()
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
fn a_new_crate_builds_and_each_of_its_models_trains_resumes_and_generates() {
    let outside = tempfile::tempdir().unwrap();
    let krate = outside.path().join("my-models");
    let created = run(Command::new(env!("CARGO_BIN_EXE_lmx"))
        .arg("new")
        .arg(&krate)
        .arg("--lmx-path")
        .arg(env!("CARGO_MANIFEST_DIR")));
    assert!(created.contains("models/my_models.lmx"), "{created}");
    let manifest = std::fs::read_to_string(krate.join("Cargo.toml")).unwrap();
    let dependencies: Vec<&str> = manifest
        .lines()
        .filter(|line| line.contains("{ path ="))
        .map(|line| line.split(' ').next().unwrap())
        .collect();
    assert_eq!(
        dependencies,
        ["lmx", "lmx", "mlx-sys"],
        "lmx, as a dependency and a build-dependency, and the mlx-sys patch: {manifest}"
    );

    let main_rs = krate.join("src/main.rs");
    let mut main = std::fs::read_to_string(&main_rs).unwrap();
    for addition in ADDITIONS {
        for (path, contents) in addition.files {
            std::fs::write(krate.join(path), contents).unwrap();
        }
        if let Some(module) = addition.module {
            let at = main.find("fn main()").expect("main.rs has a main function");
            main.insert_str(at, &format!("mod {module};\n\n"));
        }
        let at = main
            .find("        .main()")
            .expect("main.rs ends its chain with .main()");
        main.insert_str(at, &format!("        {}\n", addition.register));
    }
    std::fs::write(&main_rs, main).unwrap();

    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let target = target_dir();
    run(Command::new(cargo)
        .arg("build")
        .arg("--manifest-path")
        .arg(krate.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target));
    let binary = target.join("debug").join("my-models");

    let listed = run(Command::new(&binary).arg("models"));
    let models: Vec<&str> = ["my_models"]
        .into_iter()
        .chain(ADDITIONS.iter().map(|addition| addition.name))
        .collect();
    for model in &models {
        assert!(listed.contains(model), "{listed}");
    }

    for model in models {
        let out = krate.join("runs").join(model);
        let train = |steps: &str, more: &[&str]| {
            run(Command::new(&binary)
                .current_dir(&krate)
                .args(["train", "--model", model, "--preset", "tiny"])
                .args([
                    "--tokenizer",
                    "byte",
                    "--batch-size",
                    "2",
                    "--seq-len",
                    "16",
                ])
                .args(["--checkpoint-every", "2", "--quiet", "--sample", "0"])
                .args(["--steps", steps, "--out"])
                .arg(&out)
                .args(more))
        };
        let trained = train("2", &[]);
        assert!(
            trained.contains(&format!("trained {model} to step 2")),
            "{trained}"
        );
        assert!(out
            .join("checkpoints/step-000002/model.safetensors")
            .is_file());
        let resumed = train("4", &["--resume", "--allow-changes"]);
        assert!(
            resumed.contains(&format!("trained {model} to step 4")),
            "{resumed}"
        );
        assert_eq!(steps_logged(&out), [1, 2, 3, 4], "{model}");
        if model == "gated_mixer" {
            // `frozen previous`: the same at steps 2 and 4, where a trained table moved.
            let at = |step: &str, name: &str| {
                let file = out.join(format!("checkpoints/step-00000{step}/model.safetensors"));
                let bytes = std::fs::read(file).unwrap();
                let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
                tensors.tensor(name).unwrap().data().to_vec()
            };
            assert_eq!(at("2", "previous.weight"), at("4", "previous.weight"));
            assert_ne!(at("2", "embed.weight"), at("4", "embed.weight"));
        }

        // Quantized into a run of its own, and adapters trained over that: the three runs
        // generate.
        let quantized = krate.join("runs").join(format!("{model}-q8"));
        let said = run(Command::new(&binary)
            .current_dir(&krate)
            .args(["quantize", "--bits", "8", "--group-size", "32", "--model"])
            .arg(&out)
            .arg("--out")
            .arg(&quantized));
        assert!(said.contains("quantized to 8 bits"), "{model}: {said}");
        let record = std::fs::read_to_string(quantized.join("run.json")).unwrap();
        assert!(record.contains("\"quantization\""), "{model}: {record}");
        let adapted = krate.join("runs").join(format!("{model}-qlora"));
        let lora = |keys: &[&str]| {
            Command::new(&binary)
                .current_dir(&krate)
                .args(["lora", "--rank", "2", "--num-layers", "-1", "--base"])
                .arg(&quantized)
                .args([
                    "--batch-size",
                    "2",
                    "--seq-len",
                    "16",
                    "--steps",
                    "2",
                    "--quiet",
                ])
                .args(["--sample", "0", "--out"])
                .arg(&adapted)
                .args(keys)
                .output()
                .unwrap()
        };
        if model == "causal_mixer" {
            // Its layers are not in a list of blocks, where the default adapters go: refused,
            // naming them, before any step.
            let refused = lora(&[]);
            let stderr = String::from_utf8_lossy(&refused.stderr);
            assert!(
                !refused.status.success()
                    && stderr.contains("no layer takes an adapter")
                    && stderr.contains("qkv, out, up, down, head"),
                "{stderr}"
            );
            assert!(!adapted.join("checkpoints").exists(), "{model}");
        }
        let keys: &[&str] = match model {
            "causal_mixer" => &["--keys", "qkv,out,up,down"],
            _ => &[],
        };
        let adapters = lora(keys);
        assert!(
            adapters.status.success(),
            "{model}: {}",
            String::from_utf8_lossy(&adapters.stderr)
        );
        for sampled in [&out, &quantized, &adapted] {
            let generated = run(Command::new(&binary)
                .current_dir(&krate)
                .args([
                    "generate",
                    "--prompt",
                    "ROMEO:",
                    "--max-tokens",
                    "8",
                    "--run",
                ])
                .arg(sampled));
            assert!(generated.starts_with("ROMEO:"), "{model}: {generated}");
        }
    }

    // The file's second step trains by name, with its frozen reference and its metric.
    let pairs: String = (0..6)
        .map(|i| {
            let line = serde_json::json!({"prompt": format!("line {i}"), "chosen": " yes",
                                          "rejected": " no!"});
            format!("{line}\n")
        })
        .collect();
    std::fs::write(krate.join("prefs.jsonl"), pairs).unwrap();
    let out = krate.join("runs/gated_mixer-dpo");
    run(Command::new(&binary)
        .current_dir(&krate)
        .args([
            "train",
            "--model",
            "gated_mixer",
            "--preset",
            "tiny",
            "--step",
            "dpo",
        ])
        .args([
            "--data",
            "prefs.jsonl",
            "--tokenizer",
            "byte",
            "--batch-size",
            "2",
        ])
        .args([
            "--seq-len",
            "12",
            "--steps",
            "2",
            "--quiet",
            "--sample",
            "0",
            "--out",
        ])
        .arg(&out));
    let first: serde_json::Value = serde_json::from_str(
        std::fs::read_to_string(out.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    // The policy starts as its reference.
    assert_eq!(first["reward_margin"], 0.0, "{first}");
    let checked = run(Command::new(&binary)
        .current_dir(&krate)
        .args(["check", "models/gated_mixer.lmx"]));
    assert!(
        checked.contains(
            "  dpo (frozen reference; metrics reward_margin): lmx train --model \
             models/gated_mixer.lmx --step dpo --data PAIRS.jsonl"
        ),
        "{checked}"
    );
}
