//! `config.json` of Qwen3-Next (`qwen3_next`, `models/qwen3_next.lmx`) as the bundled model's
//! settings, and back: Gated DeltaNet and gated attention layers by a static pattern, dense or
//! sparse MLPs by another.

use super::config::{rope, ConfigReader};
use super::error::{HfError, Inexpressible};
use serde_json::{json, Map, Value};

const MODEL: &str = "the bundled qwen3_next model";

/// The bundled model's settings for transformers' `Qwen3NextConfig` (`tied`: the head is the
/// embedding).
pub(crate) fn lmx_config(hf: &ConfigReader, tied: bool) -> Result<Map<String, Value>, HfError> {
    let mut out = Map::new();
    let mut set = |key: &str, value: Value| out.insert(key.to_owned(), value);
    let n_layers = hf.size_or("num_hidden_layers", 48)?;
    let head_dim = hf.size_or("head_dim", 256)?;
    let k_heads = hf.size_or("linear_num_key_heads", 16)?;
    let v_heads = hf.size_or("linear_num_value_heads", 32)?;
    set("vocab", hf.size_or("vocab_size", 151936)?.into());
    set("ctx", hf.size_or("max_position_embeddings", 32768)?.into());
    set("d_model", hf.size_or("hidden_size", 2048)?.into());
    set("n_layers", n_layers.into());
    set("attn_every", attention_interval(hf, n_layers)?.into());
    set("n_heads", hf.size_or("num_attention_heads", 16)?.into());
    set("n_kv_heads", hf.size_or("num_key_value_heads", 2)?.into());
    set("head_dim", head_dim.into());
    if v_heads % k_heads != 0 {
        return Err(hf.error(
            "linear_num_value_heads",
            &Value::from(v_heads),
            "must be a multiple of linear_num_key_heads (each key head serves whole value heads)",
        ));
    }
    set("lin_k_heads", k_heads.into());
    set("lin_v_heads", v_heads.into());
    set("lin_k_dim", hf.size_or("linear_key_head_dim", 128)?.into());
    set(
        "lin_v_dim",
        hf.size_or("linear_value_head_dim", 128)?.into(),
    );
    set("d_conv", hf.size_or("linear_conv_kernel_dim", 4)?.into());
    set("d_ff", hf.size_or("intermediate_size", 5632)?.into());
    let n_experts = match hf.get("num_experts") {
        None => 512,
        Some(value) => value
            .as_i64()
            .filter(|&n| n >= 0)
            .ok_or_else(|| hf.error("num_experts", value, "must be an integer of at least 0"))?,
    };
    set("n_experts", n_experts.into());
    set(
        "experts_per_token",
        hf.size_or("num_experts_per_tok", 10)?.into(),
    );
    set("moe_d_ff", hf.size_or("moe_intermediate_size", 512)?.into());
    set(
        "shared_d_ff",
        hf.size_or("shared_expert_intermediate_size", 512)?.into(),
    );
    set("sparse_step", hf.size_or("decoder_sparse_step", 1)?.into());
    let norm_topk = match hf.get("norm_topk_prob") {
        None => true,
        Some(value) => value
            .as_bool()
            .ok_or_else(|| hf.error("norm_topk_prob", value, "must be true or false"))?,
    };
    set("norm_topk", norm_topk.into());
    // transformers adds the balancing loss only with `output_router_logits`.
    let aux = match hf.get("output_router_logits").and_then(Value::as_bool) {
        Some(true) => hf.float_or("router_aux_loss_coef", 0.001)?,
        _ => 0.0,
    };
    set("router_aux_coef", aux.into());
    set("eps", hf.float_or("rms_norm_eps", 1e-6)?.into());
    let rope = rope(hf, 10000.0, &[], &format!("{MODEL} applies RoPE unscaled"))?;
    set("rope_base", rope.base.into());
    // transformers 5 keeps the fraction in `rope_parameters`, 4 beside it.
    let fraction = rope.params.float_or(
        "partial_rotary_factor",
        hf.float_or("partial_rotary_factor", 0.25)?,
    )?;
    let rope_dims = (head_dim as f64 * fraction) as i64;
    if rope_dims < 2 || rope_dims % 2 != 0 || rope_dims > head_dim {
        return Err(hf.error(
            "partial_rotary_factor",
            &Value::from(fraction),
            format!("must turn an even number of a head's {head_dim} features, at least 2"),
        ));
    }
    set("rope_dims", rope_dims.into());
    set("tie", tied.into());
    if let Some(layers) = hf.get("mlp_only_layers") {
        if layers.as_array().is_none_or(|layers| !layers.is_empty()) {
            return Err(hf.error(
                "mlp_only_layers",
                layers,
                format!("{MODEL} chooses its dense layers by decoder_sparse_step alone"),
            ));
        }
    }
    hf.one_of(
        "hidden_act",
        &["silu"],
        &format!("{MODEL}'s MLPs and convolution use SiLU"),
    )?;
    hf.require(
        "attention_bias",
        false.into(),
        &format!("{MODEL}'s projections have no bias"),
    )?;
    Ok(out)
}

/// The `attn_every` whose pattern (layer `i` attends when `(i + 1) % attn_every == 0`) is
/// `layer_types`, or `full_attention_interval` (default 4) when `layer_types` is absent.
fn attention_interval(hf: &ConfigReader, n_layers: i64) -> Result<i64, HfError> {
    let Some(types) = hf.get("layer_types") else {
        return hf.size_or("full_attention_interval", 4);
    };
    let kinds: Option<Vec<&str>> = types
        .as_array()
        .and_then(|types| types.iter().map(Value::as_str).collect());
    // The first attention layer fixes the interval; with none, one past the last layer.
    let every = kinds
        .as_ref()
        .and_then(|kinds| kinds.iter().position(|&kind| kind == "full_attention"))
        .map_or(n_layers + 1, |first| first as i64 + 1);
    if kinds.is_some_and(|kinds| kinds == layer_types(n_layers, every)) {
        Ok(every)
    } else {
        Err(hf.error(
            "layer_types",
            types,
            format!(
                "{MODEL} attends in every n-th layer and runs Gated DeltaNet in the others \
                 (full_attention_interval's pattern)"
            ),
        ))
    }
}

/// transformers' `layer_types` for `n_layers` layers attending every `every`-th.
fn layer_types(n_layers: i64, every: i64) -> Vec<&'static str> {
    (0..n_layers)
        .map(|i| {
            if (i + 1) % every == 0 {
                "full_attention"
            } else {
                "linear_attention"
            }
        })
        .collect()
}

/// Qwen3-Next's `config.json` for the bundled model's settings `lmx`.
pub(crate) fn hf_config(lmx: &Value) -> Result<Value, Inexpressible> {
    let get = |key: &str| lmx.get(key).cloned().unwrap_or(Value::Null);
    let int = |key: &str| lmx.get(key).and_then(Value::as_i64).unwrap_or(0);
    let aux = lmx
        .get("router_aux_coef")
        .and_then(Value::as_f64)
        .unwrap_or(0.0);
    let fraction = int("rope_dims") as f64 / int("head_dim").max(1) as f64;
    Ok(json!({
        "vocab_size": get("vocab"),
        "max_position_embeddings": get("ctx"),
        "hidden_size": get("d_model"),
        "num_hidden_layers": get("n_layers"),
        "layer_types": layer_types(int("n_layers"), int("attn_every").max(1)),
        "full_attention_interval": get("attn_every"),
        "num_attention_heads": get("n_heads"),
        "num_key_value_heads": get("n_kv_heads"),
        "head_dim": get("head_dim"),
        "linear_num_key_heads": get("lin_k_heads"),
        "linear_num_value_heads": get("lin_v_heads"),
        "linear_key_head_dim": get("lin_k_dim"),
        "linear_value_head_dim": get("lin_v_dim"),
        "linear_conv_kernel_dim": get("d_conv"),
        "intermediate_size": get("d_ff"),
        "num_experts": get("n_experts"),
        "num_experts_per_tok": get("experts_per_token"),
        "moe_intermediate_size": get("moe_d_ff"),
        "shared_expert_intermediate_size": get("shared_d_ff"),
        "decoder_sparse_step": get("sparse_step"),
        "mlp_only_layers": [],
        "norm_topk_prob": get("norm_topk"),
        "output_router_logits": aux != 0.0,
        "router_aux_loss_coef": aux,
        "rms_norm_eps": get("eps"),
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": get("rope_base"),
            "partial_rotary_factor": fraction,
        },
        "hidden_act": "silu",
        "attention_bias": false,
        "tie_word_embeddings": get("tie"),
    }))
}
