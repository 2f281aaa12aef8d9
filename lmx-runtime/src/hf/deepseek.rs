//! `config.json` of DeepSeek-V2 (`deepseek_v2`, `models/deepseek_v2.lmx`) and DeepSeek-V3
//! (`deepseek_v3`, `models/deepseek_v3.lmx`) as the bundled models' settings, and back; with
//! YaRN's RoPE scaling (`rope_scaling` or `rope_parameters` of type `yarn`), which V2, V2-Lite
//! and V3 publish. The two share latent attention and shared plus routed experts; V3 routes by
//! sigmoid scores, a selection bias and groups of experts.

use super::config::{rope, ConfigReader, Rope};
use super::error::{HfError, Inexpressible};
use serde_json::{json, Map, Value};

/// The version of DeepSeek's architecture a family maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Version {
    V2,
    V3,
}

/// transformers' config-class defaults that differ between V2 and V3, in the order `vocab`,
/// `max_position_embeddings`, `hidden_size`, `num_hidden_layers`, `num_attention_heads`,
/// `intermediate_size`, `moe_intermediate_size`, `n_routed_experts`, `n_shared_experts`,
/// `num_experts_per_tok` (V2's `None` would fail in transformers' own router; 6 is V2's and
/// V2-Lite's).
fn defaults(version: Version) -> [i64; 10] {
    match version {
        Version::V2 => [102400, 2048, 4096, 32, 32, 11008, 1407, 64, 2, 6],
        Version::V3 => [129280, 4096, 7168, 61, 128, 18432, 2048, 256, 1, 8],
    }
}

/// The bundled model's settings for DeepSeek-V2's or V3's `config.json`.
pub(crate) fn lmx_config(
    hf: &ConfigReader,
    tied: bool,
    version: Version,
) -> Result<Map<String, Value>, HfError> {
    let mut out = Map::new();
    let mut set = |key: &str, value: Value| out.insert(key.to_owned(), value);
    let [vocab, ctx, d_model, n_layers, n_heads, d_ff, moe_d_ff, routed, shared, per_token] =
        defaults(version);
    let model = match version {
        Version::V2 => "the bundled deepseek_v2 model",
        Version::V3 => "the bundled deepseek_v3 model",
    };
    let n_heads = hf.size_or("num_attention_heads", n_heads)?;
    set("vocab", hf.size_or("vocab_size", vocab)?.into());
    set("ctx", hf.size_or("max_position_embeddings", ctx)?.into());
    set("d_model", hf.size_or("hidden_size", d_model)?.into());
    set(
        "n_layers",
        hf.size_or("num_hidden_layers", n_layers)?.into(),
    );
    set("n_heads", n_heads.into());
    set("d_ff", hf.size_or("intermediate_size", d_ff)?.into());
    set(
        "moe_d_ff",
        hf.size_or("moe_intermediate_size", moe_d_ff)?.into(),
    );
    set("n_experts", hf.size_or("n_routed_experts", routed)?.into());
    set("n_shared", hf.size_or("n_shared_experts", shared)?.into());
    set(
        "experts_per_token",
        hf.size_or("num_experts_per_tok", per_token)?.into(),
    );
    let first_dense = match hf.get("first_k_dense_replace") {
        None if version == Version::V3 => 3,
        None => 0,
        Some(value) => value.as_i64().filter(|&n| n >= 0).ok_or_else(|| {
            hf.error(
                "first_k_dense_replace",
                value,
                "must be an integer of at least 0",
            )
        })?,
    };
    set("first_dense", first_dense.into());
    // `q_lora_rank: null` (V2-Lite) projects queries directly: 0 here.
    let q_rank = if hf.object_has_null("q_lora_rank") {
        0
    } else {
        hf.size_or("q_lora_rank", 1536)?
    };
    if version == Version::V3 {
        set("n_group", hf.size_or("n_group", 8)?.into());
        set("topk_group", hf.size_or("topk_group", 4)?.into());
        let norm_topk = match hf.get("norm_topk_prob") {
            None => true,
            Some(value) => value
                .as_bool()
                .ok_or_else(|| hf.error("norm_topk_prob", value, "must be true or false"))?,
        };
        set("norm_topk", norm_topk.into());
        hf.require(
            "rope_interleave",
            true.into(),
            &format!("{model} rotates DeepSeek's interleaved pairs"),
        )?;
    }
    set("q_rank", q_rank.into());
    set("kv_rank", hf.size_or("kv_lora_rank", 512)?.into());
    set("nope_dim", hf.size_or("qk_nope_head_dim", 128)?.into());
    set("rope_dim", hf.size_or("qk_rope_head_dim", 64)?.into());
    set("v_dim", hf.size_or("v_head_dim", 128)?.into());
    set("eps", hf.float_or("rms_norm_eps", 1e-6)?.into());
    let scale = match version {
        Version::V2 => 1.0,
        Version::V3 => 2.5,
    };
    set(
        "routed_scale",
        hf.float_or("routed_scaling_factor", scale)?.into(),
    );
    for (key, value) in yarn(hf, model)? {
        set(key, value);
    }
    hf.require(
        "num_key_value_heads",
        n_heads.into(),
        &format!("{model}'s latent attention has a key and value per query head"),
    )?;
    hf.one_of("hidden_act", &["silu"], &format!("{model}'s MLPs use SiLU"))?;
    let no_bias = format!("{model}'s projections have no bias");
    hf.require("attention_bias", false.into(), &no_bias)?;
    hf.require("mlp_bias", false.into(), &no_bias)?;
    // V2: group-limited routing (V2's 236B model) picks among groups first; greedy is
    // V2-Lite's. V3's checkpoints name their routing `noaux_tc` (transformers does not read it).
    match version {
        Version::V2 => hf.one_of(
            "topk_method",
            &["greedy"],
            "the bundled deepseek_v2 model routes greedily (top-k over every expert)",
        )?,
        Version::V3 => hf.one_of(
            "topk_method",
            &["noaux_tc"],
            "the bundled deepseek_v3 model routes by sigmoid scores and a selection bias \
             among groups of experts (noaux_tc)",
        )?,
    }
    if tied {
        return Err(hf.error(
            "tie_word_embeddings",
            &true.into(),
            format!("{model}'s output head is its own"),
        ));
    }
    Ok(out)
}

/// The RoPE settings: the base, and YaRN's scaling when `config.json` asks for it (otherwise a
/// factor of 1, with which YaRN's periods and attention factor are plain RoPE's).
fn yarn(hf: &ConfigReader, model: &str) -> Result<Vec<(&'static str, Value)>, HfError> {
    let Rope { base, kind, params } = rope(
        hf,
        10000.0,
        &["yarn"],
        &format!("{model} applies RoPE unscaled or with YaRN's scaling (yarn)"),
    )?;
    let mut settings = vec![("rope_base", base.into())];
    if kind == "yarn" {
        if let Some(value) = params.get("attention_factor") {
            return Err(params.error(
                "attention_factor",
                value,
                format!("{model} derives YaRN's attention factor from mscale and mscale_all_dim"),
            ));
        }
        settings.extend([
            ("rope_factor", params.float_or("factor", 1.0)?.into()),
            (
                "rope_original_ctx",
                params
                    .size_or("original_max_position_embeddings", 4096)?
                    .into(),
            ),
            ("rope_beta_fast", params.float_or("beta_fast", 32.0)?.into()),
            ("rope_beta_slow", params.float_or("beta_slow", 1.0)?.into()),
            ("rope_mscale", params.float_or("mscale", 1.0)?.into()),
            (
                "rope_mscale_all_dim",
                params.float_or("mscale_all_dim", 0.0)?.into(),
            ),
        ]);
    } else {
        settings.extend([
            ("rope_factor", 1.0.into()),
            ("rope_mscale", 1.0.into()),
            ("rope_mscale_all_dim", 0.0.into()),
        ]);
    }
    Ok(settings)
}

/// DeepSeek-V2's or V3's `config.json` for the bundled model's settings `lmx`
/// (`router_aux_coef` only matters to training, as transformers' dropout rates do, and is not
/// written).
pub(crate) fn hf_config(lmx: &Value, version: Version) -> Result<Value, Inexpressible> {
    let get = |key: &str| lmx.get(key).cloned().unwrap_or(Value::Null);
    let float = |key: &str| lmx.get(key).and_then(Value::as_f64).unwrap_or(0.0);
    let q_rank = match lmx.get("q_rank").and_then(Value::as_i64) {
        Some(0) | None => Value::Null,
        Some(_) => get("q_rank"),
    };
    let rope_scaling = if float("rope_factor") == 1.0 {
        Value::Null
    } else {
        json!({
            "type": "yarn",
            "rope_type": "yarn",
            "factor": get("rope_factor"),
            "original_max_position_embeddings": get("rope_original_ctx"),
            "beta_fast": get("rope_beta_fast"),
            "beta_slow": get("rope_beta_slow"),
            "mscale": get("rope_mscale"),
            "mscale_all_dim": get("rope_mscale_all_dim"),
        })
    };
    let mut config = json!({
        "vocab_size": get("vocab"),
        "max_position_embeddings": get("ctx"),
        "hidden_size": get("d_model"),
        "num_hidden_layers": get("n_layers"),
        "num_attention_heads": get("n_heads"),
        "num_key_value_heads": get("n_heads"),
        "intermediate_size": get("d_ff"),
        "moe_intermediate_size": get("moe_d_ff"),
        "n_routed_experts": get("n_experts"),
        "n_shared_experts": get("n_shared"),
        "num_experts_per_tok": get("experts_per_token"),
        "first_k_dense_replace": get("first_dense"),
        "q_lora_rank": q_rank,
        "kv_lora_rank": get("kv_rank"),
        "qk_nope_head_dim": get("nope_dim"),
        "qk_rope_head_dim": get("rope_dim"),
        "v_head_dim": get("v_dim"),
        "rms_norm_eps": get("eps"),
        "routed_scaling_factor": get("routed_scale"),
        "rope_theta": get("rope_base"),
        "rope_scaling": rope_scaling,
        "topk_method": "greedy",
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": false,
        "hidden_act": "silu",
        "attention_bias": false,
        "mlp_bias": false,
        "tie_word_embeddings": false,
    });
    if version == Version::V3 {
        let object = config.as_object_mut().expect("an object");
        object.remove("topk_method");
        object.insert("n_group".into(), get("n_group"));
        object.insert("topk_group".into(), get("topk_group"));
        object.insert("norm_topk_prob".into(), get("norm_topk"));
        object.insert("rope_interleave".into(), true.into());
    }
    Ok(config)
}
