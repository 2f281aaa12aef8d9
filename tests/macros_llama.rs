//! The LLaMA of `tests/support/llama.rs` trained through the `TrainingStep` that `#[lmx::step]`
//! implements, compiled over the state the runtime declares for it.

// Shared with other tests, which use parts this one does not.
#[allow(dead_code)]
use crate::support::llama;

use llama::{Llama, LlamaConfig, Train};
use lmx::runtime::model::{Context, LanguageModel, TrainingStep};
use lmx::runtime::optim::AdamW;
use lmx::runtime::state::TrainState;
use lmx::runtime::step::{StepOptions, TrainStep};
use lmx::runtime::Array;

/// A batch of token sequences `[2, 8]` and their next tokens.
fn batch() -> (Array, Array) {
    let ids: Vec<i32> = (0..18).map(|i| (i * 7 + 3) % 64).collect();
    let tokens: Vec<i32> = ids[..8].iter().chain(&ids[9..17]).copied().collect();
    let targets: Vec<i32> = ids[1..9].iter().chain(&ids[10..18]).copied().collect();
    (
        Array::from_slice(&tokens, &[2, 8]),
        Array::from_slice(&targets, &[2, 8]),
    )
}

/// The losses of `steps` steps from the same initial weights.
fn losses(compile: bool, steps: usize) -> (Vec<f32>, usize) {
    let config = LlamaConfig::tiny();
    let optimizer = Train::optimizer();
    let mut state = TrainState::new(Llama::init(&config, 0).unwrap(), &optimizer, 0).unwrap();
    let options = StepOptions {
        compile,
        ..Train::options()
    };
    let mut train = TrainStep::new(
        &state,
        optimizer,
        move |params: &Llama, batch: &[Array], key: &Array| {
            Train::loss(params, &config, batch, Some(key))
        },
        options,
    )
    .unwrap();
    let (tokens, targets) = batch();
    let losses = (0..steps)
        .map(|_| {
            let metrics = train
                .step(&mut state, 1e-2, &[tokens.clone(), targets.clone()])
                .unwrap();
            metrics.loss.item_exact::<f32>()
        })
        .collect();
    (losses, train.traces())
}

#[test]
fn compiled_steps_lower_the_loss_and_trace_once() {
    let (losses, traces) = losses(true, 10);
    assert_eq!(traces, 1);
    assert!(losses[9] < losses[0] - 0.5, "{losses:?}");
    assert!(losses.iter().all(|loss| loss.is_finite()));
}

#[test]
fn compiled_losses_equal_eager_losses() {
    let (compiled, _) = losses(true, 5);
    let (eager, traces) = losses(false, 5);
    assert_eq!(traces, 5);
    for (c, e) in compiled.iter().zip(&eager) {
        assert!(
            (c - e).abs() < 1e-4,
            "compiled {compiled:?} vs eager {eager:?}"
        );
    }
}

#[test]
fn the_declared_state_holds_every_optimizer_moment() {
    let config = LlamaConfig::tiny();
    let params = Llama::init(&config, 0).unwrap();
    let leaves = params.leaf_count();
    let state = TrainState::new(params, &AdamW::default(), 0).unwrap();
    let declaration = state.declaration();
    assert_eq!(declaration.len(), leaves * 3 + 2);
    assert_eq!(declaration[0], "params.model.embed_tokens.weight");
    assert_eq!(declaration[leaves], "opt.model.embed_tokens.weight.0");
    assert_eq!(declaration[leaves + 1], "opt.model.embed_tokens.weight.1");
    assert_eq!(declaration[3 * leaves - 1], "opt.lm_head.weight.1");
    assert_eq!(&declaration[3 * leaves..], ["step", "rng"]);
}

#[test]
fn the_step_at_the_host_boundary_is_the_first_loss() {
    let config = LlamaConfig::tiny();
    let params = Llama::init(&config, 0).unwrap();
    let (tokens, targets) = batch();
    let loss = Train::loss(&params, &config, &[tokens.clone(), targets.clone()], None)
        .unwrap()
        .item_exact::<f32>();
    let (losses, _) = losses(true, 1);
    assert!((loss - losses[0]).abs() < 1e-5);
    // Untrained, the loss is near ln(vocab).
    assert!((loss - (64f32).ln()).abs() < 1.5, "{loss}");
    let logits = Llama::forward(&params, &config, &tokens, &mut Context::evaluation()).unwrap();
    assert_eq!(logits.shape(), &[2, 8, 64]);
    // A batch of another size is an error naming the step, not a panic.
    match Train::loss(&params, &config, &[tokens], None) {
        Err(lmx::runtime::Error::Layout(message)) => {
            assert_eq!(message, "step `train` takes 2 inputs, got 1")
        }
        other => panic!("expected a layout error, got {other:?}"),
    }
}
