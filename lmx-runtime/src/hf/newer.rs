//! `config.json` of the families added with issue 24 (Qwen2, Qwen3, Gemma 2, Gemma 3 text,
//! Phi-3) as the bundled models' settings, and back.

use super::config::{rope, rope_base, rope_in, ConfigReader};
use super::error::{HfError, Inexpressible};
use super::family::Family;
use serde_json::{json, Map, Value};

/// The layer kinds of transformers' `layer_types`.
const SLIDING: &str = "sliding_attention";
const FULL: &str = "full_attention";

/// The bundled model's settings for `config.json` of `family` (`tied`: its head is the
/// embedding).
pub(crate) fn lmx_config(
    family: Family,
    hf: &ConfigReader,
    tied: bool,
) -> Result<Map<String, Value>, HfError> {
    let model = family.model_name();
    let mut out = Map::new();
    let d_model = hf.size_or("hidden_size", 4096)?;
    let n_heads = hf.size_or("num_attention_heads", 32)?;
    let n_layers = hf.size_or("num_hidden_layers", 32)?;
    let ctx = hf.size_or("max_position_embeddings", 4096)?;
    out.insert("vocab".into(), hf.size_or("vocab_size", 32000)?.into());
    out.insert("ctx".into(), ctx.into());
    out.insert("d_model".into(), d_model.into());
    out.insert("n_layers".into(), n_layers.into());
    out.insert("n_heads".into(), n_heads.into());
    out.insert(
        "n_kv_heads".into(),
        hf.size_or("num_key_value_heads", n_heads)?.into(),
    );
    out.insert(
        "d_ff".into(),
        hf.size_or("intermediate_size", 11008)?.into(),
    );
    out.insert("eps".into(), hf.float_or("rms_norm_eps", 1e-6)?.into());
    let no_bias = format!("the bundled {model} model's projections have no bias");
    match family {
        Family::Qwen2 | Family::Qwen3 => {
            for (key, value) in qwen_rope(hf, model)? {
                out.insert(key.into(), value);
            }
            out.insert("tie".into(), tied.into());
            silu(hf, model)?;
            hf.require(
                "use_sliding_window",
                false.into(),
                &format!("the bundled {model} model attends over the whole context"),
            )?;
            if family == Family::Qwen3 {
                out.insert("head_dim".into(), hf.size_or("head_dim", 128)?.into());
                hf.require("attention_bias", false.into(), &no_bias)?;
            } else if d_model % n_heads == 0 {
                hf.require(
                    "head_dim",
                    (d_model / n_heads).into(),
                    "the bundled qwen2 model's heads are hidden_size / num_attention_heads wide",
                )?;
            }
        }
        Family::Phi3 => {
            out.insert("rope_base".into(), rope_base(hf, 10000.0)?.into());
            let rotary = "the bundled phi3 model rotates every feature of a head";
            hf.require("partial_rotary_factor", 1.0.into(), rotary)?;
            hf.nested("rope_parameters")?
                .require("partial_rotary_factor", 1.0.into(), rotary)?;
            out.insert("window".into(), hf.size_or("sliding_window", ctx)?.into());
            silu(hf, model)?;
            hf.require("attention_bias", false.into(), &no_bias)?;
            require_tied(hf, tied, false, model)?;
        }
        Family::Gemma2 | Family::Gemma3Text => {
            let head_dim = hf.size_or("head_dim", 256)?;
            out.insert("head_dim".into(), head_dim.into());
            out.insert("window".into(), hf.size_or("sliding_window", 4096)?.into());
            out.insert(
                "query_scale".into(),
                hf.size_or("query_pre_attn_scalar", head_dim)?.into(),
            );
            hf.one_of(
                "hidden_activation",
                &["gelu_pytorch_tanh", "gelu_new"],
                &format!("the bundled {model} model's MLP uses GELU's tanh form"),
            )?;
            hf.require("attention_bias", false.into(), &no_bias)?;
            require_tied(hf, tied, true, model)?;
            if family == Family::Gemma2 {
                gemma2_settings(hf, n_layers, &mut out)?;
            } else {
                gemma3_settings(hf, n_layers, &mut out)?;
            }
        }
        _ => unreachable!("lmx_config of the older families is Family::lmx_config's"),
    }
    Ok(out)
}

/// Gemma 2's soft-capping and its alternating layers (local first).
fn gemma2_settings(
    hf: &ConfigReader,
    n_layers: i64,
    out: &mut Map<String, Value>,
) -> Result<(), HfError> {
    out.insert("rope_base".into(), rope_base(hf, 10000.0)?.into());
    for (key, setting, default) in [
        ("attn_logit_softcapping", "attn_softcap", 50.0),
        ("final_logit_softcapping", "final_softcap", 30.0),
    ] {
        if hf.object_has_null(key) {
            return Err(hf.error(
                key,
                &Value::Null,
                "the bundled gemma2 model soft-caps attention scores and final logits",
            ));
        }
        out.insert(setting.into(), hf.float_or(key, default)?.into());
    }
    let expected = (0..n_layers).map(|i| if i % 2 == 0 { SLIDING } else { FULL });
    require_layer_types(
        hf,
        expected.collect(),
        "the bundled gemma2 model's layers alternate sliding and full attention, sliding first",
    )
}

/// Gemma 3's pattern of local and global layers and its per-kind RoPE.
fn gemma3_settings(
    hf: &ConfigReader,
    n_layers: i64,
    out: &mut Map<String, Value>,
) -> Result<(), HfError> {
    for key in ["attn_logit_softcapping", "final_logit_softcapping"] {
        hf.require(
            key,
            Value::Null,
            "the bundled gemma3_text model does not soft-cap",
        )?;
    }
    hf.require(
        "use_bidirectional_attention",
        false.into(),
        "the bundled gemma3_text model attends causally",
    )?;
    const ROPE: &str = "the bundled gemma3_text model's global layers apply RoPE unscaled or \
                        linearly scaled, its local layers unscaled";
    // transformers 5 writes one `rope_parameters` per layer kind; transformers 4 the global
    // layers' `rope_theta` and `rope_scaling` and the local layers' `rope_local_base_freq`.
    let per_kind = hf.nested("rope_parameters")?;
    let (global, local_base) = if per_kind.get(FULL).is_some() {
        let local = rope_in(per_kind.nested(SLIDING)?, 10000.0, &[], ROPE)?;
        (
            rope_in(per_kind.nested(FULL)?, 1e6, &["linear"], ROPE)?,
            local.base,
        )
    } else {
        (
            rope(hf, 1e6, &["linear"], ROPE)?,
            hf.float_or("rope_local_base_freq", 10000.0)?,
        )
    };
    let factor = match global.kind.as_str() {
        "linear" => global.params.float_or("factor", 1.0)?,
        _ => 1.0,
    };
    out.insert("rope_base".into(), global.base.into());
    out.insert("rope_local_base".into(), local_base.into());
    out.insert("rope_factor".into(), factor.into());
    // Every `global_every`-th layer is global; with none global, no layer index reaches it.
    let global_every = match hf.get("layer_types") {
        Some(types) => types
            .as_array()
            .and_then(|types| types.iter().position(|t| t.as_str() == Some(FULL)))
            .map_or(n_layers + 1, |first| first as i64 + 1),
        None => hf.size_or("sliding_window_pattern", 6)?,
    };
    out.insert("global_every".into(), global_every.into());
    let expected = (0..n_layers).map(|i| {
        if (i + 1) % global_every == 0 {
            FULL
        } else {
            SLIDING
        }
    });
    require_layer_types(
        hf,
        expected.collect(),
        "the bundled gemma3_text model's global layers repeat at a fixed period",
    )
}

/// Fails unless `layer_types` is absent or `expected`.
fn require_layer_types(
    hf: &ConfigReader,
    expected: Vec<&str>,
    reason: &str,
) -> Result<(), HfError> {
    hf.require("layer_types", json!(expected), reason)
}

/// Qwen's RoPE: the base, and YaRN's scaling when `config.json` asks for it (its attention
/// factor derived from the factor alone, as transformers does without `mscale`).
fn qwen_rope(hf: &ConfigReader, model: &str) -> Result<Vec<(&'static str, Value)>, HfError> {
    let reason =
        format!("the bundled {model} model applies RoPE unscaled or with YaRN's scaling (yarn)");
    let rope = rope(hf, 10000.0, &["yarn"], &reason)?;
    let mut settings = vec![("rope_base", rope.base.into())];
    if rope.kind != "yarn" {
        settings.push(("rope_scaling", "off".into()));
        return Ok(settings);
    }
    let p = &rope.params;
    for key in ["attention_factor", "mscale", "mscale_all_dim"] {
        if let Some(value) = p.get(key) {
            return Err(p.error(
                key,
                value,
                format!(
                    "the bundled {model} model derives YaRN's attention factor from its factor"
                ),
            ));
        }
    }
    settings.extend([
        ("rope_scaling", "yarn".into()),
        ("rope_factor", p.float_or("factor", 1.0)?.into()),
        (
            "rope_original_ctx",
            p.size_or("original_max_position_embeddings", 32768)?.into(),
        ),
        ("rope_beta_fast", p.float_or("beta_fast", 32.0)?.into()),
        ("rope_beta_slow", p.float_or("beta_slow", 1.0)?.into()),
    ]);
    Ok(settings)
}

fn silu(hf: &ConfigReader, model: &str) -> Result<(), HfError> {
    hf.one_of(
        "hidden_act",
        &["silu"],
        &format!("the bundled {model} model's MLP uses SiLU"),
    )
}

/// Fails unless the head is tied as the bundled model's (`model_tied`).
fn require_tied(
    hf: &ConfigReader,
    tied: bool,
    model_tied: bool,
    model: &str,
) -> Result<(), HfError> {
    if tied == model_tied {
        return Ok(());
    }
    let reason = if model_tied {
        format!("the bundled {model} model's output head is the token embedding")
    } else {
        format!("the bundled {model} model's output head is its own")
    };
    Err(hf.error("tie_word_embeddings", &tied.into(), reason))
}

/// `config.json` of `family` for the bundled model's settings `lmx`.
pub(crate) fn hf_config(family: Family, lmx: &Value) -> Result<Value, Inexpressible> {
    let get = |key: &str| lmx.get(key).cloned().unwrap_or(Value::Null);
    let int = |key: &str| lmx.get(key).and_then(Value::as_i64).unwrap_or(0);
    let mut config = json!({
        "vocab_size": get("vocab"),
        "max_position_embeddings": get("ctx"),
        "hidden_size": get("d_model"),
        "num_hidden_layers": get("n_layers"),
        "num_attention_heads": get("n_heads"),
        "num_key_value_heads": get("n_kv_heads"),
        "intermediate_size": get("d_ff"),
        "rms_norm_eps": get("eps"),
        "rope_theta": get("rope_base"),
        "rope_scaling": null,
        "attention_bias": false,
    });
    let object = config.as_object_mut().expect("an object");
    let mut set = |key: &str, value: Value| object.insert(key.into(), value);
    let n_layers = int("n_layers");
    match family {
        Family::Qwen2 | Family::Qwen3 => {
            if get("rope_scaling").as_str() == Some("yarn") {
                set(
                    "rope_scaling",
                    json!({
                        "type": "yarn",
                        "rope_type": "yarn",
                        "factor": get("rope_factor"),
                        "original_max_position_embeddings": get("rope_original_ctx"),
                        "beta_fast": get("rope_beta_fast"),
                        "beta_slow": get("rope_beta_slow"),
                    }),
                );
            }
            set("hidden_act", "silu".into());
            set("tie_word_embeddings", get("tie"));
            set("use_sliding_window", false.into());
            if family == Family::Qwen3 {
                set("head_dim", get("head_dim"));
            }
        }
        Family::Phi3 => {
            set("hidden_act", "silu".into());
            set("tie_word_embeddings", false.into());
            let window = if int("window") < int("ctx") {
                get("window")
            } else {
                Value::Null
            };
            set("sliding_window", window);
        }
        Family::Gemma2 | Family::Gemma3Text => {
            set("head_dim", get("head_dim"));
            set("hidden_activation", "gelu_pytorch_tanh".into());
            set("hidden_act", "gelu_pytorch_tanh".into());
            set("tie_word_embeddings", true.into());
            set("sliding_window", get("window"));
            set("query_pre_attn_scalar", get("query_scale"));
            if family == Family::Gemma2 {
                set("attn_logit_softcapping", get("attn_softcap"));
                set("final_logit_softcapping", get("final_softcap"));
                let types: Vec<&str> = (0..n_layers)
                    .map(|i| if i % 2 == 0 { SLIDING } else { FULL })
                    .collect();
                set("layer_types", json!(types));
            } else {
                let every = int("global_every").max(1);
                let types: Vec<&str> = (0..n_layers)
                    .map(|i| if (i + 1) % every == 0 { FULL } else { SLIDING })
                    .collect();
                set("layer_types", json!(types));
                set("attn_logit_softcapping", Value::Null);
                set("final_logit_softcapping", Value::Null);
                set("rope_local_base_freq", get("rope_local_base"));
                let factor = get("rope_factor");
                if factor.as_f64() != Some(1.0) {
                    set(
                        "rope_scaling",
                        json!({"rope_type": "linear", "factor": factor}),
                    );
                }
            }
        }
        _ => unreachable!("hf_config of the older families is Family::hf_config's"),
    }
    Ok(config)
}
