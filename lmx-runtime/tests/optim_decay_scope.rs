//! Which parameters AdamW's weight decay reaches: weights only by default, every parameter with
//! `DecayScope::All` (as MLX's AdamW), in the per-parameter step and in the flat one alike.
//!
//! The loss has zero gradients, so Adam's direction is 0 and a parameter changes only by the
//! decoupled decay, `p (1 - lr wd)`: a decayed leaf is scaled by exactly that, another is kept.

use lmx_runtime::flat::FlatStep;
use lmx_runtime::nn::LinearParams;
use lmx_runtime::optim::{Adam, AdamW, DecayScope};
use lmx_runtime::state::TrainState;
use lmx_runtime::step::{StepOptions, TrainStep};
use lmx_runtime::tree;
use lmx_runtime::Result;
use mlx_rs::Array;

const LR: f32 = 0.1;
const WEIGHT_DECAY: f32 = 0.5;

fn params() -> LinearParams {
    LinearParams::new(
        Array::from_slice(&[1.0_f32, -2.0, 0.5, 1.5], &[2, 2]),
        Some(Array::from_slice(&[0.75_f32, -0.5], &[2])),
    )
}

fn optimizer() -> AdamW {
    AdamW {
        adam: Adam::default(),
        weight_decay: WEIGHT_DECAY,
    }
}

/// A loss whose gradients are all zero.
fn flat_loss(params: &LinearParams, _batch: &[Array], _key: &Array) -> Result<Array> {
    let bias = params.bias.as_ref().expect("the test's params have a bias");
    let sum = params.weight.sum(None)?.add(bias.sum(None)?)?;
    Ok(sum.multiply(Array::from_f32(0.0))?)
}

/// Each leaf after one step: its values divided by its values before.
fn ratios(after: &[Array]) -> Vec<Vec<f32>> {
    after
        .iter()
        .zip(tree::flatten(&params()))
        .map(|(after, before)| {
            let before = before.as_slice::<f32>().to_vec();
            after
                .as_slice::<f32>()
                .iter()
                .zip(before)
                .map(|(a, b)| a / b)
                .collect()
        })
        .collect()
}

fn per_parameter(decay: DecayScope) -> Result<Vec<Vec<f32>>> {
    let mut state = TrainState::new(params(), &optimizer(), 0)?;
    let options = StepOptions {
        decay,
        ..StepOptions::default()
    };
    let mut step = TrainStep::new(&state, optimizer(), flat_loss, options)?;
    step.step(&mut state, LR, &[])?;
    Ok(ratios(&tree::flatten(&state.params)))
}

fn flat(decay: DecayScope) -> Result<Vec<Vec<f32>>> {
    let state = TrainState::new(params(), &optimizer(), 0)?;
    let options = StepOptions {
        decay,
        ..StepOptions::default()
    };
    let mut step = FlatStep::new(&state, optimizer(), flat_loss, options)?.expect("AdamW packs");
    let mut packed = step.pack(&state)?;
    step.step(&mut packed, LR, &[])?;
    Ok(ratios(&tree::flatten(&step.unpack(&packed)?.params)))
}

fn assert_scaled(leaf: &[f32], factor: f32, what: &str) {
    for ratio in leaf {
        assert!(
            (ratio - factor).abs() < 1e-6,
            "{what}: scaled by {ratio}, not {factor}"
        );
    }
}

#[test]
fn weights_decay_by_default_and_every_parameter_with_all() -> Result<()> {
    let decayed = 1.0 - LR * WEIGHT_DECAY;
    for (layout, run) in [
        (
            "per parameter",
            per_parameter as fn(DecayScope) -> Result<_>,
        ),
        ("flat", flat),
    ] {
        let weights = run(DecayScope::default())?;
        assert_scaled(
            &weights[0],
            decayed,
            &format!("{layout}, weights: the weight"),
        );
        assert_scaled(&weights[1], 1.0, &format!("{layout}, weights: the bias"));
        let all = run(DecayScope::All)?;
        assert_scaled(&all[0], decayed, &format!("{layout}, all: the weight"));
        assert_scaled(&all[1], decayed, &format!("{layout}, all: the bias"));
    }
    Ok(())
}
