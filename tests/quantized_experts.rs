//! Quantized sparse experts in mlx-lm's layout, in and out.
//!
//! Fixture (`tests/reference/quantized.py`): `tests/fixtures/mixtral_q_mlx_lm/`, the tiny Mixtral
//! of `tests/fixtures/hf/mixtral` (transformers' per-expert layout) converted by mlx-lm's
//! `convert -q` (4 bits in groups of 32; `model.layers.1.block_sparse_moe.switch_mlp.down_proj`
//! 8 bits in groups of 64 by a per-layer entry): mlx-lm stacks the experts into
//! `QuantizedSwitchLinear`s, whose packed `weight`, `scales` and `biases` keep the experts axis
//! first, and multiplies them with `gather_qmm`. `mixtral_q_mlx_lm_io.safetensors` holds tokens
//! [2, 20] (80 (token, expert) rows: the product sorted by expert), mlx-lm's float32 logits and its
//! greedy continuation (single tokens: the unsorted product).
//!
//! Tolerance: the same MLX kernels on the same packed weights and float32 scales; 1e-4 absolute
//! as in `quantized_models.rs`.

use crate::support::reference::{assert_logits_and_greedy, fixture, max_error};
use lmx::models::mixtral::Mixtral;
use lmx::runtime::hf::{self, HfFolder};
use lmx::runtime::lora::{self, FineTuneType, LoraParameters};
use lmx::runtime::mlx_rs::Dtype;
use lmx::runtime::model::{Context, LanguageModel};
use lmx::runtime::nn::Quantization;
use lmx::runtime::quant::{self, layout};
use lmx::runtime::tree::{self, Tree};
use lmx::runtime::{Array, Result};
use std::path::{Path, PathBuf};

const TOLERANCE: f32 = 1e-4;
const DOWN_1: &str = "model.layers.1.block_sparse_moe.switch_mlp.down_proj";

type Config = <Mixtral as LanguageModel>::Config;
type Params = <Mixtral as LanguageModel>::Params;

fn load(dir: &Path) -> Result<(Config, Params)> {
    hf::load_model::<Mixtral>(&HfFolder::open(dir)?, Some(Dtype::Float32))
}

fn logits(params: &Params, config: &Config, tokens: &Array) -> Result<Array> {
    Mixtral::forward(params, config, tokens, &mut Context::evaluation())
}

#[test]
fn a_mixtral_quantized_by_mlx_lm_loads_matches_its_logits_and_generates() -> Result<()> {
    let (config, params) = load(&fixture("mixtral_q_mlx_lm"))?;
    let q4 = Some(Quantization::new(32, 4)?);
    for layer in &params.model.layers {
        let experts = &layer.block_sparse_moe.switch_mlp;
        assert_eq!(experts.gate_proj.quantization, q4);
        assert_eq!(experts.up_proj.quantization, q4);
        assert_eq!(experts.gate_proj.weight.dtype(), Dtype::Uint32);
        assert_eq!(experts.gate_proj.weight.shape(), &[4, 64, 4]);
        assert_eq!(
            experts.gate_proj.scales.as_ref().map(Array::shape),
            Some(&[4, 64, 1][..])
        );
    }
    let down = &params.model.layers[1].block_sparse_moe.switch_mlp.down_proj;
    assert_eq!(down.quantization, Some(Quantization::new(64, 8)?));
    quant::check_tree(&params)?;

    let mut io = Array::load_safetensors(fixture("mixtral_q_mlx_lm_io.safetensors")).unwrap();
    let (tokens, expected) = (io.remove("tokens").unwrap(), io.remove("logits").unwrap());
    let greedy: Vec<u32> = io["greedy"]
        .as_slice::<i32>()
        .iter()
        .map(|&t| t as u32)
        .collect();
    assert_logits_and_greedy::<Mixtral>(
        &params, &config, &tokens, &expected, &greedy, 20, TOLERANCE,
    )
}

/// The float Mixtral the fixture was converted from, quantized by lmx with the fixture's
/// settings, is mlx-lm's model bit for bit (MLX's `quantize` over the experts' last axis); its
/// export is mlx-lm's layout (stacked experts with their scales and biases, the per-layer
/// entry), and reloads bit for bit. With `LMX_QUANT_EXPORT=DIR` the export is also left in DIR
/// with `io.safetensors` (tokens, lmx's logits), for `tests/reference/quantized.py --check DIR`.
#[test]
fn lmx_quantizes_experts_as_mlx_lm_and_writes_its_layout() -> Result<()> {
    let source = HfFolder::open(&fixture("hf/mixtral"))?;
    let (config, mut params) = hf::load_model::<Mixtral>(&source, Some(Dtype::Float32))?;
    let eight = Quantization::new(64, 8)?;
    let down = &mut params.model.layers[1].block_sparse_moe.switch_mlp.down_proj;
    let (w, s, b) = quant::quantize_weight(DOWN_1, &down.weight, eight)?;
    (down.weight, down.scales, down.biases) = (w, Some(s), Some(b));
    down.quantization = Some(eight);
    let report = quant::quantize_tree(&mut params, Quantization::new(32, 4)?)?;
    assert_eq!(report.skipped, [DOWN_1]);
    assert_eq!(report.experts, 5, "{:?}", report.quantized);
    assert_eq!(report.quantized.len(), 2 * 5 + 5 + 2);

    let (_, mlx_lm) = load(&fixture("mixtral_q_mlx_lm"))?;
    assert_eq!(tree::names(&params), tree::names(&mlx_lm));
    for ((name, ours), theirs) in tree::names(&params)
        .iter()
        .zip(tree::flatten(&params))
        .zip(tree::flatten(&mlx_lm))
    {
        assert_eq!(ours.dtype(), theirs.dtype(), "{name}");
        assert!(ours.eq_values(&theirs)?, "{name} differs from mlx-lm's");
    }

    let out = tempfile::tempdir().unwrap();
    let exported = match std::env::var_os("LMX_QUANT_EXPORT") {
        Some(dir) => PathBuf::from(dir),
        None => out.path().join("q4"),
    };
    let lmx_config = serde_json::to_value(&config).unwrap();
    let spec = hf::ExportSpec {
        lmx_config: &lmx_config,
        source_config: Some(source.config()),
        dtype: Dtype::Float32,
        carry: &[],
        max_shard_bytes: hf::DEFAULT_MAX_SHARD_BYTES,
    };
    hf::export(&exported, source.family(), &params, &spec)?;
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(exported.join("config.json")).unwrap())
            .unwrap();
    let expected = serde_json::json!({
        "group_size": 32, "bits": 4, "mode": "affine",
        DOWN_1: {"group_size": 64, "bits": 8, "mode": "affine"},
    });
    assert_eq!(written["quantization"], expected);
    let stored = Array::load_safetensors(exported.join("model.safetensors")).unwrap();
    for part in ["weight", "scales", "biases"] {
        let name = format!("{DOWN_1}.{part}");
        assert_eq!(stored[&name].shape()[0], 4, "{name} keeps the experts axis");
    }
    assert!(!stored.keys().any(|name| name.contains(".experts.")));

    let (_, reloaded) = load(&exported)?;
    for ((name, a), b) in tree::names(&params)
        .iter()
        .zip(tree::flatten(&params))
        .zip(tree::flatten(&reloaded))
    {
        assert!(a.eq_values(&b)?, "{name} changed");
    }
    assert_eq!(layout::config_entry(&reloaded), Some(expected));
    let tokens = Array::from_slice(&[1_i32, 5, 9, 200, 7, 3, 3, 42], &[1, 8]);
    let again = logits(&reloaded, &config, &tokens)?;
    assert_eq!(max_error(&again, &logits(&params, &config, &tokens)?), 0.0);
    if std::env::var_os("LMX_QUANT_EXPORT").is_some() {
        let io = [("tokens", &tokens), ("logits", &again)];
        Array::save_safetensors(io, None, exported.join("io.safetensors")).unwrap();
    }

    // Dequantized, the experts are floating point again: `gather_mm` of the dequantized values.
    let dense_count = quant::dequantize_tree(&mut params)?.len();
    assert_eq!(dense_count, report.quantized.len() + 1);
    let down = &params.model.layers[1].block_sparse_moe.switch_mlp.down_proj;
    assert_eq!(
        (down.weight.shape(), down.scales.is_none()),
        (&[4, 32, 64][..], true)
    );
    let dense = logits(&params, &config, &tokens)?;
    assert!(max_error(&dense, &again) < TOLERANCE);
    Ok(())
}

/// Every bundled model with stacked experts quantizes them: at `tiny` (experts 32 wide inside,
/// 64 outside) each sparse layer's three projections pack in groups of 32, and the packed model
/// (`gather_qmm`, `quantized_matmul`) computes what the same model with its weights dequantized
/// (`gather_mm`, `matmul`) does.
fn experts_quantize<M: LanguageModel>(sparse_layers: usize) -> Result<()> {
    let config = M::preset("tiny").expect("a tiny preset");
    let mut params = M::init(&config, 3)?;
    let report = quant::quantize_tree(&mut params, Quantization::new(32, 4)?)?;
    assert_eq!(report.experts, 3 * sparse_layers, "{:?}", report.quantized);
    let stacked = report
        .quantized
        .iter()
        .filter(|name| name.contains("switch_mlp."));
    assert_eq!(stacked.count(), report.experts);
    quant::check_tree(&params)?;
    let mut dense = params.clone();
    quant::dequantize_tree(&mut dense)?;
    let tokens = Array::from_slice(&[1_i32, 5, 9, 200, 7, 3, 3, 42], &[1, 8]);
    let packed = M::forward(&params, &config, &tokens, &mut Context::evaluation())?;
    let expected = M::forward(&dense, &config, &tokens, &mut Context::evaluation())?;
    let error = max_error(&packed, &expected);
    assert!(error <= TOLERANCE, "{error}");
    Ok(())
}

#[test]
fn deepseek_and_qwen3_next_experts_quantize() -> Result<()> {
    use lmx::models::{deepseek_v2::DeepseekV2, deepseek_v3::DeepseekV3, qwen3_next::Qwen3Next};
    experts_quantize::<DeepseekV2>(2)?;
    experts_quantize::<DeepseekV3>(2)?;
    experts_quantize::<Qwen3Next>(2)
}

/// QLoRA over quantized experts, with mlx-lm's default keys: adapters on the attention, the
/// router and each stacked expert projection (mlx-lm's `LoRASwitchLinear` over
/// `QuantizedSwitchLinear`), the packed experts frozen with the rest of the base. Fresh adapters
/// leave the outputs unchanged, and fusing leaves each stack quantized with its own settings.
#[test]
fn adapters_over_quantized_experts_train_alone_and_fuse_packed() -> Result<()> {
    let (config, base) = load(&fixture("mixtral_q_mlx_lm"))?;
    let mut params = base.clone();
    let parameters = LoraParameters {
        rank: 4,
        scale: 20.0,
        dropout: 0.0,
        keys: None,
    };
    let adapted = lora::attach(&mut params, &parameters, -1, 0, FineTuneType::Lora)?;
    assert!(adapted
        .iter()
        .any(|name| name.ends_with("self_attn.q_proj")));
    assert!(adapted
        .iter()
        .any(|name| name.ends_with("switch_mlp.up_proj")));
    for spec in tree::specs(&params) {
        let adapter = spec.name.ends_with(".lora_a") || spec.name.ends_with(".lora_b");
        assert_eq!(spec.trainable, adapter, "{}", spec.name);
    }
    let tokens = Array::from_slice(&[1_i32, 5, 9, 200, 7, 3, 3, 42], &[1, 8]);
    let before = Mixtral::forward(&base, &config, &tokens, &mut Context::evaluation())?;
    let after = Mixtral::forward(&params, &config, &tokens, &mut Context::evaluation())?;
    assert!(
        before.eq_values(&after)?,
        "fresh adapters changed the outputs"
    );
    let stacks = |tree: &Params| {
        let mut found = Vec::new();
        tree.for_each_layer(&tree::Scope::root(), &mut |scope, layer| {
            if let tree::Layer::SwitchLinear(switch) = layer {
                found.push((
                    scope.name().to_owned(),
                    switch.quantization,
                    switch.lora_a.is_some(),
                ));
            }
        });
        found
    };
    let mut fused = params.clone();
    lora::fuse(&mut fused)?;
    for ((name, packed, adapter), (_, was, _)) in stacks(&fused).into_iter().zip(stacks(&base)) {
        assert!(packed.is_some() && packed == was && !adapter, "{name}");
    }
    Ok(())
}

/// A copy of the mlx-lm fixture whose weights file has `edit` applied.
fn with_weights(
    edit: impl FnOnce(&mut std::collections::HashMap<String, Array>),
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let source = fixture("mixtral_q_mlx_lm");
    std::fs::copy(source.join("config.json"), dir.path().join("config.json")).unwrap();
    let mut tensors = Array::load_safetensors(source.join("model.safetensors")).unwrap();
    edit(&mut tensors);
    let weights = dir.path().join("model.safetensors");
    Array::save_safetensors(tensors.iter().map(|(k, v)| (k.as_str(), v)), None, &weights).unwrap();
    dir
}

fn message(result: Result<impl Sized>) -> String {
    match result {
        Ok(_) => panic!("expected an error"),
        Err(err) => err.to_string(),
    }
}

#[test]
fn bad_quantized_experts_fail_naming_file_tensor_and_setting() {
    let gate = "model.layers.0.block_sparse_moe.switch_mlp.gate_proj";

    let dir = with_weights(|tensors| {
        tensors.insert(
            format!("{gate}.scales"),
            Array::zeros::<f32>(&[4, 64, 2]).unwrap(),
        );
    });
    let (weights, config) = (
        dir.path().join("model.safetensors"),
        dir.path().join("config.json"),
    );
    assert_eq!(
        message(load(dir.path())),
        format!(
            "{}: tensor `{gate}.scales` has shape [4, 64, 2], not [4, 64, 1]; {}: quantization \
             makes `{gate}` 4-bit in groups of 32",
            weights.display(),
            config.display()
        )
    );

    let dir = with_weights(|tensors| {
        tensors.remove(&format!("{DOWN_1}.biases"));
    });
    let config = dir.path().join("config.json");
    let error = message(load(dir.path()));
    assert!(
        error.contains(&format!("tensor `{DOWN_1}.biases` is missing"))
            && error.ends_with(&format!(
                "{}: quantization makes `{DOWN_1}` 8-bit in groups of 64",
                config.display()
            )),
        "{error}"
    );

    // Without its scales the packed weight would be read as the floating-point one it is not.
    let dir = with_weights(|tensors| {
        tensors.remove(&format!("{gate}.scales"));
        tensors.remove(&format!("{gate}.biases"));
    });
    let (weights, config) = (
        dir.path().join("model.safetensors"),
        dir.path().join("config.json"),
    );
    assert_eq!(
        message(load(dir.path())),
        format!(
            "{}: tensor `{gate}.weight` holds packed values but `{gate}.scales` is missing; {}: \
             quantization makes `{gate}` 4-bit in groups of 32",
            weights.display(),
            config.display()
        )
    );
}
