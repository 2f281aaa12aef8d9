//! mlx-lm's quantized layout in and out.
//!
//! Fixture (`tests/reference/quantized.py`): `tests/fixtures/llama_q_mlx_lm/`, a tiny LLaMA
//! built with mlx-lm's own `llama.Model`, quantized by its `quantize_model` (4 bits in groups
//! of 32; `lm_head` 8 bits in groups of 64 by a per-layer entry; one `v_proj` left dense by the
//! predicate, so that only its missing scales say so; the `down_proj`s, rows of 172, skipped by
//! the divisibility rule) and saved by `save_model`/`save_config`; `llama_q_mlx_lm_io.
//! safetensors` holds tokens, mlx-lm's float32 logits and its greedy continuation.
//!
//! Tolerance: both sides run the same MLX kernels (`quantized_matmul`, `dequantize`) on the
//! same packed weights and float32-widened scales, so the logits differ only by float32
//! rounding in differently fused element-wise code: 1e-4 absolute (the logits are of order 1),
//! as for the float models of `hf_models.rs`.

use crate::support::reference::{
    assert_logits_and_greedy, assert_same_tensors, fixture, max_error,
};
use lmx::models::llama::Llama;
use lmx::runtime::hf::{self, HfFolder};
use lmx::runtime::mlx_rs::Dtype;
use lmx::runtime::model::{Context, LanguageModel};
use lmx::runtime::nn::{LinearParams, Quantization};
use lmx::runtime::quant::{self, layout};
use lmx::runtime::tree::{self, Tree};
use lmx::runtime::{Array, Error, Result};
use std::path::{Path, PathBuf};

const TOLERANCE: f32 = 1e-4;

fn io() -> (Array, Array, Vec<u32>) {
    io_of("llama_q_mlx_lm_io.safetensors")
}

/// A fixture's tokens, mlx-lm's float32 logits and its greedy continuation.
fn io_of(name: &str) -> (Array, Array, Vec<u32>) {
    let path = fixture(name);
    let mut io = Array::load_safetensors(&path).unwrap_or_else(|err| panic!("{path:?}: {err}"));
    let greedy = io.remove("greedy").unwrap();
    let greedy = greedy.as_slice::<i32>().iter().map(|&t| t as u32).collect();
    (
        io.remove("tokens").unwrap(),
        io.remove("logits").unwrap(),
        greedy,
    )
}

fn load(
    dir: &Path,
) -> Result<(
    <Llama as LanguageModel>::Config,
    <Llama as LanguageModel>::Params,
)> {
    hf::load_model::<Llama>(&HfFolder::open(dir)?, Some(Dtype::Float32))
}

#[test]
fn a_model_quantized_by_mlx_lm_loads_matches_its_logits_and_generates() -> Result<()> {
    let (config, params) = load(&fixture("llama_q_mlx_lm"))?;
    let q4 = Some(Quantization::new(32, 4)?);
    assert_eq!(params.model.embed_tokens.quantization, q4);
    assert_eq!(
        params
            .lm_head
            .as_ref()
            .expect("an untied head")
            .quantization,
        Some(Quantization::new(64, 8)?)
    );
    let layer0 = &params.model.layers[0];
    assert_eq!(layer0.self_attn.v_proj.quantization, q4);
    assert_eq!(layer0.mlp.down_proj.quantization, None, "rows of 172");
    let layer1 = &params.model.layers[1];
    assert_eq!(
        layer1.self_attn.v_proj.quantization, None,
        "no scales stored"
    );
    assert_eq!(layer1.self_attn.v_proj.weight.dtype(), Dtype::Float32);
    assert_eq!(layer1.self_attn.q_proj.weight.dtype(), Dtype::Uint32);
    quant::check_tree(&params)?;

    let (tokens, expected, greedy) = io();
    assert_logits_and_greedy::<Llama>(&params, &config, &tokens, &expected, &greedy, 8, TOLERANCE)
}

/// Quantizes the float LLaMA of `hf_models.rs` (its `lm_head` in 8 bits first, then every other
/// layer in 4), exports it, reloads the export: bit-identical tensors, the same logits, and the
/// quantization written per layer. With `LMX_QUANT_EXPORT=DIR` the export is also left in DIR
/// with `io.safetensors` (tokens, lmx's logits), for `tests/reference/quantized.py --check DIR`
/// to load in mlx-lm.
#[test]
fn a_model_quantized_by_lmx_round_trips_in_mlx_lm_layout() -> Result<()> {
    let source = fixture("hf/llama");
    let folder = HfFolder::open(&source)?;
    let (config, mut params) = hf::load_model::<Llama>(&folder, Some(Dtype::Float32))?;
    let eight = Quantization::new(64, 8)?;
    // 32 columns: not a multiple of 64, so the head takes groups of 32 in 8 bits.
    let head = Quantization::new(32, 8)?;
    let lm_head = params.lm_head.as_mut().expect("an untied head");
    let (w, s, b) = quant::quantize_weight("lm_head", &lm_head.weight, head)?;
    lm_head.weight = w;
    lm_head.scales = Some(s);
    lm_head.biases = Some(b);
    lm_head.quantization = Some(head);
    let report = quant::quantize_tree(&mut params, Quantization::new(32, 4)?)?;
    assert_eq!(report.skipped, ["lm_head"]);
    assert_eq!(report.quantized.len(), 1 + 2 * 7);
    assert!(quant::quantize_tree(&mut params, eight)?
        .quantized
        .is_empty());

    let tokens = Array::from_slice(&[1_i32, 5, 9, 200, 7, 3, 3, 42], &[1, 8]);
    let logits = Llama::forward(&params, &config, &tokens, &mut Context::evaluation())?;
    let out = tempfile::tempdir().unwrap();
    let exported = match std::env::var_os("LMX_QUANT_EXPORT") {
        Some(dir) => PathBuf::from(dir),
        None => out.path().join("q4"),
    };
    let lmx_config = serde_json::to_value(&config).unwrap();
    let spec = hf::ExportSpec {
        lmx_config: &lmx_config,
        source_config: Some(folder.config()),
        dtype: Dtype::Float16,
        carry: &[],
        max_shard_bytes: hf::DEFAULT_MAX_SHARD_BYTES,
    };
    hf::export(&exported, folder.family(), &params, &spec)?;
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(exported.join("config.json")).unwrap())
            .unwrap();
    let expected = serde_json::json!({
        "group_size": 32, "bits": 4, "mode": "affine",
        "lm_head": {"group_size": 32, "bits": 8, "mode": "affine"},
    });
    assert_eq!(written["quantization"], expected);
    assert_eq!(written["quantization_config"], expected);

    let (_, reloaded) = load(&exported)?;
    // The float16 export widened back to float32 equals the model with float16-rounded scales.
    let rounded = params.map_same(&mut |leaf| match leaf.dtype() {
        Dtype::Float32 => leaf
            .as_dtype(Dtype::Float16)
            .unwrap()
            .as_dtype(Dtype::Float32)
            .unwrap(),
        _ => leaf.clone(),
    });
    for ((name, a), b) in tree::names(&rounded)
        .iter()
        .zip(tree::flatten(&rounded))
        .zip(tree::flatten(&reloaded))
    {
        assert_eq!(a.dtype(), b.dtype(), "{name}");
        assert!(a.eq_values(&b)?, "{name} changed");
    }
    assert_eq!(layout::config_entry(&reloaded), Some(expected));
    let again = Llama::forward(&reloaded, &config, &tokens, &mut Context::evaluation())?;
    let expected_logits = Llama::forward(&rounded, &config, &tokens, &mut Context::evaluation())?;
    assert_eq!(max_error(&again, &expected_logits), 0.0);
    assert!(max_error(&again, &logits) < 0.05, "float16 rounding only");
    if std::env::var_os("LMX_QUANT_EXPORT").is_some() {
        let io = [("tokens", &tokens), ("logits", &again)];
        Array::save_safetensors(io, None, exported.join("io.safetensors")).unwrap();
    }

    // Dequantized, the model is a plain one again, and its export says so.
    quant::dequantize_tree(&mut params)?;
    assert_eq!(layout::config_entry(&params), None);
    Ok(())
}

/// GPT-2 in mlx-lm's layout (`tests/fixtures/gpt2_q_mlx_lm`: the float folder `hf/gpt2`
/// quantized by mlx-lm, 4 bits in groups of 32, saved under mlx-lm's names, `model.h.0...`, with
/// the `Conv1D` weights `[out, in]` where transformers stores them `[in, out]`). lmx's own
/// quantization of the float folder is mlx-lm's, tensor for tensor under those names; the folder
/// loads with mlx-lm's logits and greedy continuation; lmx's export of it is mlx-lm's file.
#[test]
fn gpt2_in_mlx_lm_layout_is_read_and_written_as_mlx_lm_does() -> Result<()> {
    use lmx::models::gpt2::Gpt2;
    let mlx_lm = fixture("gpt2_q_mlx_lm");
    let stored = Array::load_safetensors(mlx_lm.join("model.safetensors")).unwrap();
    let same_as_stored = |params: &<Gpt2 as LanguageModel>::Params, what: &str| {
        let names = tree::names(params);
        assert_eq!(names.len(), stored.len(), "{what}: the tensors stored");
        for (name, leaf) in names.iter().zip(tree::flatten(params)) {
            let theirs = &stored[&format!("model.{name}")];
            assert_eq!(leaf.dtype(), theirs.dtype(), "{what}: {name}");
            assert!(leaf.eq_values(theirs).unwrap(), "{what}: {name} differs");
        }
    };

    let float = HfFolder::open(&fixture("hf/gpt2"))?;
    let (_, mut quantized) = hf::load_model::<Gpt2>(&float, Some(Dtype::Float32))?;
    let report = quant::quantize_tree(&mut quantized, Quantization::new(32, 4)?)?;
    // Per block c_attn, the attention's c_proj, c_fc and the MLP's c_proj; wte and wpe.
    assert_eq!(report.quantized.len(), 2 * 4 + 2);
    same_as_stored(&quantized, "lmx's quantization");

    let folder = HfFolder::open(&mlx_lm)?;
    let (config, params) = hf::load_model::<Gpt2>(&folder, Some(Dtype::Float32))?;
    same_as_stored(&params, "the folder read");
    let (tokens, expected, greedy) = io_of("gpt2_q_mlx_lm_io.safetensors");
    assert_logits_and_greedy::<Gpt2>(&params, &config, &tokens, &expected, &greedy, 8, TOLERANCE)?;

    let out = tempfile::tempdir().unwrap();
    let exported = out.path().join("q4");
    let lmx_config = serde_json::to_value(&config).unwrap();
    let spec = hf::ExportSpec {
        lmx_config: &lmx_config,
        source_config: Some(folder.config()),
        dtype: Dtype::Float32,
        carry: &[],
        max_shard_bytes: hf::DEFAULT_MAX_SHARD_BYTES,
    };
    hf::export(&exported, folder.family(), &params, &spec)?;
    assert_same_tensors(
        &exported.join("model.safetensors"),
        &mlx_lm.join("model.safetensors"),
    );
    let (_, reloaded) = hf::load_model::<Gpt2>(&HfFolder::open(&exported)?, Some(Dtype::Float32))?;
    same_as_stored(&reloaded, "the export read back");

    // A layer of its own setting is named in `config.json` as mlx-lm's tree names it, and read
    // back so. With `LMX_QUANT_EXPORT=DIR` the export is left in DIR with `io.safetensors`, for
    // `tests/reference/quantized.py --check DIR` to load in mlx-lm.
    let (_, mut mixed) = hf::load_model::<Gpt2>(&float, Some(Dtype::Float32))?;
    let eight = Quantization::new(32, 8)?;
    let c_fc = &mut mixed.h[1].mlp.c_fc;
    let (w, s, b) = quant::quantize_weight("h.1.mlp.c_fc", &c_fc.weight, eight)?;
    (c_fc.weight, c_fc.scales, c_fc.biases) = (w, Some(s), Some(b));
    c_fc.quantization = Some(eight);
    quant::quantize_tree(&mut mixed, Quantization::new(32, 4)?)?;
    let exported = match std::env::var_os("LMX_QUANT_EXPORT") {
        Some(dir) => PathBuf::from(dir),
        None => out.path().join("mixed"),
    };
    hf::export(&exported, folder.family(), &mixed, &spec)?;
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(exported.join("config.json")).unwrap())
            .unwrap();
    assert_eq!(
        written["quantization"],
        serde_json::json!({"group_size": 32, "bits": 4, "mode": "affine",
                           "model.h.1.mlp.c_fc": {"group_size": 32, "bits": 8, "mode": "affine"}})
    );
    let (_, reloaded) = hf::load_model::<Gpt2>(&HfFolder::open(&exported)?, Some(Dtype::Float32))?;
    assert_eq!(reloaded.h[1].mlp.c_fc.quantization, Some(eight));
    for ((name, a), b) in tree::names(&mixed)
        .iter()
        .zip(tree::flatten(&mixed))
        .zip(tree::flatten(&reloaded))
    {
        assert!(a.eq_values(&b)?, "{name} changed");
    }

    // A stored tensor of the wrong shape under mlx-lm's names is told as the setting it breaks.
    let broken = out.path().join("broken");
    std::fs::create_dir(&broken).unwrap();
    std::fs::copy(mlx_lm.join("config.json"), broken.join("config.json")).unwrap();
    let mut tensors = stored.clone();
    tensors.insert(
        "model.h.0.attn.c_attn.scales".into(),
        Array::zeros::<f32>(&[96, 2]).unwrap(),
    );
    let weights = broken.join("model.safetensors");
    Array::save_safetensors(tensors.iter().map(|(k, v)| (k.as_str(), v)), None, &weights).unwrap();
    let error = message(hf::load_model::<Gpt2>(&HfFolder::open(&broken)?, None));
    assert_eq!(
        error,
        format!(
            "{}: tensor `model.h.0.attn.c_attn.scales` has shape [96, 2], not [96, 1]; {}: \
             quantization makes `model.h.0.attn.c_attn` 4-bit in groups of 32",
            weights.display(),
            broken.join("config.json").display()
        )
    );
    if std::env::var_os("LMX_QUANT_EXPORT").is_some() {
        let logits = Gpt2::forward(&reloaded, &config, &tokens, &mut Context::evaluation())?;
        let io = [("tokens", &tokens), ("logits", &logits)];
        Array::save_safetensors(io, None, exported.join("io.safetensors")).unwrap();
    }
    Ok(())
}

/// mlx-lm saves a tied model without `lm_head` (its head is `embed_tokens.as_linear`): lmx's
/// LLaMA then ties its head too, the quantized embedding (packed weight, scales and biases)
/// serving as the head, as an untied head holding a copy of it would.
#[test]
fn a_tied_quantized_model_uses_the_quantized_embedding_as_its_head() -> Result<()> {
    let dir = edited(|config| {
        config["tie_word_embeddings"] = true.into();
        for key in ["quantization", "quantization_config"] {
            config[key].as_object_mut().unwrap().remove("lm_head");
        }
    });
    let weights = dir.path().join("model.safetensors");
    let mut tensors = Array::load_safetensors(&weights).unwrap();
    tensors.retain(|name, _| !name.starts_with("lm_head."));
    std::fs::remove_file(dir.path().join("model.safetensors.index.json")).unwrap();
    let edited_file = dir.path().join("edited.safetensors");
    Array::save_safetensors(
        tensors.iter().map(|(k, v)| (k.as_str(), v)),
        None,
        &edited_file,
    )
    .unwrap();
    std::fs::rename(&edited_file, &weights).unwrap();

    let (config, params) = load(dir.path())?;
    assert!(config.tie && params.lm_head.is_none());
    let embed = &params.model.embed_tokens;
    assert_eq!(embed.quantization, Some(Quantization::new(32, 4)?));
    let (tokens, _, _) = io();
    let logits = Llama::forward(&params, &config, &tokens, &mut Context::evaluation())?;
    assert_eq!(logits.shape(), &[2, 8, 256]);

    let mut untied_config = config.clone();
    untied_config.tie = false;
    let mut untied = params.clone();
    untied.lm_head = Some(LinearParams {
        scales: embed.scales.clone(),
        biases: embed.biases.clone(),
        quantization: embed.quantization,
        ..LinearParams::new(embed.weight.clone(), None)
    });
    let copied = Llama::forward(&untied, &untied_config, &tokens, &mut Context::evaluation())?;
    assert!(logits.eq_values(&copied)?, "the tied head is the embedding");
    Ok(())
}

/// A copy of the mlx-lm fixture with `edit` applied to its config.json.
fn edited(edit: impl FnOnce(&mut serde_json::Value)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let source = fixture("llama_q_mlx_lm");
    for file in ["model.safetensors", "model.safetensors.index.json"] {
        std::fs::copy(source.join(file), dir.path().join(file)).unwrap();
    }
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(source.join("config.json")).unwrap())
            .unwrap();
    edit(&mut config);
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    dir
}

fn message(result: Result<impl Sized>) -> String {
    match result {
        Ok(_) => panic!("expected an error"),
        Err(err) => err.to_string(),
    }
}

#[test]
fn bad_quantized_folders_fail_naming_file_layer_and_setting() {
    let dir = edited(|config| config["quantization"]["bits"] = 7.into());
    let config = dir.path().join("config.json");
    assert_eq!(
        message(load(dir.path())),
        format!(
            "{}: quantization: 7-bit quantization is not supported: MLX's affine quantization \
             takes 2, 3, 4, 5, 6 or 8 bits",
            config.display()
        )
    );

    let dir = edited(|config| {
        config["quantization"]["model.layers.0.mlp.down_proj"] =
            serde_json::json!({"group_size": 32, "bits": 4});
    });
    assert_eq!(
        message(load(dir.path())),
        "model.layers.0.mlp.down_proj: its rows of 172 values do not divide into groups of 32"
    );

    let dir = edited(|config| {
        config["quantization"]["model.layers.9.mlp.up_proj"] = false.into();
    });
    let config = dir.path().join("config.json");
    assert_eq!(
        message(load(dir.path())),
        format!(
            "{}: quantization.model.layers.9.mlp.up_proj: the model has no linear layer, \
             embedding or expert projection `model.layers.9.mlp.up_proj`",
            config.display()
        )
    );

    let dir = edited(|config| config["quantization"]["mode"] = "mxfp4".into());
    assert!(matches!(load(dir.path()), Err(Error::Quantization(_))));

    // A scales tensor of the wrong shape: the loader names the file and the tensor.
    let dir = edited(|_| {});
    let weights = dir.path().join("model.safetensors");
    let mut tensors = Array::load_safetensors(&weights).unwrap();
    let name = "model.layers.0.self_attn.q_proj.scales";
    tensors.insert(name.into(), Array::zeros::<f32>(&[64, 1]).unwrap());
    std::fs::remove_file(dir.path().join("model.safetensors.index.json")).unwrap();
    // Written beside and renamed over: the loaded tensors still read the old file.
    let edited = dir.path().join("edited.safetensors");
    Array::save_safetensors(tensors.iter().map(|(k, v)| (k.as_str(), v)), None, &edited).unwrap();
    std::fs::rename(&edited, &weights).unwrap();
    let error = message(load(dir.path()));
    assert!(
        error.contains(&weights.display().to_string()) && error.contains(name),
        "{error}"
    );
}

/// A run records its quantization with every packed layer named (`layout::record`), and a fresh
/// template laid out from the record alone (`layout::prepare_recorded`, no weights file asked)
/// loads the packed checkpoint back: layers at the default (`true`), one quantized otherwise (its
/// own entry) and one left dense (`false`). A record naming a layer the model lacks is refused,
/// naming the record's place and the layer.
#[test]
fn a_run_s_record_of_its_quantization_lays_out_its_checkpoint() -> Result<()> {
    let folder = HfFolder::open(&fixture("hf/llama"))?;
    let (config, mut params) = hf::load_model::<Llama>(&folder, Some(Dtype::Float32))?;
    let eight = Quantization::new(32, 8)?;
    let lm_head = params.lm_head.as_mut().expect("an untied head");
    let (w, s, b) = quant::quantize_weight("lm_head", &lm_head.weight, eight)?;
    (lm_head.weight, lm_head.scales, lm_head.biases) = (w, Some(s), Some(b));
    lm_head.quantization = Some(eight);
    // The embedding stays dense.
    let embedding = params.model.embed_tokens.clone();
    quant::quantize_tree(&mut params, Quantization::new(32, 4)?)?;
    params.model.embed_tokens = embedding;

    let record = layout::record(&params).expect("some layers are packed");
    let mut expected = serde_json::json!({
        "group_size": 32, "bits": 4, "mode": "affine",
        "lm_head": {"group_size": 32, "bits": 8, "mode": "affine"},
        "model.embed_tokens": false,
    });
    for block in 0..2 {
        for layer in [
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        ] {
            expected[format!("model.layers.{block}.{layer}")] = true.into();
        }
    }
    assert_eq!(record, expected);

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("model.safetensors");
    lmx::runtime::checkpoint::save_tree(&file, &params)?;
    let mut template = Llama::init(&config, 0)?;
    layout::prepare_recorded(&mut template, &record, "RUN/run.json")?;
    let back = lmx::runtime::checkpoint::load_tree(&file, &template)?;
    for ((name, a), b) in tree::names(&params)
        .iter()
        .zip(tree::flatten(&params))
        .zip(tree::flatten(&back))
    {
        assert_eq!(a.dtype(), b.dtype(), "{name}");
        assert!(a.eq_values(&b)?, "{name} changed");
    }
    assert_eq!(layout::record(&back), Some(record.clone()));

    let mut wrong = record;
    wrong["model.layers.9.mlp.up_proj"] = true.into();
    let err = layout::prepare_recorded(&mut Llama::init(&config, 0)?, &wrong, "RUN/run.json")
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "RUN/run.json: quantization.model.layers.9.mlp.up_proj: the model has no linear layer, \
         embedding or expert projection `model.layers.9.mlp.up_proj`"
    );
    Ok(())
}
