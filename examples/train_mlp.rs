//! Trains a 2-layer MLP on a fixed classification batch with AdamW, graph-only clipping and a
//! compiled step, and prints the loss curve.
//!
//! ```text
//! cargo run --release --example train_mlp
//! ```

use lmx::runtime::nn::{self, init::Keys, LinearParams};
use lmx::runtime::optim::AdamW;
use lmx::runtime::state::TrainState;
use lmx::runtime::step::{StepOptions, TrainStep};
use lmx::runtime::{platform, Result};
use mlx_rs::{random, transforms::eval, Array};

type Mlp = Vec<LinearParams>;

fn loss(params: &Mlp, batch: &[Array], _key: &Array) -> Result<Array> {
    let hidden = nn::silu(&nn::linear(&params[0], &batch[0])?)?;
    nn::cross_entropy(&nn::linear(&params[1], &hidden)?, &batch[1])
}

fn main() -> Result<()> {
    println!("{}\n", platform::describe());
    let mut keys = Keys::from_seed(0)?;
    let mlp = vec![
        nn::init::linear(256, 1024, true, &mut keys)?,
        nn::init::linear(1024, 10, true, &mut keys)?,
    ];
    let x = random::normal::<f32>(&[512, 256], None, None, &keys.next()?)?;
    let y = random::randint::<_, i32>(0, 10, &[512], &keys.next()?)?;

    let optimizer = AdamW::default();
    let mut state = TrainState::new(mlp, &optimizer, 0)?;
    let mut step = TrainStep::new(&state, optimizer, loss, StepOptions::default())?;
    let started = std::time::Instant::now();
    for i in 1..=100 {
        let metrics = step.step(&mut state, 1e-3, &[x.clone(), y.clone()])?;
        let mut outputs = state.flatten();
        outputs.push(metrics.loss.clone());
        eval(&outputs)?;
        if i == 1 || i % 10 == 0 {
            let loss = metrics.loss.item_exact::<f32>();
            println!(
                "step {i:>3}  loss {loss:.4}  {}",
                "#".repeat((loss * 20.0) as usize)
            );
        }
    }
    let elapsed = started.elapsed();
    println!(
        "\n100 steps in {:.2?} ({:.2} ms/step), traced {} time(s)",
        elapsed,
        elapsed.as_secs_f64() * 10.0,
        step.traces()
    );
    Ok(())
}
