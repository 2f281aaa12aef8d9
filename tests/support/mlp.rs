// Shared by the compile-fail cases (included, so that each case stays one small file).

use lmx::runtime::nn::LinearParams;
use lmx::runtime::tensor::{nn, Tensor};
use lmx::runtime::Result;

/// A two-layer perceptron.
#[lmx::model]
pub struct Mlp {
    pub up: LinearParams,
    pub down: LinearParams,
}

/// Static configuration.
pub struct Config {
    pub check: bool,
    pub limit: f32,
}

/// The perceptron's output.
pub fn mlp(params: &Mlp<Tensor>, x: &Tensor) -> Result<Tensor> {
    nn::linear(&params.down, &nn::silu(&nn::linear(&params.up, x)?)?)
}

/// A helper that takes a tensor and returns `bool`.
pub fn looks_diverged(loss: &Tensor) -> bool {
    loss.ndim() > 0
}

fn main() {
    let _ = (Config { check: true, limit: 1.0 }.check, looks_diverged, mlp);
}
