//! A frozen model in the compiled step: DPO of a bigram policy against its frozen copy. The
//! reference's leaves are inputs of the step (fused and accumulated), get neither gradients nor
//! optimizer state, stay as they were, and the objective does its work: preference accuracy goes
//! from 0 (the policy equals its reference, every margin is 0) to 1.

use lmx_runtime::nn::{init::Keys, LinearParams};
use lmx_runtime::objectives::{dpo_loss, sequence_logprobs, Preference};
use lmx_runtime::optim::AdamW;
use lmx_runtime::state::TrainState;
use lmx_runtime::step::{StepOptions, TrainStep};
use lmx_runtime::{tree, Result};
use mlx_rs::{transforms::eval, Array};

const VOCAB: i32 = 6;

/// One bias-free `[VOCAB, VOCAB]` layer: row `t` holds the logits after token `t`.
type Bigram = Vec<LinearParams>;

fn bigram() -> Result<Bigram> {
    let mut keys = Keys::from_seed(5)?;
    Ok(vec![lmx_runtime::nn::init::linear(
        VOCAB, VOCAB, false, &mut keys,
    )?])
}

/// Tokens `[0, p]` with targets `[-100, c]` (the prompt position masked) and `[-100, r]`: after
/// prompt `p` the chosen continuation is `p + 1`, the rejected one `p + 3`.
fn pairs() -> [Array; 3] {
    let prompts = [1, 2, 3, 4];
    let tokens: Vec<i32> = prompts.iter().flat_map(|&p| [0, p]).collect();
    let chosen: Vec<i32> = prompts
        .iter()
        .flat_map(|&p| [-100, (p + 1) % VOCAB])
        .collect();
    let rejected: Vec<i32> = prompts
        .iter()
        .flat_map(|&p| [-100, (p + 3) % VOCAB])
        .collect();
    let rows = prompts.len() as i32;
    [
        Array::from_slice(&tokens, &[rows, 2]),
        Array::from_slice(&chosen, &[rows, 2]),
        Array::from_slice(&rejected, &[rows, 2]),
    ]
}

fn preference(policy: &Array, reference: &Array, batch: &[Array]) -> Result<Preference> {
    let logits = |w: &Array| -> Result<Array> { Ok(w.take_axis(&batch[0], 0)?) };
    let (policy, reference) = (logits(policy)?, logits(reference)?);
    let lp = |l: &Array, t: &Array| sequence_logprobs(l, t);
    dpo_loss(
        &lp(&policy, &batch[1])?,
        &lp(&policy, &batch[2])?,
        &lp(&reference, &batch[1])?,
        &lp(&reference, &batch[2])?,
        0.5,
    )
}

/// Trains 30 steps and returns the losses, the trace count, the final accuracy and whether the
/// reference came back unchanged.
fn train(compile: bool, accumulation: usize) -> Result<(Vec<f32>, usize, f32, bool)> {
    let policy = bigram()?;
    let reference = tree::flatten(&policy);
    let optimizer = AdamW::default();
    let mut state = TrainState::new(policy, &optimizer, 0)?;
    let layout_without_frozen = state.layout().len();
    let options = StepOptions {
        compile,
        accumulation,
        ..StepOptions::default()
    };
    let loss = |params: &Bigram, frozen: &[Array], batch: &[Array], _key: &Array| {
        Ok(preference(&params[0].weight, &frozen[0], batch)?.loss)
    };
    let mut step = TrainStep::with_frozen(&state, optimizer, reference.clone(), loss, options)?;
    let batch = pairs();
    let mut losses = Vec::new();
    for _ in 0..30 {
        let metrics = step.step(&mut state, 0.05, &batch)?;
        eval(&metrics.outputs)?;
        losses.push(metrics.loss.item_exact::<f32>());
    }
    assert_eq!(state.layout().len(), layout_without_frozen);
    let accuracy = preference(&state.params[0].weight, &reference[0], &batch)?.accuracy;
    eval([&accuracy])?;
    let untouched = reference[0].eq_values(&tree::flatten(&bigram()?)[0])?;
    Ok((
        losses,
        step.traces(),
        accuracy.item_exact::<f32>(),
        untouched,
    ))
}

#[test]
fn dpo_against_a_frozen_reference_in_the_compiled_step() -> Result<()> {
    let (compiled, traces, accuracy, untouched) = train(true, 1)?;
    assert_eq!(
        traces, 1,
        "the step is traced once with the frozen model as an input"
    );
    assert!(untouched, "the frozen reference changed");
    // Every margin starts at 0: the loss is ln 2 and no pair is preferred yet.
    assert!((compiled[0] - std::f32::consts::LN_2).abs() < 1e-6);
    assert!(
        compiled[29] < 0.2 && accuracy == 1.0,
        "{compiled:?}, accuracy {accuracy}"
    );

    let (eager, _, _, _) = train(false, 1)?;
    for (c, e) in compiled.iter().zip(&eager) {
        assert!(
            (c - e).abs() < 1e-5,
            "compiled {compiled:?}\neager {eager:?}"
        );
    }
    // Two micro-batches of two pairs: the mean of equal halves' means and gradients.
    let (accumulated, traces, _, untouched) = train(true, 2)?;
    assert_eq!(traces, 2, "the micro-step and the update, each traced once");
    assert!(untouched);
    for (c, a) in compiled.iter().zip(&accumulated) {
        assert!(
            (c - a).abs() < 1e-4,
            "fused {compiled:?}\naccumulated {accumulated:?}"
        );
    }
    Ok(())
}
