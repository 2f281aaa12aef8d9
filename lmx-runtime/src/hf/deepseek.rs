//! `config.json` of DeepSeek-V2 (`deepseek_v2`, `models/deepseek_v2.lmx`) as the bundled
//! model's settings, and back; with YaRN's RoPE scaling (`rope_scaling` or `rope_parameters` of
//! type `yarn`), which V2 and V2-Lite publish.

use super::config::{rope, ConfigReader, Rope};
use super::error::{HfError, Inexpressible};
use serde_json::{json, Map, Value};

/// The bundled model's settings for DeepSeek-V2's `config.json`.
pub(crate) fn lmx_config(hf: &ConfigReader, tied: bool) -> Result<Map<String, Value>, HfError> {
    let mut out = Map::new();
    let mut set = |key: &str, value: Value| out.insert(key.to_owned(), value);
    let n_heads = hf.size_or("num_attention_heads", 32)?;
    set("vocab", hf.size_or("vocab_size", 102400)?.into());
    set("ctx", hf.size_or("max_position_embeddings", 2048)?.into());
    set("d_model", hf.size_or("hidden_size", 4096)?.into());
    set("n_layers", hf.size_or("num_hidden_layers", 32)?.into());
    set("n_heads", n_heads.into());
    set("d_ff", hf.size_or("intermediate_size", 11008)?.into());
    set(
        "moe_d_ff",
        hf.size_or("moe_intermediate_size", 1407)?.into(),
    );
    set("n_experts", hf.size_or("n_routed_experts", 64)?.into());
    set("n_shared", hf.size_or("n_shared_experts", 2)?.into());
    // transformers' default (`None`) would fail in its own router; 6 is V2's and V2-Lite's.
    set(
        "experts_per_token",
        hf.size_or("num_experts_per_tok", 6)?.into(),
    );
    let first_dense = match hf.get("first_k_dense_replace") {
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
    set("q_rank", q_rank.into());
    set("kv_rank", hf.size_or("kv_lora_rank", 512)?.into());
    set("nope_dim", hf.size_or("qk_nope_head_dim", 128)?.into());
    set("rope_dim", hf.size_or("qk_rope_head_dim", 64)?.into());
    set("v_dim", hf.size_or("v_head_dim", 128)?.into());
    set("eps", hf.float_or("rms_norm_eps", 1e-6)?.into());
    set(
        "routed_scale",
        hf.float_or("routed_scaling_factor", 1.0)?.into(),
    );
    for (key, value) in yarn(hf)? {
        set(key, value);
    }
    hf.require(
        "num_key_value_heads",
        n_heads.into(),
        "the bundled deepseek_v2 model's latent attention has a key and value per query head",
    )?;
    hf.one_of(
        "hidden_act",
        &["silu"],
        "the bundled deepseek_v2 model's MLPs use SiLU",
    )?;
    let no_bias = "the bundled deepseek_v2 model's projections have no bias";
    hf.require("attention_bias", false.into(), no_bias)?;
    hf.require("mlp_bias", false.into(), no_bias)?;
    // Group-limited routing (V2's 236B model) picks among groups first; greedy is V2-Lite's.
    hf.one_of(
        "topk_method",
        &["greedy"],
        "the bundled deepseek_v2 model routes greedily (top-k over every expert)",
    )?;
    if tied {
        return Err(hf.error(
            "tie_word_embeddings",
            &true.into(),
            "the bundled deepseek_v2 model's output head is its own",
        ));
    }
    Ok(out)
}

/// The RoPE settings: the base, and YaRN's scaling when `config.json` asks for it (otherwise a
/// factor of 1, with which YaRN's periods and attention factor are plain RoPE's).
fn yarn(hf: &ConfigReader) -> Result<Vec<(&'static str, Value)>, HfError> {
    let Rope { base, kind, params } = rope(
        hf,
        10000.0,
        &["yarn"],
        "the bundled deepseek_v2 model applies RoPE unscaled or with YaRN's scaling (yarn)",
    )?;
    let mut settings = vec![("rope_base", base.into())];
    if kind == "yarn" {
        if let Some(value) = params.get("attention_factor") {
            return Err(params.error(
                "attention_factor",
                value,
                "the bundled deepseek_v2 model derives YaRN's attention factor from mscale and \
                 mscale_all_dim",
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

/// DeepSeek-V2's `config.json` for the bundled model's settings `lmx` (`router_aux_coef` only
/// matters to training, as transformers' dropout rates do, and is not written).
pub(crate) fn hf_config(lmx: &Value) -> Result<Value, Inexpressible> {
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
    Ok(json!({
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
    }))
}
