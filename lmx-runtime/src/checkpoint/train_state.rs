//! A [`TrainState`] and the trainer's metadata as the files of one checkpoint directory.

use super::file::{encode, read_expected, read_named, Named};
use super::weights::named;
use crate::arrays::Arrays;
use crate::error::{Error, Result};
use crate::optim::Optimizer;
use crate::state::TrainState;
use crate::tree::{self, Tree};
use mlx_rs::Array;
use std::path::Path;

/// The model's parameters, named by their dotted names.
pub const MODEL_FILE: &str = "model.safetensors";
/// The optimizer's state (`<param name>.<i>`), the step count (`step`) and the random key (`rng`).
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
/// The trainer's metadata: step, data position, schedule, configuration.
pub const TRAINER_FILE: &str = "trainer.json";

/// Whether a checkpoint's model file holds the frozen parameters.
///
/// A LoRA run's base is frozen and, read from a Hugging Face folder, can be read from it again:
/// its checkpoints then hold what training changes alone, the adapters and any buffers the step
/// writes (megabytes where the base is gigabytes), and whoever reads one brings the base (see
/// [`load`] and [`load_tree_over`](super::weights::load_tree_over)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FrozenLeaves {
    /// Every parameter is saved.
    #[default]
    Saved,
    /// Only the leaves training changes are saved ([`LeafSpec::changes_in_training`]).
    ///
    /// [`LeafSpec::changes_in_training`]: crate::tree::LeafSpec::changes_in_training
    Omitted,
}

/// The parameters a checkpoint's model file holds.
fn saved_params<P: Tree<Array>>(params: &P, frozen: FrozenLeaves) -> Named {
    let named = named(params);
    match frozen {
        FrozenLeaves::Saved => named,
        FrozenLeaves::Omitted => named
            .into_iter()
            .zip(tree::specs(params))
            .filter(|(_, spec)| spec.changes_in_training())
            .map(|(named, _)| named)
            .collect(),
    }
}

/// The optimizer's arrays named `<param name>.<i>`, then `step` and `rng`.
fn optimizer_named<P: Tree<Array>, O: Optimizer>(state: &TrainState<P, O>) -> Named {
    let mut specs = tree::specs(&state.params).into_iter();
    let mut out = Vec::new();
    state.opt.for_each(&mut |leaf| {
        let spec = specs.next().expect("one spec per leaf");
        let mut arrays = Vec::new();
        leaf.push_arrays(&mut arrays);
        for (index, array) in arrays.into_iter().enumerate() {
            out.push((format!("{}.{index}", spec.name), array));
        }
    });
    out.push(("step".into(), state.step.clone()));
    out.push(("rng".into(), state.key.clone()));
    out
}

/// The files of a checkpoint of `state` and `trainer`, to be written into `dir`.
pub(crate) fn encode_files<P: Tree<Array>, O: Optimizer>(
    dir: &Path,
    state: &TrainState<P, O>,
    trainer: &serde_json::Value,
    frozen: FrozenLeaves,
) -> Result<Vec<(&'static str, Vec<u8>)>> {
    let model = encode(&dir.join(MODEL_FILE), &saved_params(&state.params, frozen))?;
    let optimizer = encode(&dir.join(OPTIMIZER_FILE), &optimizer_named(state))?;
    let trainer = serde_json::to_vec_pretty(trainer).map_err(|err| Error::Checkpoint {
        path: dir.join(TRAINER_FILE),
        message: format!("cannot encode the trainer's metadata: {err}"),
    })?;
    Ok(vec![
        (MODEL_FILE, model),
        (OPTIMIZER_FILE, optimizer),
        (TRAINER_FILE, trainer),
    ])
}

/// Loads the checkpoint in `dir` into `state` and returns the trainer's metadata.
///
/// `state` is the template: the checkpoint must hold its parameters and optimizer arrays by name,
/// with the same shapes and dtypes, except that a checkpoint without the frozen parameters (all
/// of them: [`FrozenLeaves::Omitted`]; buffers are saved there) leaves `state`'s own. On any error (a missing, mismatched
/// or extra tensor, a corrupt file) the error names the file and the tensor, and `state` is left
/// untouched.
pub fn load<P: Tree<Array>, O: Optimizer>(
    dir: &Path,
    state: &mut TrainState<P, O>,
) -> Result<serde_json::Value> {
    if dir.join(MODEL_FILE).is_file() && !dir.join(OPTIMIZER_FILE).exists() {
        // A run made from another (`lmx fuse`, `lmx quantize`) checkpoints its weights alone.
        return Err(Error::Checkpoint {
            path: dir.to_owned(),
            message: "holds a model's weights and no training state (a run written by `lmx \
                      fuse` or `lmx quantize`), so no run resumes from it: train adapters over \
                      it (`lmx lora --base RUN`) in a new run"
                .into(),
        });
    }
    let frozen: Vec<bool> = tree::specs(&state.params)
        .iter()
        .map(|spec| !spec.changes_in_training())
        .collect();
    let params = read_named(&dir.join(MODEL_FILE), &named(&state.params), &|index| {
        frozen[index]
    })?;
    let optimizer = read_expected(&dir.join(OPTIMIZER_FILE), &optimizer_named(state))?;
    let trainer_path = dir.join(TRAINER_FILE);
    let trainer = std::fs::read(&trainer_path).map_err(|cause| Error::Io {
        path: trainer_path.clone(),
        cause,
    })?;
    let trainer = serde_json::from_slice(&trainer).map_err(|err| Error::Checkpoint {
        path: trainer_path,
        message: format!("not valid JSON: {err}"),
    })?;

    let mut params = params.into_iter();
    state.params = state.params.map_same(&mut |leaf| {
        params
            .next()
            .expect("one array per leaf")
            .unwrap_or_else(|| leaf.clone())
    });
    let mut optimizer = optimizer.into_iter();
    state.opt = state
        .opt
        .map_same(&mut |leaf| leaf.rebuild_from(&mut optimizer));
    state.step = optimizer
        .next()
        .expect("the step follows the optimizer's arrays");
    state.key = optimizer.next().expect("the key follows the step");
    Ok(trainer)
}
