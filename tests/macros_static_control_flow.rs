//! Pass cases: a step may branch on its configuration and on its tree's structure, loop over
//! blocks, and read shapes; its result is what the same code computes outside a step.

use lmx::runtime::nn::{init, LinearParams};
use lmx::runtime::optim::Adam;
use lmx::runtime::state::TrainState;
use lmx::runtime::step::{StepOptions, TrainStep};
use lmx::runtime::tensor::{nn, where_, Tensor};
use lmx::runtime::{Array, Result};

/// A residual stack with an optional output projection.
#[lmx::model]
pub struct Stack {
    blocks: Vec<LinearParams>,
    head: Option<LinearParams>,
}

/// How the stack is applied.
#[derive(Clone)]
pub enum Activation {
    Silu,
    Gelu,
}

/// Static configuration.
#[derive(Clone)]
pub struct Config {
    residual: bool,
    activation: Activation,
    skip_first: bool,
}

/// An evaluation step (a regression, not a language model): its `call` runs it on arrays, and a
/// `TrainStep` compiles it as the loss of a training step.
#[lmx::step]
pub fn regression(
    params: &Stack<Tensor>,
    x: &Tensor,
    y: &Tensor,
    config: &Config,
    clip: f32,
) -> Result<Tensor> {
    let mut h = x.clone();
    for (index, block) in params.blocks.iter().enumerate() {
        if index == 0 && config.skip_first {
            continue;
        }
        let z = match config.activation {
            Activation::Silu => nn::silu(&nn::linear(block, &h)?)?,
            Activation::Gelu => nn::gelu(&nn::linear(block, &h)?)?,
        };
        h = if config.residual && h.shape() == z.shape() {
            h.add(&z)?
        } else {
            z
        };
    }
    if let Some(head) = &params.head {
        h = nn::linear(head, &h)?;
    }
    let error = h.subtract(y)?.square()?;
    // Graph-side clipping: a mask and a select, never a branch.
    let limit = Tensor::scalar(clip);
    let clipped = where_(&error.gt(&limit)?, &limit, &error)?;
    if x.ndim() == 2 {
        clipped.mean()
    } else {
        clipped.sum()
    }
}

fn stack(head: bool) -> Stack {
    let keys = &mut init::Keys::from_seed(3).unwrap();
    Stack {
        blocks: (0..3)
            .map(|_| init::linear(4, 4, true, keys).unwrap())
            .collect(),
        head: head.then(|| init::linear(4, 2, false, keys).unwrap()),
    }
}

fn data() -> (Array, Array) {
    let x: Vec<f32> = (0..24).map(|i| (i as f32 * 0.37).sin()).collect();
    let y: Vec<f32> = (0..12).map(|i| (i as f32 * 0.21).cos()).collect();
    (
        Array::from_slice(&x, &[6, 4]),
        Array::from_slice(&y, &[6, 2]),
    )
}

#[test]
fn static_branches_follow_the_configuration() {
    let (x, y) = data();
    let params = stack(true);
    let config = |residual, skip_first| Config {
        residual,
        activation: Activation::Silu,
        skip_first,
    };
    let loss = |config: &Config, clip| {
        Regression::call(&params, &x, &y, config, &clip)
            .unwrap()
            .item_exact::<f32>()
    };
    let plain = loss(&config(false, false), 100.0);
    assert_ne!(plain, loss(&config(true, false), 100.0));
    assert_ne!(plain, loss(&config(false, true), 100.0));
    assert!(loss(&config(false, false), 1e-3) <= 1e-3 + 1e-7);
}

#[test]
fn a_step_with_static_branches_trains() {
    let (x, y) = data();
    let optimizer = Adam::default();
    let mut state = TrainState::new(stack(true), &optimizer, 0).unwrap();
    let config = Config {
        residual: true,
        activation: Activation::Gelu,
        skip_first: false,
    };
    let loss = move |params: &Stack, batch: &[Array], _key: &Array| {
        Regression::call(params, &batch[0], &batch[1], &config, &10.0)
    };
    let mut step = TrainStep::new(&state, optimizer, loss, StepOptions::default()).unwrap();
    let losses: Vec<f32> = (0..20)
        .map(|_| {
            step.step(&mut state, 1e-2, &[x.clone(), y.clone()])
                .unwrap()
                .loss
                .item_exact::<f32>()
        })
        .collect();
    assert!(losses[19] < losses[0], "{losses:?}");
    assert_eq!(step.traces(), 1);
    assert_eq!(state.params.names().len(), 7);
}
