//! The compiled step writes the buffers' next values that its loss's forward passes gave them:
//! fused and with gradient accumulation, never through the optimizer.

use lmx_runtime::model::Context;
use lmx_runtime::optim::AdamW;
use lmx_runtime::state::TrainState;
use lmx_runtime::step::{StepOptions, TrainStep};
use lmx_runtime::{Array, Result};

/// A weight and a running mean of the batch's rows.
#[derive(Clone, Debug, PartialEq, lmx_macros::Tree)]
#[lmx(runtime = "lmx_runtime")]
struct Running<T = Array> {
    #[lmx(role = weight)]
    w: T,
    #[lmx(role = buffer)]
    mean: T,
}

/// `sum(w * x)`'s mean over the rows of `x`, writing the rows' mean into the buffer; returns
/// the loss and the buffer's next value.
fn loss(params: &Running, batch: &[Array]) -> Result<Vec<Array>> {
    let mut ctx = Context::for_step(None);
    let x = &batch[0];
    let rows = x.mean_axis(0, false)?;
    ctx.write_buffer(&params.mean, &rows)?;
    let loss = x.multiply(&params.w)?.sum_axis(1, false)?.mean(false)?;
    let mut values = vec![loss];
    values.extend(ctx.buffer_values(params, Array::clone)?);
    Ok(values)
}

fn values(array: &Array) -> Vec<f32> {
    array.eval().unwrap();
    array.as_slice::<f32>().to_vec()
}

/// After one step the buffer holds the batch's row mean (with two micro-batches, the mean of
/// their means: the same here), untouched by AdamW's update and weight decay, while the weight
/// trained; the optimizer keeps no state for it.
#[test]
fn the_step_writes_the_buffer_its_loss_gave() -> Result<()> {
    let x = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], &[4, 2]);
    for accumulation in [1, 2] {
        let params = Running {
            w: Array::from_slice(&[0.5f32, -0.5], &[2]),
            mean: Array::from_slice(&[100.0f32, 100.0], &[2]),
        };
        let optimizer = AdamW {
            weight_decay: 0.5,
            ..AdamW::default()
        };
        let mut state = TrainState::new(params, &optimizer, 0)?;
        assert!(state.opt.mean.is_none(), "no optimizer state for a buffer");
        let options = StepOptions {
            accumulation,
            clip_norm: None,
            ..StepOptions::default()
        };
        let mut step = TrainStep::with_frozen_metrics(
            &state,
            optimizer,
            Vec::new(),
            |params: &Running, _: &[Array], batch: &[Array], _: &Array| loss(params, batch),
            0,
            options,
        )?;
        for _ in 0..2 {
            step.step(&mut state, 0.1, std::slice::from_ref(&x))?;
        }
        assert_eq!(
            values(&state.params.mean),
            [4.0, 5.0],
            "accumulation {accumulation}"
        );
        assert_ne!(values(&state.params.w), [0.5, -0.5], "the weight trained");
        let functions = if accumulation == 1 { 1 } else { 2 };
        assert_eq!(step.traces(), functions, "each function traced once");
    }
    Ok(())
}
