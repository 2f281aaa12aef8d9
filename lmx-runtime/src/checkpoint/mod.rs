//! Checkpoints: a training state and the trainer's metadata as safetensors and JSON, written
//! atomically; any parameter tree to and from one safetensors file.
//!
//! A checkpoint is a directory `step-000123/` holding
//! - `model.safetensors`: the parameters, named by the tree's dotted names
//!   (`h.0.attn.c_attn.weight`);
//! - `optimizer.safetensors`: each trainable parameter's optimizer arrays as `<name>.<i>`, the
//!   step count as `step` and the random key as `rng`;
//! - `trainer.json`: what the trainer passes in (step, data position, schedule, configuration,
//!   and the loss of the checkpoint's parameters, by which pruning keeps the best checkpoint and
//!   a diverged run names the one to continue from).
//!
//! It is written into a temporary directory beside it, every file fsynced, then renamed into
//! place ([`atomic`]): an interrupted save leaves the earlier checkpoints loadable, and its
//! leftovers are ignored by [`Checkpoints::list`] and cleaned up by the next save. Loading checks
//! every tensor's name, shape and dtype against the state it loads into, and leaves that state
//! untouched when anything is wrong.
//!
//! Arrays of float32, float16, bfloat16, int32 and uint32 are stored, bit for bit.

pub mod atomic;
pub(crate) mod file;
mod maps;
mod store;
pub(crate) mod tensor;
mod train_state;
mod weights;

pub use atomic::{DurableWriter, FileWriter};
pub use maps::{tree_to_map, update_tree_from_map};
pub use store::{dir_name, Checkpoints, LOSS_FIELD, SANE_LOSS_RATIO};
pub use train_state::{load, FrozenLeaves, MODEL_FILE, OPTIMIZER_FILE, TRAINER_FILE};
pub use weights::{load_tree, load_tree_over, load_tree_over_skipping, save_tree};
