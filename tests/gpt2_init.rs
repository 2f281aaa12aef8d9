//! models/gpt2.lmx's two initialisations, measured on the drawn parameters: MLX's `nn` defaults
//! (`init_std = 0`) and GPT-2's (`init_std = 0.02`: weights and embeddings normal with std 0.02,
//! the residual projections with 0.02 / sqrt(2 n_layers), biases zero, LayerNorms ones and zeros).

use lmx::models::gpt2;
use lmx::runtime::model::LanguageModel;
use lmx::runtime::tree;
use lmx::runtime::Result;
use std::collections::HashMap;

/// Every parameter's values by dotted name, drawn at the tiny preset (d_model 64, 2 layers).
fn drawn(init_std: f64) -> Result<HashMap<String, Vec<f32>>> {
    let mut config = gpt2::Config::preset("tiny").expect("gpt2.lmx has a tiny preset");
    config.init_std = init_std;
    let params = gpt2::Gpt2::init(&config, 0)?;
    Ok(tree::names(&params)
        .into_iter()
        .zip(tree::flatten(&params))
        .map(|(name, leaf)| (name, leaf.as_slice::<f32>().to_vec()))
        .collect())
}

fn std(values: &[f32]) -> f64 {
    let n = values.len() as f64;
    let mean = values.iter().map(|&v| v as f64).sum::<f64>() / n;
    (values
        .iter()
        .map(|&v| (v as f64 - mean).powi(2))
        .sum::<f64>()
        / n)
        .sqrt()
}

/// `values`' standard deviation is `expected` within 5% (every tensor checked has 4,096 values
/// or more: the estimate's own spread is about 1%).
fn assert_std(params: &HashMap<String, Vec<f32>>, name: &str, expected: f64) {
    let got = std(&params[name]);
    assert!(
        (got / expected - 1.0).abs() < 0.05,
        "{name}: standard deviation {got}, expected {expected}"
    );
}

#[test]
fn gpt2s_initialisation_draws_gpt2s_distributions() -> Result<()> {
    let params = drawn(0.02)?;
    let residual = 0.02 / (2.0_f64 * 2.0).sqrt();
    for name in [
        "wte.weight",
        "wpe.weight",
        "h.0.attn.c_attn.weight",
        "h.1.mlp.c_fc.weight",
    ] {
        assert_std(&params, name, 0.02);
    }
    for name in ["h.0.attn.c_proj.weight", "h.1.mlp.c_proj.weight"] {
        assert_std(&params, name, residual);
    }
    for (name, values) in &params {
        let expected = match name {
            _ if name.contains("ln_") && name.ends_with("weight") => 1.0,
            _ if name.ends_with("bias") => 0.0,
            _ => continue,
        };
        assert!(values.iter().all(|&v| v == expected), "{name}: {values:?}");
    }
    Ok(())
}

#[test]
fn the_default_is_mlxs_initialisation() -> Result<()> {
    let params = drawn(0.0)?;
    // Linear layers uniform in ±1/sqrt(input), biases too; embeddings normal, std 1/sqrt(d_model).
    let bound = 1.0 / 64.0_f64.sqrt();
    for name in ["h.0.attn.c_attn.weight", "h.0.attn.c_proj.weight"] {
        let values = &params[name];
        assert!(values.iter().all(|&v| (v as f64).abs() <= bound), "{name}");
        assert_std(&params, name, bound / 3.0_f64.sqrt());
    }
    let bias = &params["h.0.attn.c_attn.bias"];
    assert!(bias.iter().all(|&v| (v as f64).abs() <= bound) && bias.iter().any(|&v| v != 0.0));
    assert_std(&params, "wte.weight", bound);
    Ok(())
}
