//! Hugging Face model folders in and out: `config.json` mapped to a bundled model's settings,
//! the weights (`model.safetensors`, or shards with their index) memory-mapped and read into a
//! parameter tree by its dotted names, the tokenizer's files; and the same layout written back.
//!
//! ```no_run
//! use lmx_runtime::hf::{load_model, HfFolder};
//! use lmx_runtime::model::LanguageModel;
//!
//! /// A published LLaMA-family folder as the bundled model `M` that its config.json names.
//! fn open<M: LanguageModel>(dir: &std::path::Path) -> lmx_runtime::Result<M::Params> {
//!     let folder = HfFolder::open(dir)?;
//!     let settings = folder.lmx_config()?; // {"d_model": 2048, "n_layers": 22, ...}
//!     println!("{settings:?}");
//!     let (_config, params) = load_model::<M>(&folder, None)?;
//!     Ok(params)
//! }
//! ```

mod config;
mod deepseek;
mod error;
mod experts;
mod export;
mod family;
mod load;
mod model;
mod newer;
mod qwen3_next;
mod recurrent;
mod tokenizer_config;
mod weights;

pub use error::{HfError, Inexpressible};
pub use export::{hf_tensors, write_folder, Carried, DEFAULT_MAX_SHARD_BYTES};
pub use family::{Family, FAMILIES};
pub use load::{load_into, LoadOptions};
pub use model::{load_model, model_config};
pub use tokenizer_config::TokenizerConfig;
pub use weights::{Stored, Weights, INDEX_FILE, WEIGHTS_FILE};

use crate::error::Result;
use crate::tree::Tree;
use mlx_rs::{Array, Dtype};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// The configuration file.
pub const CONFIG_FILE: &str = "config.json";
/// The tokenizer.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// The tokenizer's settings: special tokens, chat template.
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";
/// The chat template as transformers 5 saves it, apart from `tokenizer_config.json`.
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

/// The files besides the weights and `config.json` that a model folder carries along and an
/// export copies: the tokenizer's, and the generation defaults.
const CARRIED_FILES: &[&str] = &[
    TOKENIZER_FILE,
    TOKENIZER_CONFIG_FILE,
    CHAT_TEMPLATE_FILE,
    "special_tokens_map.json",
    "tokenizer.model",
    GENERATION_CONFIG_FILE,
];

/// A model's generation defaults (transformers' `GenerationConfig`).
const GENERATION_CONFIG_FILE: &str = "generation_config.json";

/// A Hugging Face model folder, opened: its configuration read and its family known, its
/// weights mapped (not read).
pub struct HfFolder {
    dir: PathBuf,
    config: Value,
    family: Family,
    weights: Weights,
    tokenizer_config: TokenizerConfig,
}

fn read_json(path: &Path) -> Result<Value, HfError> {
    let text = std::fs::read_to_string(path).map_err(|err| HfError::File {
        path: path.to_owned(),
        message: err.to_string(),
    })?;
    serde_json::from_str(&text).map_err(|err| HfError::File {
        path: path.to_owned(),
        message: format!("not valid JSON: {err}"),
    })
}

impl HfFolder {
    /// Opens the folder `dir`: reads `config.json` (its `model_type` must be one of
    /// [`FAMILIES`]) and `tokenizer_config.json` if present, maps the weights.
    pub fn open(dir: &Path) -> Result<HfFolder> {
        let path = dir.join(CONFIG_FILE);
        let config = read_json(&path)?;
        let family = Family::of_config(&path, &config)?;
        let weights = Weights::open(dir)?;
        let tokenizer_config = TokenizerConfig::read(dir)?;
        Ok(HfFolder {
            dir: dir.to_owned(),
            config,
            family,
            weights,
            tokenizer_config,
        })
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `config.json` as it is, every key kept (`quantization` included).
    pub fn config(&self) -> &Value {
        &self.config
    }

    /// The model family `config.json` names.
    pub fn family(&self) -> Family {
        self.family
    }

    /// The mapped weights.
    pub fn weights(&self) -> &Weights {
        &self.weights
    }

    /// The bundled model's settings that `config.json` gives (see [`Family::lmx_config`]).
    pub fn lmx_config(&self) -> Result<Map<String, Value>> {
        Ok(self
            .family
            .lmx_config(&self.dir.join(CONFIG_FILE), &self.config)?)
    }

    /// `template` (the bundled model's parameters for [`lmx_config`](Self::lmx_config)) with
    /// its leaves read from the weights.
    pub fn load_into<R: Tree<Array>>(&self, template: &R, options: LoadOptions) -> Result<R> {
        let tied = self.family.tied(&self.config);
        load_into(template, &self.weights, self.family, tied, options)
    }

    /// `tokenizer.json`, if the folder has one.
    pub fn tokenizer_file(&self) -> Option<PathBuf> {
        Some(self.dir.join(TOKENIZER_FILE)).filter(|path| path.exists())
    }

    /// `tokenizer_config.json` and the chat template beside the tokenizer.
    pub fn tokenizer_config(&self) -> &TokenizerConfig {
        &self.tokenizer_config
    }

    /// The beginning-of-sequence token `tokenizer_config.json` names.
    pub fn bos_token(&self) -> Option<String> {
        self.tokenizer_config.bos_token()
    }

    /// The end-of-sequence token `tokenizer_config.json` names.
    pub fn eos_token(&self) -> Option<String> {
        self.tokenizer_config.eos_token()
    }

    /// The chat template, unrendered (see [`TokenizerConfig::chat_template`]).
    pub fn chat_template(&self) -> Result<Option<String>> {
        Ok(self
            .tokenizer_config
            .chat_template()?
            .map(|(template, _)| template))
    }

    /// The folder's tokenizer files and generation defaults, which an export carries along.
    pub fn carried_files(&self) -> Vec<Carried> {
        carried_files(&self.dir)
    }
}

/// The tokenizer files and generation defaults of the folder `dir` that an export carries along.
pub fn carried_files(dir: &Path) -> Vec<Carried> {
    present(dir, CARRIED_FILES)
}

/// The files beside a `tokenizer.json` in `dir` that belong to the tokenizer (its settings and
/// special tokens, its chat template, a SentencePiece model), which a folder written with that
/// tokenizer carries along; not the `tokenizer.json` itself nor a model's generation defaults.
pub fn tokenizer_side_files(dir: &Path) -> Vec<Carried> {
    let names: Vec<&str> = CARRIED_FILES
        .iter()
        .copied()
        .filter(|&name| name != TOKENIZER_FILE && name != GENERATION_CONFIG_FILE)
        .collect();
    present(dir, &names)
}

/// Copies of the files `names` that `dir` holds.
fn present(dir: &Path, names: &[&str]) -> Vec<Carried> {
    names
        .iter()
        .map(|name| dir.join(name))
        .filter(|path| path.exists())
        .filter_map(Carried::copy)
        .collect()
}

/// The name `config.json` gives `dtype` (`torch_dtype`).
pub fn dtype_name(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::Float16 => "float16",
        Dtype::Bfloat16 => "bfloat16",
        _ => "float32",
    }
}

/// The keys of a source `config.json` that an export of the model keeps: the special tokens'
/// ids, which belong to the tokenizer the export carries along, not to the model's settings.
const CARRIED_KEYS: &[&str] = &["bos_token_id", "eos_token_id", "pad_token_id"];

/// What [`export`] writes besides the parameters.
pub struct ExportSpec<'a> {
    /// The bundled model's configuration, its settings by name.
    pub lmx_config: &'a Value,
    /// The `config.json` the model was loaded from, if any: its token ids are kept.
    pub source_config: Option<&'a Value>,
    /// The dtype of floating-point weights.
    pub dtype: Dtype,
    /// Files carried along (the tokenizer's).
    pub carry: &'a [Carried],
    /// The largest weights file; a larger model is sharded.
    pub max_shard_bytes: u64,
}

/// Writes `params` of the bundled model of `family` as a Hugging Face folder `dir` (see
/// [`write_folder`]).
pub fn export<R: Tree<Array>>(
    dir: &Path,
    family: Family,
    params: &R,
    spec: &ExportSpec,
) -> Result<()> {
    let mut config = family.hf_config(spec.lmx_config, dtype_name(spec.dtype))?;
    if let (Some(source), Some(object)) = (spec.source_config, config.as_object_mut()) {
        for key in CARRIED_KEYS {
            if let Some(value) = source.get(*key) {
                object.insert((*key).to_owned(), value.clone());
            }
        }
    }
    if let Some(config) = config.as_object_mut() {
        crate::quant::layout::write_config(config, params, &|name| family.mlx_lm_name(name));
    }
    let tensors = hf_tensors(family, params, spec.dtype)?;
    write_folder(dir, &config, &tensors, spec.carry, spec.max_shard_bytes)
}
