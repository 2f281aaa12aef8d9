//! A run's checkpoint directory: `step-000123/` entries saved atomically, listed, pruned.

use super::atomic::{remove_stale, write_dir, DurableWriter, FileWriter};
use super::train_state::{encode_files, FrozenLeaves, TRAINER_FILE};
use crate::error::{Error, Result};
use crate::optim::Optimizer;
use crate::state::TrainState;
use crate::tree::Tree;
use mlx_rs::Array;
use std::fs;
use std::path::{Path, PathBuf};

/// The checkpoints of one run: `root/step-000123/` directories, each written atomically, the
/// oldest pruned beyond `keep_last` except the one of lowest loss.
#[derive(Clone, Debug)]
pub struct Checkpoints {
    root: PathBuf,
    keep_last: Option<usize>,
    frozen: FrozenLeaves,
}

/// The name of the checkpoint of `step`: `step-` and at least six digits.
pub fn dir_name(step: u64) -> String {
    format!("step-{step:06}")
}

/// How far above the lowest loss of a run's checkpoints a checkpoint's loss may be for a diverged
/// run to be continued from it: a tenth. Far enough for the noise of one batch's loss; a
/// checkpoint whose parameters have begun to blow up is much further.
pub const SANE_LOSS_RATIO: f32 = 1.1;

/// The field of a checkpoint's `trainer.json` that holds the loss of its parameters.
pub const LOSS_FIELD: &str = "loss";

/// The step of a checkpoint directory's name, or `None` for any other entry.
fn parse_dir_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("step-")?;
    if digits.is_empty() || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

impl Checkpoints {
    /// The checkpoints under `root` (created on the first save), all of them kept.
    pub fn new(root: impl Into<PathBuf>) -> Checkpoints {
        Checkpoints {
            root: root.into(),
            keep_last: None,
            frozen: FrozenLeaves::Saved,
        }
    }

    /// Says whether the checkpoints hold the frozen parameters (see [`FrozenLeaves`]).
    pub fn frozen(self, frozen: FrozenLeaves) -> Checkpoints {
        Checkpoints { frozen, ..self }
    }

    /// Keeps only the `n` most recent checkpoints (and always the one just saved), and besides
    /// them the one of lowest [loss](Checkpoints::loss); `n` is at least 1.
    pub fn keep_last(self, n: usize) -> Checkpoints {
        Checkpoints {
            keep_last: Some(n.max(1)),
            ..self
        }
    }

    /// The directory holding the checkpoints.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the checkpoint of `step` is (or would be).
    pub fn dir(&self, step: u64) -> PathBuf {
        self.root.join(dir_name(step))
    }

    /// The complete checkpoints, by increasing step. Temporary entries of interrupted saves and
    /// anything not named `step-<digits>` are ignored; a missing root holds none.
    pub fn list(&self) -> Result<Vec<(u64, PathBuf)>> {
        let entries = match fs::read_dir(&self.root) {
            Ok(entries) => entries,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(cause) => {
                return Err(Error::Io {
                    path: self.root.clone(),
                    cause,
                })
            }
        };
        let mut found = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|cause| Error::Io {
                path: self.root.clone(),
                cause,
            })?;
            let step = parse_dir_name(&entry.file_name().to_string_lossy());
            if let (Some(step), true) = (step, entry.path().is_dir()) {
                found.push((step, entry.path()));
            }
        }
        found.sort();
        Ok(found)
    }

    /// The most recent complete checkpoint.
    pub fn latest(&self) -> Result<Option<PathBuf>> {
        Ok(self.list()?.pop().map(|(_, dir)| dir))
    }

    /// Saves `state` and the trainer's metadata as the checkpoint of `step`, atomically, then
    /// prunes old checkpoints; returns the checkpoint's directory.
    ///
    /// The state's arrays are evaluated here: call it at a step boundary.
    pub fn save<P: Tree<Array>, O: Optimizer>(
        &self,
        step: u64,
        state: &TrainState<P, O>,
        trainer: &serde_json::Value,
    ) -> Result<PathBuf> {
        self.save_with(step, state, trainer, &mut DurableWriter)
    }

    /// [`Checkpoints::save`] writing each file through `writer`.
    pub fn save_with<P: Tree<Array>, O: Optimizer>(
        &self,
        step: u64,
        state: &TrainState<P, O>,
        trainer: &serde_json::Value,
        writer: &mut dyn FileWriter,
    ) -> Result<PathBuf> {
        let dir = self.dir(step);
        let files = encode_files(&dir, state, trainer, self.frozen)?;
        remove_stale(&self.root)?;
        write_dir(&dir, &files, writer)?;
        self.prune(step)?;
        Ok(dir)
    }

    /// The loss of the parameters of the checkpoint in `dir`, as its `trainer.json` records it
    /// under [`LOSS_FIELD`]; `None` where it records none, or no finite one.
    pub fn loss(dir: &Path) -> Result<Option<f32>> {
        let path = dir.join(TRAINER_FILE);
        let text = fs::read(&path).map_err(|cause| Error::Io {
            path: path.clone(),
            cause,
        })?;
        let trainer: serde_json::Value =
            serde_json::from_slice(&text).map_err(|err| Error::Checkpoint {
                path,
                message: format!("not valid JSON: {err}"),
            })?;
        Ok(trainer
            .get(LOSS_FIELD)
            .and_then(serde_json::Value::as_f64)
            .map(|loss| loss as f32)
            .filter(|loss| loss.is_finite()))
    }

    /// The checkpoints with a recorded finite loss, by increasing step. One whose `trainer.json`
    /// cannot be read is no candidate (it could not be resumed from either), and no reason to
    /// fail a save that prunes.
    fn losses(&self) -> Result<Vec<(u64, PathBuf, f32)>> {
        let mut found = Vec::new();
        for (step, dir) in self.list()? {
            if let Ok(Some(loss)) = Self::loss(&dir) {
                found.push((step, dir, loss));
            }
        }
        Ok(found)
    }

    /// The checkpoint a diverged run can continue from, with its loss: the most recent one whose
    /// loss is at most [`SANE_LOSS_RATIO`] times the lowest. Checkpoints that record no loss
    /// are not candidates.
    pub fn last_sane(&self) -> Result<Option<(PathBuf, f32)>> {
        let losses = self.losses()?;
        let best = losses
            .iter()
            .map(|(_, _, loss)| *loss)
            .fold(f32::INFINITY, f32::min);
        Ok(losses
            .into_iter()
            .rev()
            .find(|(_, _, loss)| *loss <= best + (SANE_LOSS_RATIO - 1.0) * best.abs())
            .map(|(_, dir, loss)| (dir, loss)))
    }

    /// Removes all but the `keep_last` most recent checkpoints and the one of lowest loss, never
    /// the one of `saved`.
    fn prune(&self, saved: u64) -> Result<()> {
        let Some(keep) = self.keep_last else {
            return Ok(());
        };
        let all = self.list()?;
        let excess = all.len().saturating_sub(keep);
        if excess == 0 {
            return Ok(());
        }
        let best = self
            .losses()?
            .into_iter()
            .min_by(|a, b| a.2.total_cmp(&b.2))
            .map(|(step, _, _)| step);
        for (step, dir) in all.into_iter().take(excess) {
            if step != saved && Some(step) != best {
                fs::remove_dir_all(&dir).map_err(|cause| Error::Io { path: dir, cause })?;
            }
        }
        Ok(())
    }

    /// Removes every checkpoint after `step`, so that a run continued from the checkpoint of
    /// `step` never mixes with the later ones of the run it leaves; returns the removed ones.
    pub fn remove_after(&self, step: u64) -> Result<Vec<PathBuf>> {
        let mut removed = Vec::new();
        for (later, dir) in self.list()? {
            if later > step {
                fs::remove_dir_all(&dir).map_err(|cause| Error::Io {
                    path: dir.clone(),
                    cause,
                })?;
                removed.push(dir);
            }
        }
        Ok(removed)
    }
}
