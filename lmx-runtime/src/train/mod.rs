//! Training: the loop around the compiled step, with data, schedules, evaluation, checkpoints and
//! callbacks.
//!
//! One evaluation boundary per step: the step's outputs (the next state, the loss, the gradient
//! norm) are handed to MLX's asynchronous evaluation. [`Overlap`] sets how far the host runs
//! ahead: one step at a time, or building the next step's graph while the device works and
//! handing it over after or before this step's loss is read.

mod callbacks;
mod config;
mod memory_cap;
mod objective;
mod overlap;
mod packing;
mod precision;
mod progress;
mod staged;
mod stepper;
mod trainer;

pub use callbacks::{Callback, Control, EarlyStopping, EvalReport, JsonlLog, StepReport};
pub use config::TrainConfig;
pub(crate) use objective::frozen_tree;
pub use objective::{Objective, ObjectiveLoss};
pub use overlap::Overlap;
pub use packing::StatePacking;
pub use precision::Precision;
pub use progress::{ProgressBar, ProgressLines};
pub(crate) use stepper::Stepper;
pub use trainer::{TrainData, TrainSummary, Trainer};
