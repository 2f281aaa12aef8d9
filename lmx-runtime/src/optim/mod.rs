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
use crate::tree::LeafSpec;
use mlx_rs::Array;

/// Which trainable parameters weight decay applies to.
///
/// lmx's default decays the weight matrices only, as GPT-2-style training does (nanoGPT,
/// Hugging Face's trainer): decaying a LayerNorm's scale pulls it towards 0 rather than towards
/// the identity it starts as, and decaying biases and embeddings regularises nothing the model
/// overfits with. MLX's optimizers (and PyTorch's `AdamW` handed `model.parameters()`) decay
/// every parameter; [`DecayScope::All`] does that, e.g. to train exactly as a Python MLX script.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecayScope {
    /// Weights and other raw tensors; not biases, norms, embeddings, nor fields declared
    /// `no_decay` ([`LeafSpec::decay`]).
    #[default]
    Weights,
    /// Every trainable parameter, as MLX's `AdamW` does.
    All,
}

impl DecayScope {
    /// Whether weight decay applies to the parameter `spec` describes.
    pub fn applies(self, spec: &LeafSpec) -> bool {
        match self {
            DecayScope::Weights => spec.decay,
            DecayScope::All => true,
        }
    }
}

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
