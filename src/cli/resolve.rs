//! What `--model` (or a run's recorded model) names: a registered model, a `.lmx` file, or a
//! Hugging Face model folder (one holding `config.json`).

use super::registry::{Registered, Registry};
use lmx::runtime::hf::{HfFolder, CONFIG_FILE};
use std::path::{Path, PathBuf};

/// A resolved model.
pub enum Resolved<'r> {
    /// A model this program has compiled in: by name, or a `.lmx` file with the same source.
    Registered(&'r Registered),
    /// A checked `.lmx` file this program does not hold: it runs in a program built for it
    /// (`model_file`).
    File(ModelFile),
    /// A Hugging Face model folder of a family whose bundled model this program holds.
    Folder(&'r Registered, HfFolder),
}

/// A `.lmx` file that checks.
pub struct ModelFile {
    /// The file, as given.
    pub path: PathBuf,
    /// Its model's name (the module name of its generated code).
    pub name: String,
    /// Its source.
    pub source: String,
}

/// Resolves `model`: a registered model's name, a folder holding `config.json` (opened: its
/// family known, its weights mapped), or a path ending in `.lmx`, which is read and checked (its
/// errors are shown as `lmx check` shows them, with the file's path).
pub fn resolve<'r>(registry: &'r Registry, model: &str) -> anyhow::Result<Resolved<'r>> {
    if let Some(registered) = registry.step(model) {
        return Ok(Resolved::Registered(registered));
    }
    if Path::new(model).join(CONFIG_FILE).is_file() {
        let folder = HfFolder::open(Path::new(model))?;
        let name = folder.family().model_name();
        let registered = registry.step(name).ok_or_else(|| {
            anyhow::anyhow!("{model} holds a {name} model, which this program does not register")
        })?;
        return Ok(Resolved::Folder(registered, folder));
    }
    if !model.ends_with(".lmx") {
        if Path::new(model).is_dir() {
            anyhow::bail!("{model} is a folder without {CONFIG_FILE}, not a Hugging Face model");
        }
        return Err(registry.unknown(model));
    }
    let source = std::fs::read_to_string(model)
        .map_err(|err| anyhow::anyhow!("cannot read {model}: {err}"))?;
    let checked = lmx_grammar::check_source(model, &source)
        .map_err(|rendered| anyhow::anyhow!("{rendered}"))?;
    let name = lmx_grammar::codegen::module_name(&checked);
    if let Some(registered) = registry.step(&name) {
        if registry.source_of(&name) == Some(source.as_str()) {
            return Ok(Resolved::Registered(registered));
        }
    }
    Ok(Resolved::File(ModelFile {
        path: PathBuf::from(model),
        name,
        source,
    }))
}
