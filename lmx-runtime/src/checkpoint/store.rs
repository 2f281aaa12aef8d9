//! A run's checkpoint directory: `step-000123/` entries saved atomically, listed, pruned.

use super::atomic::{remove_stale, write_dir, DurableWriter, FileWriter};
use super::train_state::encode_files;
use crate::error::{Error, Result};
use crate::optim::Optimizer;
use crate::state::TrainState;
use crate::tree::Tree;
use mlx_rs::Array;
use std::fs;
use std::path::{Path, PathBuf};

/// The checkpoints of one run: `root/step-000123/` directories, each written atomically, the
/// oldest pruned beyond `keep_last`.
#[derive(Clone, Debug)]
pub struct Checkpoints {
    root: PathBuf,
    keep_last: Option<usize>,
}

/// The name of the checkpoint of `step`: `step-` and at least six digits.
pub fn dir_name(step: u64) -> String {
    format!("step-{step:06}")
}

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
        }
    }

    /// Keeps only the `n` most recent checkpoints (and always the one just saved); `n` is at
    /// least 1.
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
        let files = encode_files(&dir, state, trainer)?;
        remove_stale(&self.root)?;
        write_dir(&dir, &files, writer)?;
        self.prune(step)?;
        Ok(dir)
    }

    /// Removes all but the `keep_last` most recent checkpoints, never the one of `saved`.
    fn prune(&self, saved: u64) -> Result<()> {
        let Some(keep) = self.keep_last else {
            return Ok(());
        };
        let all = self.list()?;
        let excess = all.len().saturating_sub(keep);
        for (step, dir) in all.into_iter().take(excess) {
            if step != saved {
                fs::remove_dir_all(&dir).map_err(|cause| Error::Io { path: dir, cause })?;
            }
        }
        Ok(())
    }
}
