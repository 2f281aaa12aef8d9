//! The same small LLaMA written twice, in `models/llama.lmx` and as Rust structs under
//! `#[lmx::model]` / `#[lmx::step]` (`tests/support/llama.rs`): identical parameter names,
//! identical outputs and identical losses over 10 steps from the same weights.

use crate::support::llama as llama_rs;
use llama_rs::{Llama, LlamaConfig};
use lmx::models::llama;
use lmx::runtime::checkpoint::tree_to_map;
use lmx::runtime::model::{Context, LanguageModel, TrainingStep};
use lmx::runtime::state::TrainState;
use lmx::runtime::step::{StepOptions, TrainStep};
use lmx::runtime::{tree, Array};

/// `llama.lmx`'s `tiny` preset, and the same shape for the Rust LLaMA.
fn configs() -> (llama::Config, LlamaConfig) {
    let lmx_config = llama::Config::preset("tiny").expect("llama.lmx has a tiny preset");
    let rust_config = LlamaConfig {
        vocab: lmx_config.vocab as i32,
        dim: lmx_config.d_model as i32,
        layers: lmx_config.n_layers as usize,
        heads: lmx_config.n_heads as i32,
        kv_heads: lmx_config.n_kv_heads as i32,
        hidden: lmx_config.d_ff as i32,
        rope_base: lmx_config.rope_base as f32,
        eps: lmx_config.eps as f32,
    };
    (lmx_config, rust_config)
}

/// Both trees holding the weights `llama.lmx` initialises from seed 0.
fn same_weights() -> (llama::Params, Llama) {
    let (lmx_config, rust_config) = configs();
    let lmx_params = llama::Llama::init(&lmx_config, 0).unwrap();
    let mut rust_params = Llama::init(&rust_config, 1).unwrap();
    rust_params
        .update_from_flat_map(tree_to_map(&lmx_params))
        .unwrap();
    (lmx_params, rust_params)
}

fn batch() -> (Array, Array) {
    let ids: Vec<i32> = (0..34).map(|i| (i * 37 + 11) % 256).collect();
    let tokens: Vec<i32> = ids[..16].iter().chain(&ids[17..33]).copied().collect();
    let targets: Vec<i32> = ids[1..17].iter().chain(&ids[18..34]).copied().collect();
    (
        Array::from_slice(&tokens, &[2, 16]),
        Array::from_slice(&targets, &[2, 16]),
    )
}

fn max_abs_difference(a: &Array, b: &Array) -> f32 {
    a.subtract(b)
        .unwrap()
        .abs()
        .unwrap()
        .max(false)
        .unwrap()
        .item_exact::<f32>()
}

#[test]
fn parameter_names_are_identical() {
    let (lmx_config, rust_config) = configs();
    let lmx_names = tree::names(&llama::Llama::init(&lmx_config, 0).unwrap());
    let rust_names = tree::names(&Llama::init(&rust_config, 0).unwrap());
    assert_eq!(lmx_names, rust_names);
    assert!(lmx_names.contains(&"model.layers.1.self_attn.k_proj.weight".to_owned()));
}

#[test]
fn outputs_are_identical_on_the_same_weights() {
    let (lmx_config, rust_config) = configs();
    let (lmx_params, rust_params) = same_weights();
    let (tokens, _) = batch();
    let ours = llama::Llama::forward(
        &lmx_params,
        &lmx_config,
        &tokens,
        &mut Context::evaluation(),
    )
    .unwrap();
    let theirs = Llama::forward(
        &rust_params,
        &rust_config,
        &tokens,
        &mut Context::evaluation(),
    )
    .unwrap();
    assert_eq!(ours.shape(), theirs.shape());
    let gap = max_abs_difference(&ours, &theirs);
    assert!(gap <= 1e-5, "logits differ by {gap}");
}

#[test]
fn losses_are_identical_over_ten_steps() {
    let (lmx_config, rust_config) = configs();
    let (lmx_params, rust_params) = same_weights();
    let optimizer = llama::Train::optimizer();
    let options = StepOptions::default();
    let (tokens, targets) = batch();

    let mut lmx_state = TrainState::new(lmx_params, &optimizer, 0).unwrap();
    let config = lmx_config.clone();
    let mut lmx_step = TrainStep::new(
        &lmx_state,
        optimizer.clone(),
        move |params: &llama::Params, batch: &[Array], key: &Array| {
            llama::Train::loss(params, &config, batch, Some(key))
        },
        options,
    )
    .unwrap();
    let mut rust_state = TrainState::new(rust_params, &optimizer, 0).unwrap();
    let mut rust_step = TrainStep::new(
        &rust_state,
        optimizer,
        move |params: &Llama, batch: &[Array], key: &Array| {
            llama_rs::Train::loss(params, &rust_config, batch, Some(key))
        },
        options,
    )
    .unwrap();

    for step in 0..10 {
        let lr = 1e-2;
        let ours = lmx_step
            .step(&mut lmx_state, lr, &[tokens.clone(), targets.clone()])
            .unwrap();
        let theirs = rust_step
            .step(&mut rust_state, lr, &[tokens.clone(), targets.clone()])
            .unwrap();
        let (ours, theirs) = (
            ours.loss.item_exact::<f32>(),
            theirs.loss.item_exact::<f32>(),
        );
        assert!(
            (ours - theirs).abs() <= 1e-5,
            "step {step}: .lmx loss {ours}, Rust loss {theirs}"
        );
    }
    assert_eq!((lmx_step.traces(), rust_step.traces()), (1, 1));
}
