//! `config.json` of the recurrent families (Mamba-2) as the bundled models' settings, and back.

use super::config::ConfigReader;
use super::error::HfError;
use serde_json::{json, Map, Value};

/// `models/mamba2.lmx`'s settings for transformers' `Mamba2Config` (`tied`: the head is the
/// embedding).
pub(crate) fn mamba2_config(hf: &ConfigReader, tied: bool) -> Result<Map<String, Value>, HfError> {
    let mut out = Map::new();
    let d_model = hf.size_or("hidden_size", 4096)?;
    let expand = hf.size_or("expand", 2)?;
    let head_dim = hf.size_or("head_dim", 64)?;
    // transformers itself refuses a configuration whose heads do not tile the inner width.
    hf.require(
        "num_heads",
        (expand * d_model / head_dim.max(1)).into(),
        "the heads must tile the inner width: num_heads * head_dim = expand * hidden_size",
    )?;
    out.insert("vocab".into(), hf.size_or("vocab_size", 32768)?.into());
    out.insert("d_model".into(), d_model.into());
    out.insert(
        "n_layers".into(),
        hf.size_or("num_hidden_layers", 64)?.into(),
    );
    out.insert("d_state".into(), hf.size_or("state_size", 128)?.into());
    out.insert("d_conv".into(), hf.size_or("conv_kernel", 4)?.into());
    out.insert("expand".into(), expand.into());
    out.insert("head_dim".into(), head_dim.into());
    out.insert("n_groups".into(), hf.size_or("n_groups", 8)?.into());
    out.insert("chunk".into(), hf.size_or("chunk_size", 256)?.into());
    out.insert(
        "eps".into(),
        hf.float_or("layer_norm_epsilon", 1e-5)?.into(),
    );
    out.insert("tie".into(), tied.into());
    let model = "the bundled mamba2 model";
    hf.one_of(
        "hidden_act",
        &["silu"],
        &format!("{model}'s convolution is followed by SiLU"),
    )?;
    hf.require(
        "use_bias",
        false.into(),
        &format!("{model}'s projections have no bias"),
    )?;
    hf.require(
        "use_conv_bias",
        true.into(),
        &format!("{model}'s convolution has a bias"),
    )?;
    if let Some(limit) = hf.get("time_step_limit") {
        if !unclamped(limit) {
            return Err(hf.error(
                "time_step_limit",
                limit,
                format!("{model} does not clamp its step sizes (the limit must be [0, inf])"),
            ));
        }
    }
    Ok(out)
}

/// Whether `time_step_limit` is `[0, inf]`, infinity as transformers 5 writes it to JSON
/// (`{"__float__": "Infinity"}`).
fn unclamped(limit: &Value) -> bool {
    let Some([low, high]) = limit.as_array().map(Vec::as_slice) else {
        return false;
    };
    let infinite = high
        .get("__float__")
        .and_then(Value::as_str)
        .is_some_and(|text| text == "Infinity");
    low.as_f64() == Some(0.0) && infinite
}

/// `config.json` for `models/mamba2.lmx`'s settings `lmx`.
pub(crate) fn mamba2_hf_config(lmx: &Value) -> Value {
    let get = |key: &str| lmx.get(key).cloned().unwrap_or(Value::Null);
    let int = |key: &str| lmx.get(key).and_then(Value::as_i64).unwrap_or(0);
    let heads = int("expand") * int("d_model") / int("head_dim").max(1);
    json!({
        "vocab_size": get("vocab"),
        "hidden_size": get("d_model"),
        "num_hidden_layers": get("n_layers"),
        "state_size": get("d_state"),
        "conv_kernel": get("d_conv"),
        "expand": get("expand"),
        "head_dim": get("head_dim"),
        "num_heads": heads,
        "n_groups": get("n_groups"),
        "chunk_size": get("chunk"),
        "layer_norm_epsilon": get("eps"),
        "hidden_act": "silu",
        "use_bias": false,
        "use_conv_bias": true,
        "residual_in_fp32": true,
        "time_step_limit": [0.0, {"__float__": "Infinity"}],
        "tie_word_embeddings": get("tie"),
    })
}
