//! A run made from another run's checkpoint (`lmx fuse`, `lmx quantize`): a new run directory
//! holding its record, the source's trained tokenizer and one checkpoint, which every command
//! that reads a run reads as it reads a trained one.

use super::run_file::RunFile;
use super::tokenizer::TRAINED_FILE;
use lmx::runtime::checkpoint::{self, MODEL_FILE};
use lmx::runtime::tree::Tree;
use lmx::runtime::Array;
use std::path::Path;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> anyhow::Error + '_ {
    move |err| anyhow::anyhow!("{}: {err}", path.display())
}

/// Writes the run directory `out` (missing, or an empty folder): `record`, a copy of the run
/// directory `source`'s trained tokenizer if it has one, and a checkpoint holding `params`, named
/// as the source's `checkpoint` is (`step-000010`). It is written beside `out` and renamed into
/// place, so that it appears whole or not at all (`checkpoint::atomic::create_dir`).
pub fn write<R: Tree<Array>>(
    out: &Path,
    source: &Path,
    record: &RunFile,
    checkpoint: &Path,
    params: &R,
) -> anyhow::Result<()> {
    let step = checkpoint
        .file_name()
        .and_then(|name| name.to_str())
        .map_or_else(|| checkpoint::dir_name(0), str::to_owned);
    checkpoint::atomic::create_dir(out, |dir| fill(dir, source, record, &step, params))
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
