//! `run.json`: what a run directory was trained with, so that `generate` and `--resume` need
//! nothing but the directory.

use super::tokenizer::TokenizerSpec;
use lmx::runtime::train::TrainConfig;
use std::path::Path;

/// The contents of `RUN/run.json`.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct RunFile {
    /// The bundled model's name.
    pub model: String,
    /// The preset the configuration came from.
    pub preset: String,
    /// The model's configuration.
    pub model_config: serde_json::Value,
    /// The tokenizer.
    pub tokenizer: TokenizerSpec,
    /// The training settings.
    pub train: TrainConfig,
}

impl RunFile {
    /// Writes `dir/run.json`, atomically.
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join("run.json");
        let temporary = dir.join(".run.json.partial");
        std::fs::write(&temporary, serde_json::to_vec_pretty(self)?)?;
        std::fs::rename(&temporary, &path)?;
        Ok(())
    }

    /// Reads `dir/run.json`.
    pub fn read(dir: &Path) -> anyhow::Result<RunFile> {
        let path = dir.join("run.json");
        let text = std::fs::read_to_string(&path).map_err(|err| {
            anyhow::anyhow!(
                "{}: {err} (is {} a run directory?)",
                path.display(),
                dir.display()
            )
        })?;
        serde_json::from_str(&text).map_err(|err| anyhow::anyhow!("{}: {err}", path.display()))
    }
}
