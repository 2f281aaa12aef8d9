//! A run made from another run's checkpoint (`lmx fuse`, `lmx quantize`): a new run directory
//! holding its record, the source's trained tokenizer and one checkpoint, which every command
//! that reads a run reads as it reads a trained one.

use super::run_file::RunFile;
use super::tokenizer::TRAINED_FILE;
use lmx::runtime::checkpoint::{self, MODEL_FILE};
use lmx::runtime::tree::Tree;
use lmx::runtime::Array;
use std::path::{Path, PathBuf};

/// Where a run is staged before it is renamed into place: a sibling that `lmx` alone names so.
const STAGING_PREFIX: &str = ".lmx-partial-";

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> anyhow::Error + '_ {
    move |err| anyhow::anyhow!("{}: {err}", path.display())
}

/// Fails unless `out` is free for a new run: missing, or an empty folder. Called before the
/// work, so that a taken name costs nothing.
pub fn refuse_occupied(out: &Path) -> anyhow::Result<()> {
    let occupied = std::fs::read_dir(out).is_ok_and(|mut entries| entries.next().is_some());
    if occupied || (out.exists() && !out.is_dir()) {
        anyhow::bail!(
            "{} exists and is not an empty folder: give a new --out",
            out.display()
        );
    }
    Ok(())
}

/// Writes the run directory `out` (missing, or an empty folder): `record`, a copy of the run
/// directory `source`'s trained tokenizer if it has one, and a checkpoint holding `params`, named
/// as the source's `checkpoint` is (`step-000010`). It is written beside `out` and renamed into
/// place, so that it appears whole or not at all.
pub fn write<R: Tree<Array>>(
    out: &Path,
    source: &Path,
    record: &RunFile,
    checkpoint: &Path,
    params: &R,
) -> anyhow::Result<()> {
    refuse_occupied(out)?;
    let step = checkpoint
        .file_name()
        .and_then(|name| name.to_str())
        .map_or_else(|| checkpoint::dir_name(0), str::to_owned);
    let name = out
        .file_name()
        .ok_or_else(|| anyhow::anyhow!("{}: not a folder's name", out.display()))?;
    let parent = match out.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(io(&parent))?;
    let staging = parent.join(format!("{STAGING_PREFIX}{}", name.to_string_lossy()));
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(io(&staging))?;
    }
    let written = fill(&staging, source, record, &step, params).and_then(|()| {
        if out.exists() {
            std::fs::remove_dir(out).map_err(io(out))?;
        }
        std::fs::rename(&staging, out).map_err(io(out))
    });
    if written.is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    written
}

fn fill<R: Tree<Array>>(
    dir: &Path,
    source: &Path,
    record: &RunFile,
    step: &str,
    params: &R,
) -> anyhow::Result<()> {
    let checkpoint = dir.join("checkpoints").join(step);
    std::fs::create_dir_all(&checkpoint).map_err(io(&checkpoint))?;
    checkpoint::save_tree(&checkpoint.join(MODEL_FILE), params)?;
    let trained = source.join(TRAINED_FILE);
    if trained.is_file() {
        let copy = dir.join(TRAINED_FILE);
        std::fs::copy(&trained, &copy).map_err(io(&copy))?;
    }
    record.write(dir)
}
