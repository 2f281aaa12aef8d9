//! `lmx quantize`: a model folder, a run or a checkpoint quantized into mlx-lm's layout, which lmx
//! loads back quantized and generates from, with the bytes before and after reported; dequantized
//! back with `--dequantize`; unsupported settings fail naming the flag's value
//! before any work, and nothing is written.

use crate::support::cli::{lmx, ok};
use crate::support::reference::assert_same_tensors;
use lmx::models::llama::Llama;
use lmx::runtime::data::{HfTokenizer, Tokenizer};
use lmx::runtime::generate::{generate, Sampling};
use lmx::runtime::hf::{self, HfFolder};
use lmx::runtime::mlx_rs::Dtype;
use lmx::runtime::nn::Quantization;
use std::path::PathBuf;

/// The standard error of `lmx ARGS`, which must fail.
fn fails(args: &[&str]) -> String {
    let output = lmx(args);
    assert!(!output.status.success(), "lmx {args:?} succeeded");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn llama() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf/llama")
        .display()
        .to_string()
}

#[test]
fn a_folder_quantizes_into_mlx_lm_layout_and_loads_back_quantized() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("llama-4bit");
    let output = lmx(&[
        "quantize",
        "--model",
        &llama(),
        "--bits",
        "4",
        "--group-size",
        "32",
        "--out",
        out.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // 2 layers of 7 linear layers, the embedding and the head: every row is 32 or 64 wide.
    assert!(
        stdout.contains("16 layers quantized to 4 bits in groups of 32"),
        "{stdout}"
    );
    // 37,024 parameters in float16; after: 36,864 packed at 4 bits, a float16 scale and offset
    // per 32 of them, and 160 norm weights in float16.
    let after = 36_864 / 2 + 36_864 / 32 * 2 * 2 + 160 * 2;
    assert!(
        stdout.contains(&format!("37024 parameters, 74048 -> {after} bytes")),
        "{stdout}"
    );
    let folder = HfFolder::open(&out).unwrap();
    assert_eq!(
        folder.config()["quantization"],
        serde_json::json!({"group_size": 32, "bits": 4, "mode": "affine"})
    );
    let (_, params) = hf::load_model::<Llama>(&folder, Some(Dtype::Float32)).unwrap();
    let q = Some(Quantization::new(32, 4).unwrap());
    assert_eq!(params.lm_head.as_ref().unwrap().quantization, q);
    assert_eq!(params.model.layers[1].mlp.down_proj.quantization, q);
    assert_eq!(params.model.embed_tokens.weight.dtype(), Dtype::Uint32);
    assert!(
        out.join("tokenizer.json").exists(),
        "the tokenizer is carried"
    );

    // `lmx info` counts the quantized folder's parameters unpacked, as the dense folder's (the
    // hand count above), its scales and offsets apart: one each per 32 packed weights, 36,864 /
    // 32 * 2.
    let info = |dir: &str| {
        let output = lmx(&["info", dir]);
        assert!(output.status.success(), "{output:?}");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let dense = info(&llama());
    assert!(dense.contains("parameters        37,024\n"), "{dense}");
    assert!(
        dense.contains("weights           144.6 KiB (F32 144.6 KiB)"),
        "{dense}"
    );
    let packed = info(out.to_str().unwrap());
    assert!(packed.contains("parameters        37,024\n"), "{packed}");
    assert!(
        packed.contains(
            "quantized         16 layers to 4 bits in groups of 32 (2,304 scales and biases)"
        ),
        "{packed}"
    );
    assert!(packed.contains("F16 4.8 KiB, U32 18.0 KiB"), "{packed}");

    // `lmx generate` decodes from the quantized folder through the folder's own tokenizer.
    let output = lmx(&[
        "generate",
        "--model",
        out.to_str().unwrap(),
        "--prompt",
        "First Citizen:",
        "--max-tokens",
        "8",
        "--temperature",
        "0",
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}{stderr}");
    assert!(stdout.starts_with("First Citizen:"), "{stdout}");
    assert!(stderr.contains("8 tokens"), "{stderr}");
}

#[test]
fn unsupported_settings_fail_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    for (flag, value, message) in [
        (
            "--bits",
            "7",
            "7-bit quantization is not supported: MLX's affine quantization takes 2, 3, 4, 5, 6 or 8 bits",
        ),
        (
            "--group-size",
            "48",
            "a group size of 48 is not supported: it must be 32, 64 or 128",
        ),
    ] {
        let output = lmx(&[
            "quantize",
            "--model",
            &llama(),
            flag,
            value,
            "--out",
            out.to_str().unwrap(),
        ]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{flag} {value} succeeded");
        assert!(stderr.contains(message), "{stderr}");
        assert!(!out.exists(), "nothing written");
    }
}

/// A run's checkpoint quantizes too (a run directory or one of its checkpoints), the model
/// generates, and `--dequantize` writes it dense again.
#[test]
fn a_run_quantizes_generates_and_dequantizes() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let run_arg = run.to_str().unwrap();
    let output = lmx(&[
        "train",
        "--model",
        "llama",
        "--preset",
        "tiny",
        "--set",
        "vocab=257",
        "--tokenizer",
        "byte",
        "--steps",
        "2",
        "--batch-size",
        "2",
        "--seq-len",
        "16",
        "--quiet",
        "--sample",
        "0",
        "--out",
        run_arg,
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let checkpoint = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .find(|path| path.join("model.safetensors").exists())
        .expect("a checkpoint");
    for (i, source) in [run.clone(), checkpoint].iter().enumerate() {
        let out = dir.path().join(format!("q{i}"));
        let output = lmx(&[
            "quantize",
            "--model",
            source.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ]);
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{stdout}{stderr}");
        // The run's byte tokenizer, written as a tokenizer.json of the byte ids.
        let tokenizer = HfTokenizer::from_file(out.join("tokenizer.json")).unwrap();
        assert_eq!(tokenizer.encode("Hi").unwrap(), [72, 105], "{stderr}");
        assert_eq!(tokenizer.eos_id(), Some(256));
        // With a tokenizer_config.json that has transformers read it as it is (no LLaMA `<s>`).
        let written = std::fs::read_to_string(out.join("tokenizer_config.json")).unwrap();
        let tokenizer_config: serde_json::Value = serde_json::from_str(&written).unwrap();
        assert_eq!(
            tokenizer_config["tokenizer_class"],
            "PreTrainedTokenizerFast"
        );
        assert_eq!(tokenizer_config["eos_token"], "<|endoftext|>");
        assert_eq!(tokenizer_config["add_bos_token"], false);

        // 7 linear layers a block but the 172-wide down_proj, the embedding and the head.
        assert!(
            stdout.contains("14 layers quantized to 4 bits in groups of 64"),
            "{stdout}"
        );
        assert!(stdout.contains("model.layers.1.mlp.down_proj"), "{stdout}");
        let folder = HfFolder::open(&out).unwrap();
        // config.json names the byte tokenizer's ids (transformers would assume GPT-2's 50256
        // where it says nothing).
        assert_eq!(folder.config()["eos_token_id"], 256);
        assert_eq!(folder.config()["bos_token_id"], serde_json::Value::Null);
        let (config, params) = hf::load_model::<Llama>(&folder, Some(Dtype::Float32)).unwrap();
        assert_eq!(
            params.model.embed_tokens.quantization,
            Some(Quantization::new(64, 4).unwrap())
        );
        let sampling = Sampling {
            temperature: 0.0,
            max_tokens: 5,
            ..Sampling::default()
        };
        let generation =
            generate::<Llama>(&params, &config, &[72, 105], &sampling, None, |_| {}).unwrap();
        assert_eq!(generation.tokens.len(), 5);
    }

    let dense = dir.path().join("dense");
    let q0 = dir.path().join("q0");
    let output = lmx(&[
        "quantize",
        "--dequantize",
        "--dtype",
        "float32",
        "--model",
        q0.to_str().unwrap(),
        "--out",
        dense.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("14 layers dequantized"),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let folder = HfFolder::open(&dense).unwrap();
    assert!(folder.config().get("quantization").is_none());
    let (_, params) = hf::load_model::<Llama>(&folder, None).unwrap();
    let lm_head = params.lm_head.as_ref().expect("an untied head");
    assert_eq!(lm_head.weight.dtype(), Dtype::Float32);
    assert_eq!(lm_head.weight.shape(), &[257, 64]);
}

/// A Mixtral's stacked experts quantize with its other layers (and the summary counts them); the
/// quantized folder generates, and adapters train over it (QLoRA: the experts stay packed and
/// frozen, the adapters go on the attention and router projections).
#[test]
fn a_mixtral_quantizes_its_experts_generates_and_trains_adapters() {
    let dir = tempfile::tempdir().unwrap();
    let s = |name: &str| dir.path().join(name).to_str().unwrap().to_owned();
    let mixtral = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/hf/mixtral");
    let stdout = ok(&[
        "quantize",
        "--model",
        mixtral,
        "--bits",
        "4",
        "--group-size",
        "32",
        "--out",
        &s("q4"),
    ]);
    // Per block 4 attention projections, the router and 3 stacked expert projections; the
    // embedding and the head.
    assert!(
        stdout
            .contains("18 layers (6 of them stacked experts) quantized to 4 bits in groups of 32"),
        "{stdout}"
    );
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("q4/config.json")).unwrap())
            .unwrap();
    assert_eq!(
        config["quantization"],
        serde_json::json!({"group_size": 32, "bits": 4, "mode": "affine"})
    );
    let greedy = |args: &[&str]| {
        let mut all = vec!["generate", "--prompt", "Double 3.\n", "--max-tokens", "8"];
        all.extend(["--temperature", "0"]);
        all.extend(args);
        ok(&all)
    };
    assert!(greedy(&["--model", &s("q4")]).starts_with("Double 3.\n"));

    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/data/sft");
    ok(&[
        "lora",
        "--init",
        &s("q4"),
        "--rank",
        "4",
        "--num-layers",
        "-1",
        "--steps",
        "4",
        "--lr",
        "0.01",
        "--batch-size",
        "2",
        "--seq-len",
        "32",
        "--quiet",
        "--data",
        data,
        "--out",
        &s("qlora"),
    ]);
    assert!(greedy(&["--run", &s("qlora")]).starts_with("Double 3.\n"));
}

/// The tensors of a safetensors file, by name: dtype, shape and bytes.
fn tensors(
    path: &std::path::Path,
) -> std::collections::BTreeMap<String, (String, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    file.tensors()
        .into_iter()
        .map(|(name, view)| {
            let entry = (
                format!("{:?}", view.dtype()),
                view.shape().to_vec(),
                view.data().to_vec(),
            );
            (name, entry)
        })
        .collect()
}

/// A GPT-2 folder (transformers' `Conv1D` weights, `[in, out]`) quantizes into mlx-lm's own
/// layout, tensor for tensor what mlx-lm's `quantize_model` saves for it
/// (`tests/fixtures/gpt2_q_mlx_lm`, `tests/reference/quantized.py`), and generates.
#[test]
fn a_gpt2_folder_quantizes_as_mlx_lm_does() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("q4");
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let folder = source.join("hf/gpt2");
    ok(&[
        "quantize",
        "--model",
        folder.to_str().unwrap(),
        "--bits",
        "4",
        "--group-size",
        "32",
        "--dtype",
        "float32",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_same_tensors(
        &out.join("model.safetensors"),
        &source.join("gpt2_q_mlx_lm/model.safetensors"),
    );
    // It samples (its numbers are `quantized_models.rs`'s to check).
    ok(&[
        "generate",
        "--model",
        out.to_str().unwrap(),
        "--prompt",
        "Hello",
        "--max-tokens",
        "4",
    ]);
}

/// A run of a model with no Hugging Face layout (the bundled hybrid of Mamba-2 mixers and
/// attention, as a model of one's own) quantizes into a run directory: its checkpoint holds exactly MLX's quantization of
/// the run's weights and its record names the packed layers, so that `lmx generate --run` reads
/// it and decodes what the library decodes from those weights; adapters train over it (`lmx lora
/// --base`), their run recording the packed base too. Full training, a Hugging Face export and a
/// float16 run are refused, naming why, with nothing written; `--dequantize` gives a dense run
/// back.
#[test]
fn a_run_without_a_hugging_face_layout_quantizes_into_a_run() {
    use lmx::models::hybrid::Hybrid;
    use lmx::runtime::model::LanguageModel;
    use lmx::runtime::{checkpoint, quant, tree};

    let dir = tempfile::tempdir().unwrap();
    let s = |name: &str| dir.path().join(name).to_str().unwrap().to_owned();
    let (run, q4, qlora) = (s("run"), s("q4"), s("qlora"));
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/data/shakespeare.txt");
    let common = [
        "--tokenizer",
        "byte",
        "--batch-size",
        "2",
        "--seq-len",
        "16",
    ];
    let quiet = ["--quiet", "--sample", "0", "--data", data];
    let mut train = vec![
        "train",
        "--model",
        "hybrid",
        "--preset",
        "tiny",
        "--set",
        "vocab=257",
    ];
    train.extend(common);
    train.extend(quiet);
    train.extend(["--steps", "3", "--out", &run]);
    ok(&train);

    let stdout = ok(&[
        "quantize",
        "--model",
        &s("run"),
        "--bits",
        "4",
        "--group-size",
        "32",
        "--out",
        &s("q4"),
    ]);
    // The reference: the run's weights, quantized by the library (MLX's `quantize`).
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(s("q4/run.json")).unwrap()).unwrap();
    let config: <Hybrid as LanguageModel>::Config =
        serde_json::from_value(record["model_config"].clone()).unwrap();
    let step = "checkpoints/step-000003/model.safetensors";
    let template = Hybrid::init(&config, 0).unwrap();
    let mut params = checkpoint::load_tree(&dir.path().join("run").join(step), &template).unwrap();
    let report = quant::quantize_tree(&mut params, Quantization::new(32, 4).unwrap()).unwrap();
    let layers = report.quantized.len();
    assert!(layers > 0, "{report:?}");
    assert!(
        stdout.contains(&format!(
            "{layers} layers quantized to 4 bits in groups of 32"
        )),
        "{stdout}"
    );
    let mut expected = serde_json::json!({"group_size": 32, "bits": 4, "mode": "affine"});
    for layer in &report.quantized {
        expected[layer] = true.into();
    }
    assert_eq!(record["quantization"], expected);
    let reference = dir.path().join("reference.safetensors");
    checkpoint::save_tree(&reference, &params).unwrap();
    assert_eq!(
        tensors(&dir.path().join("q4").join(step)),
        tensors(&reference)
    );

    let prompt = "ROMEO:";
    let sampling = Sampling {
        temperature: 0.0,
        max_tokens: 12,
        ..Sampling::default()
    };
    let ids: Vec<u32> = prompt.bytes().map(u32::from).collect();
    let generation = generate::<Hybrid>(&params, &config, &ids, &sampling, None, |_| {}).unwrap();
    let bytes: Vec<u8> = ids
        .iter()
        .chain(generation.tokens.iter().take_while(|&&id| id < 256))
        .map(|&id| id as u8)
        .collect();
    let greedy = |run: &str| {
        ok(&[
            "generate",
            "--run",
            run,
            "--prompt",
            prompt,
            "--max-tokens",
            "12",
            "--temperature",
            "0",
        ])
    };
    assert_eq!(
        greedy(&s("q4")).trim_end_matches('\n'),
        String::from_utf8_lossy(&bytes)
    );

    // Adapters over the packed weights; their run reads the packed base back.
    let mut lora = vec!["lora", "--base", &q4, "--rank", "4", "--num-layers", "-1"];
    lora.extend(["--batch-size", "2", "--seq-len", "16", "--steps", "2"]);
    lora.extend(quiet);
    lora.extend(["--out", &qlora]);
    ok(&lora);
    let qlora: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(s("qlora/run.json")).unwrap()).unwrap();
    assert_eq!(qlora["quantization"], expected);
    let packed = tensors(
        &dir.path()
            .join("qlora/checkpoints/step-000002/model.safetensors"),
    );
    let base = tensors(&dir.path().join("q4").join(step));
    let weight = format!("{}.weight", report.quantized[0]);
    assert_eq!(packed[&weight], base[&weight]);
    assert!(greedy(&s("qlora")).starts_with(prompt));

    let refused = fails(&["train", "--resume", "--out", &s("q4"), "--steps", "4"]);
    assert!(
        refused.contains(&format!(
            "{} is a quantized run, with no training state to resume",
            s("q4")
        )),
        "{refused}"
    );
    assert_eq!(
        tensors(&dir.path().join("q4").join(step)),
        tensors(&reference)
    );
    let refused = fails(&["export", "--run", &s("q4"), "--out", &s("exported")]);
    assert!(
        refused.contains("hybrid has no Hugging Face layout"),
        "{refused}"
    );
    let refused = fails(&[
        "quantize",
        "--model",
        &s("run"),
        "--dtype",
        "float16",
        "--out",
        &s("f16"),
    ]);
    assert!(
        refused.contains("--dtype float16: a run keeps its parameters in float32 or bfloat16"),
        "{refused}"
    );
    let refused = fails(&["quantize", "--model", &s("run"), "--out", &s("q4")]);
    assert!(
        refused.contains("exists and is not an empty folder"),
        "{refused}"
    );
    for name in ["exported", "f16"] {
        assert!(!dir.path().join(name).exists(), "{name}");
    }

    let stdout = ok(&[
        "quantize",
        "--dequantize",
        "--model",
        &s("q4"),
        "--out",
        &s("dense"),
    ]);
    assert!(
        stdout.contains(&format!("{layers} layers dequantized")),
        "{stdout}"
    );
    let dense: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(s("dense/run.json")).unwrap()).unwrap();
    assert!(dense.get("quantization").is_none(), "{dense}");
    let refused = fails(&[
        "train",
        "--resume",
        "--allow-changes",
        "--out",
        &s("dense"),
        "--steps",
        "4",
    ]);
    assert!(
        refused.contains("holds a model's weights and no training state"),
        "{refused}"
    );
    quant::dequantize_tree(&mut params).unwrap();
    let back = checkpoint::load_tree(&dir.path().join("dense").join(step), &template).unwrap();
    for ((name, a), b) in tree::names(&params)
        .iter()
        .zip(tree::flatten(&params))
        .zip(tree::flatten(&back))
    {
        assert!(a.eq_values(&b).unwrap(), "{name}");
    }
}

/// Families whose quantization only the Registry's dispatch reaches (Mamba-2's mixers,
/// Qwen3-Next's and DeepSeek-V3's routed experts): each folder quantizes into mlx-lm's layout and
/// the written folder loads back quantized and generates.
#[test]
fn mamba2_qwen3_next_and_deepseek_v3_folders_quantize_and_load_back() {
    let dir = tempfile::tempdir().unwrap();
    for family in ["mamba2", "qwen3_next", "deepseek_v3"] {
        let source = format!("{}/tests/fixtures/hf/{family}", env!("CARGO_MANIFEST_DIR"));
        let out = dir.path().join(family);
        let out = out.to_str().unwrap();
        let said = ok(&[
            "quantize",
            "--model",
            &source,
            "--bits",
            "4",
            "--group-size",
            "32",
            "--out",
            out,
        ]);
        assert!(
            said.contains("quantized to 4 bits in groups of 32"),
            "{said}"
        );
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(format!("{out}/config.json")).unwrap())
                .unwrap();
        assert_eq!(config["quantization"]["bits"], 4, "{family}");
        let text = ok(&[
            "generate",
            "--model",
            out,
            "--prompt",
            "Hello",
            "--max-tokens",
            "3",
            "--temperature",
            "0",
        ]);
        assert!(text.starts_with("Hello"), "{family}: {text}");
    }
}
