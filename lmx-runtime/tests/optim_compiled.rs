//! Every optimizer inside the compiled training step: traced once while the learning rate changes
//! every step (no host reads, the rate arrives as an array), and the same numbers as its updates
//! applied leaf by leaf, eagerly, with each leaf's decay mask.

use lmx_runtime::nn::LinearParams;
use lmx_runtime::optim::{Adafactor, Adam, AdamW, Lion, Optimizer, Sgd, StepScalars};
use lmx_runtime::state::TrainState;
use lmx_runtime::step::{StepOptions, TrainStep};
use lmx_runtime::tree;
use lmx_runtime::Result;
use mlx_rs::{transforms::eval, Array};

const LRS: [f32; 4] = [0.1, 0.05, 0.02, 0.01];

fn params() -> LinearParams {
    LinearParams::new(
        Array::from_slice(&[1.0_f32, -2.0, 0.5, 1.5, -1.0, 3.0], &[3, 2]),
        Some(Array::from_slice(&[0.75_f32, -0.5], &[2])),
    )
}

/// The gradients of step `t`, as the batch: the loss `sum(w gw) + sum(b gb)` has exactly these.
fn batch(t: usize) -> [Array; 2] {
    let s = t as f32 + 1.0;
    let gw: Vec<f32> = [0.5, -1.5, 0.25, 1.0, -0.5, 2.0]
        .iter()
        .map(|g| g / s)
        .collect();
    let gb = [0.25 * s, -0.125];
    [
        Array::from_slice(&gw, &[3, 2]),
        Array::from_slice(&gb, &[2]),
    ]
}

fn loss(params: &LinearParams, batch: &[Array], _key: &Array) -> Result<Array> {
    let bias = params.bias.as_ref().expect("the test's params have a bias");
    let weight = params.weight.multiply(&batch[0])?.sum(None)?;
    Ok(weight.add(bias.multiply(&batch[1])?.sum(None)?)?)
}

/// The parameters after the compiled steps, and the number of traces.
fn compiled<O: Optimizer>(optimizer: &O) -> Result<(Vec<Vec<f32>>, usize)> {
    let mut state = TrainState::new(params(), optimizer, 0)?;
    let options = StepOptions {
        clip_norm: None,
        compile: true,
        ..StepOptions::default()
    };
    let mut step = TrainStep::new(&state, optimizer.clone(), loss, options)?;
    for (t, &lr) in LRS.iter().enumerate() {
        step.step(&mut state, lr, &batch(t))?;
        eval(&state.flatten())?;
    }
    let leaves = tree::flatten(&state.params)
        .iter()
        .map(|leaf| leaf.as_slice::<f32>().to_vec())
        .collect();
    Ok((leaves, step.traces()))
}

/// The parameters after the same updates applied leaf by leaf, eagerly.
fn eager<O: Optimizer>(optimizer: &O) -> Result<Vec<Vec<f32>>> {
    let mut leaves = tree::flatten(&params());
    let decay: Vec<bool> = tree::specs(&params())
        .iter()
        .map(|spec| spec.decay)
        .collect();
    assert_eq!(decay, [true, false], "weights decay, biases do not");
    let mut states = leaves
        .iter()
        .map(|leaf| optimizer.init(leaf))
        .collect::<Result<Vec<_>>>()?;
    for (t, &lr) in LRS.iter().enumerate() {
        let (lr, step) = (Array::from_f32(lr), Array::from_f32(t as f32 + 1.0));
        for (i, grad) in batch(t).iter().enumerate() {
            let scalars = StepScalars {
                lr: &lr,
                step: &step,
            };
            (leaves[i], states[i]) =
                optimizer.update(&leaves[i], grad, &states[i], scalars, decay[i])?;
        }
    }
    Ok(leaves
        .iter()
        .map(|leaf| leaf.as_slice::<f32>().to_vec())
        .collect())
}

fn check<O: Optimizer>(optimizer: O) -> Result<()> {
    let (compiled, traces) = compiled(&optimizer)?;
    assert_eq!(
        traces,
        1,
        "{}: the compiled step must be traced once",
        optimizer.name()
    );
    let eager = eager(&optimizer)?;
    for (c, e) in compiled.iter().flatten().zip(eager.iter().flatten()) {
        assert!(
            (c - e).abs() <= 1e-6 * e.abs().max(1.0),
            "{}: compiled {c} vs eager {e}",
            optimizer.name()
        );
    }
    assert_ne!(
        compiled[0],
        params().weight.as_slice::<f32>(),
        "{}: the weight moved",
        optimizer.name()
    );
    Ok(())
}

#[test]
fn sgd_nesterov_compiles() -> Result<()> {
    check(Sgd {
        momentum: 0.9,
        nesterov: true,
        weight_decay: 0.1,
        ..Sgd::default()
    })
}

#[test]
fn sgd_plain_compiles() -> Result<()> {
    check(Sgd {
        weight_decay: 0.1,
        ..Sgd::default()
    })
}

#[test]
fn lion_compiles() -> Result<()> {
    check(Lion {
        weight_decay: 0.5,
        ..Lion::default()
    })
}

#[test]
fn adafactor_compiles() -> Result<()> {
    check(Adafactor {
        beta1: Some(0.9),
        weight_decay: 0.1,
        ..Adafactor::default()
    })?;
    check(Adafactor {
        relative_step: false,
        ..Adafactor::default()
    })
}

#[test]
fn adam_and_adamw_compile() -> Result<()> {
    check(Adam {
        bias_correction: true,
        ..Adam::default()
    })?;
    check(AdamW {
        weight_decay: 0.1,
        ..AdamW::default()
    })
}
