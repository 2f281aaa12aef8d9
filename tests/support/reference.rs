//! Comparing lmx with a reference implementation's outputs on the same weights (transformers'
//! or mlx-lm's, computed by the scripts of `tests/reference/` into `tests/fixtures/`).

use lmx::runtime::generate::{generate, Sampling};
use lmx::runtime::model::{Context, LanguageModel};
use lmx::runtime::{Array, Result};
use std::path::{Path, PathBuf};

/// `tests/fixtures/NAME`.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// `max |actual - expected|` over two arrays of one shape.
pub fn max_error(actual: &Array, expected: &Array) -> f32 {
    assert_eq!(actual.shape(), expected.shape(), "logit shapes");
    let error = actual.subtract(expected).unwrap().abs().unwrap();
    error.max(false).unwrap().item_exact::<f32>()
}

/// `M`'s logits of `tokens` are the reference's (`expected`) within `tolerance`, and its greedy
/// continuation of the first `prompt` tokens of `tokens` is the reference's (`greedy`).
pub fn assert_logits_and_greedy<M: LanguageModel>(
    params: &M::Params,
    config: &M::Config,
    tokens: &Array,
    expected: &Array,
    greedy: &[u32],
    prompt: usize,
    tolerance: f32,
) -> Result<()> {
    let logits = M::forward(params, config, tokens, &mut Context::evaluation())?;
    let error = max_error(&logits, expected);
    println!("max |lmx - reference| = {error:.2e}");
    assert!(error <= tolerance, "logits differ by {error:e}");
    let prompt: Vec<u32> = tokens.as_slice::<i32>()[..prompt]
        .iter()
        .map(|&t| t as u32)
        .collect();
    let sampling = Sampling {
        temperature: 0.0,
        max_tokens: greedy.len(),
        ..Sampling::default()
    };
    let generation = generate::<M>(params, config, &prompt, &sampling, None, |_| {})?;
    assert_eq!(
        generation.tokens, greedy,
        "the reference's greedy continuation"
    );
    Ok(())
}

/// Fails unless the safetensors files `ours` and `theirs` hold the same tensor names, each with
/// equal values and dtype.
pub fn assert_same_tensors(ours: &Path, theirs: &Path) {
    let load = |path: &Path| {
        Array::load_safetensors(path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
    };
    let (ours, theirs) = (load(ours), load(theirs));
    let names = |tensors: &std::collections::HashMap<String, Array>| {
        let mut names: Vec<String> = tensors.keys().cloned().collect();
        names.sort();
        names
    };
    assert_eq!(names(&ours), names(&theirs), "the tensors' names");
    for (name, array) in &ours {
        assert_eq!(array.dtype(), theirs[name].dtype(), "{name}");
        assert!(array.eq_values(&theirs[name]).unwrap(), "{name} differs");
    }
}
