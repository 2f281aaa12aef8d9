//! What can be wrong with a Hugging Face model folder, each case naming the file and the setting
//! or tensor at fault.

use std::path::PathBuf;

/// A Hugging Face model folder that lmx cannot read as published, or cannot write.
#[derive(Debug, thiserror::Error)]
pub enum HfError {
    /// `config.json` names an architecture no bundled model implements.
    #[error("{}: model_type `{found}` is not supported; the supported ones are {}", path.display(), supported.join(", "))]
    UnknownModelType {
        /// The `config.json`.
        path: PathBuf,
        /// Its `model_type` (`-` when it has none).
        found: String,
        /// The supported `model_type`s.
        supported: Vec<&'static str>,
    },
    /// A setting of `config.json` that the bundled model cannot express, or of the wrong type.
    #[error("{}: `{key}` = {value}: {reason}", path.display())]
    Setting {
        /// The `config.json`.
        path: PathBuf,
        /// The key, dotted for nested ones (`attn_config.clip_qkv`).
        key: String,
        /// Its value as JSON (`-` when missing).
        value: String,
        /// Why lmx cannot use it.
        reason: String,
    },
    /// A shard that `model.safetensors.index.json` names is not in the folder.
    #[error("{}: shard `{shard}` (holding `{tensor}`) is missing", index.display())]
    MissingShard {
        /// The index file.
        index: PathBuf,
        /// The shard's file name.
        shard: String,
        /// A tensor the index places in it.
        tensor: String,
    },
    /// The model has a tensor the weights do not hold.
    #[error("{}: tensor `{tensor}` is missing", path.display())]
    MissingTensor {
        /// The weights file, or the index of sharded weights.
        path: PathBuf,
        /// The tensor's name in the file.
        tensor: String,
    },
    /// A tensor's stored shape is not the one the model's configuration gives it.
    #[error("{}: tensor `{tensor}` has shape {found:?}, the model expects {expected:?}", path.display())]
    WrongShape {
        /// The file holding it.
        path: PathBuf,
        /// The tensor's name in the file.
        tensor: String,
        /// The shape the configuration gives it, as stored.
        expected: Vec<usize>,
        /// The stored shape.
        found: Vec<usize>,
    },
    /// The weights hold tensors the model does not have.
    #[error("{}: unexpected tensor `{tensor}` ({count} tensor(s) the model does not have)", path.display())]
    UnexpectedTensor {
        /// The file holding it.
        path: PathBuf,
        /// The first such tensor, by name.
        tensor: String,
        /// How many there are.
        count: usize,
    },
    /// A file of the folder is missing, unreadable as what it should be, or cannot be written.
    #[error("{}: {message}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// A model whose configuration has no Hugging Face equivalent, found when exporting it.
#[derive(Debug, thiserror::Error)]
#[error("{model}'s `{key}` = {value} cannot be written as a Hugging Face model: {reason}")]
pub struct Inexpressible {
    /// The bundled model's name.
    pub model: String,
    /// Its setting.
    pub key: String,
    /// The setting's value.
    pub value: String,
    /// Why transformers' model of the family cannot express it.
    pub reason: String,
}
