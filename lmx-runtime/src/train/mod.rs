//! Training: the loop around the compiled step, with data, schedules, evaluation, checkpoints and
//! callbacks.
//!
//! One evaluation boundary per step: the step's outputs (the next state, the loss, the gradient
//! norm) are handed to MLX's asynchronous evaluation, the next batch is prepared on the host while
//! the device works, and only then is the loss read.

mod callbacks;
mod config;
mod precision;
mod trainer;

pub use callbacks::{
    Callback, Control, EarlyStopping, EvalReport, JsonlLog, ProgressBar, StepReport,
};
pub use config::{Overlap, TrainConfig};
pub use precision::Precision;
pub use trainer::{TrainSummary, Trainer};
