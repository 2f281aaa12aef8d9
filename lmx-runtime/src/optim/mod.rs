//! Optimizers over typed trees.
//!
//! An optimizer is written once, for one parameter: [`Optimizer::update`] maps a parameter, its
//! gradient and its state to the new parameter and state. The trainer applies it leaf by leaf
//! over a model's tree, so a moment can never belong to the wrong parameter, and creates every
//! state with [`Optimizer::init`] before the step is traced, so the compiled state never changes
//! layout. The learning rate and step count reach the update as arrays ([`StepScalars`]): a
//! schedule changes the rate without retracing.

mod adafactor;
mod adam;
mod lion;
mod sgd;

pub use adafactor::{Adafactor, AdafactorLeaf, SecondMoment};
pub use adam::{Adam, AdamLeaf, AdamW};
pub use lion::Lion;
pub use sgd::{Sgd, SgdLeaf};

use crate::arrays::Arrays;
use crate::error::Result;
use mlx_rs::Array;

/// The per-step values an update reads, as graph inputs.
#[derive(Clone, Copy, Debug)]
pub struct StepScalars<'a> {
    /// This step's learning rate (float32 scalar).
    pub lr: &'a Array,
    /// The number of this update, counting from 1 (float32 scalar).
    pub step: &'a Array,
}

/// An optimizer: per-parameter state and update rule.
pub trait Optimizer: Clone + 'static {
    /// The state kept for each trainable parameter.
    type Leaf: Arrays + Clone + 'static;

    /// A short name for logs and checkpoints (`adamw`, `sgd`, ...).
    fn name(&self) -> &'static str;

    /// Whether [`update`](Self::update) treats every element of a parameter alone: no shape, no
    /// statistic over a whole tensor, and state arrays shaped like the parameter. Such an update
    /// runs unchanged over many parameters packed into one flat buffer
    /// ([`FlatStep`](crate::flat::FlatStep)): one update for the whole model.
    fn elementwise(&self) -> bool {
        false
    }

    /// Fresh state for `param`.
    fn init(&self, param: &Array) -> Result<Self::Leaf>;

    /// One update: the new parameter and state. `decay` says whether weight decay applies.
    fn update(
        &self,
        param: &Array,
        grad: &Array,
        state: &Self::Leaf,
        scalars: StepScalars<'_>,
        decay: bool,
    ) -> Result<(Array, Self::Leaf)>;
}

/// `value` as a scalar array of the dtype of `like`.
pub(crate) fn constant(value: f32, like: &Array) -> Result<Array> {
    crate::nn::scalar(value, like.dtype())
}
