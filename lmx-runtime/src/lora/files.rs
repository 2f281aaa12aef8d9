//! Adapters saved apart from the base model in mlx-lm's layout: a folder holding
//! `adapters.safetensors` (the adapters' arrays by their dotted names,
//! `model.layers.3.self_attn.q_proj.lora_a`, and DoRA's magnitudes `...q_proj.m`) and
//! `adapter_config.json` (`fine_tune_type`, `num_layers`, `lora_parameters`, as `mlx_lm.lora`
//! writes and `mlx_lm`'s `load_adapters` reads it).
//!
//! A model with buffers (DeepSeek-V3's routing bias) has them written by every training step,
//! the LoRA run's included, so the file holds them too, under the base's names: without them
//! the adapters would be applied to the routing they were not trained with. mlx-lm loads an
//! adapter file non-strictly, so its loader reads them as the base's parameters; a file without
//! them (mlx-lm's own) keeps the base's.

use super::attach::{attach, FineTuneType, LoraParameters};
use crate::checkpoint::atomic::{write_file, DurableWriter};
use crate::checkpoint::file::{encode, read_named, Named};
use crate::error::{Error, Result};
use crate::hf::Family;
use crate::tree::{self, LeafRole, Tree};
use mlx_rs::{Array, Dtype};
use std::path::Path;

/// The adapters' arrays.
pub const ADAPTERS_FILE: &str = "adapters.safetensors";
/// How the adapters were attached.
pub const CONFIG_FILE: &str = "adapter_config.json";

/// `adapter_config.json`: the fields mlx-lm reads back, and whatever else the file holds (mlx-lm
/// writes all of its training arguments there), kept as it was.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AdapterConfig {
    /// `lora` or `dora` (mlx-lm also writes `full`, a whole model rather than adapters, which
    /// is refused).
    #[serde(default)]
    pub fine_tune_type: FineTuneType,
    /// The blocks adapted, counted from the last (-1: all).
    pub num_layers: i64,
    /// Rank, scale, dropout and keys.
    pub lora_parameters: LoraParameters,
    /// The file's other fields.
    #[serde(flatten)]
    pub other: serde_json::Map<String, serde_json::Value>,
}

/// Whether an adapter file holds a leaf of this role.
fn saved(role: LeafRole) -> bool {
    matches!(role, LeafRole::Adapter | LeafRole::Buffer)
}

fn error(path: &Path, message: impl Into<String>) -> Error {
    Error::Checkpoint {
        path: path.to_owned(),
        message: message.into(),
    }
}

/// The adapters and buffers of `tree` by dotted name, in traversal order.
fn adapters<R: Tree<Array> + ?Sized>(tree: &R, family: Option<Family>) -> Named {
    tree::specs(tree)
        .into_iter()
        .zip(tree::flatten(tree))
        .filter(|(spec, _)| saved(spec.role))
        .map(|(spec, array)| match family {
            Some(family) => (family.mlx_lm_name(&spec.name), array),
            None => (spec.name, array),
        })
        .collect()
}

/// Writes the adapters (and buffers) of `tree` into the folder `dir`, as float32 (as mlx-lm
/// keeps them), and `config` beside them; each file is written atomically. Fails when `tree` has
/// no adapter.
///
/// `family`, the tree's Hugging Face family, names the adapters as mlx-lm's module tree names
/// the layers they adapt ([`Family::mlx_lm_name`]); `None` keeps the tree's own names.
pub fn save_adapters<R: Tree<Array> + ?Sized>(
    dir: &Path,
    tree: &R,
    config: &AdapterConfig,
    family: Option<Family>,
) -> Result<()> {
    let tensors_path = dir.join(ADAPTERS_FILE);
    let named = adapters(tree, family)
        .into_iter()
        .map(|(name, array)| Ok((name, array.as_dtype(Dtype::Float32)?)))
        .collect::<Result<Named>>()?;
    let has_adapters = tree::specs(tree)
        .iter()
        .any(|spec| spec.role == LeafRole::Adapter);
    if !has_adapters {
        return Err(error(&tensors_path, "the model has no adapters to save"));
    }
    let bytes = encode(&tensors_path, &named)?;
    write_file(&tensors_path, &bytes, &mut DurableWriter)?;
    let config_path = dir.join(CONFIG_FILE);
    let json = serde_json::to_vec_pretty(config)
        .map_err(|err| error(&config_path, format!("cannot encode: {err}")))?;
    write_file(&config_path, &json, &mut DurableWriter)
}

/// The `adapter_config.json` of the adapter folder `dir`.
pub fn read_config(dir: &Path) -> Result<AdapterConfig> {
    let path = dir.join(CONFIG_FILE);
    let text = std::fs::read(&path).map_err(|cause| Error::Io {
        path: path.clone(),
        cause,
    })?;
    let config: serde_json::Value = serde_json::from_slice(&text)
        .map_err(|err| error(&path, format!("not an adapter configuration: {err}")))?;
    // Named apart, so that mlx-lm's `full` reads as what it is rather than as a bad enum value.
    if let Some(kind) = config
        .get("fine_tune_type")
        .filter(|kind| !matches!(kind.as_str(), Some("lora" | "dora")))
    {
        return Err(error(
            &path,
            format!("fine_tune_type is {kind}; lmx loads `lora` and `dora` adapters"),
        ));
    }
    serde_json::from_value(config)
        .map_err(|err| error(&path, format!("not an adapter configuration: {err}")))
}

/// Attaches the adapters of the folder `dir` to `tree`, as its `adapter_config.json` says, with
/// the arrays of its `adapters.safetensors` (cast to the dtype of the layers they adapt), and
/// returns the configuration.
///
/// The file must hold exactly the adapters the configuration attaches, float32, with their
/// shapes, named as [`save_adapters`] names them for `family`, and either every buffer of the
/// tree or none (then the tree keeps its own); an error names the file and the tensor, and
/// leaves `tree` unchanged.
pub fn load_adapters<R: Tree<Array> + Clone>(
    tree: &mut R,
    dir: &Path,
    family: Option<Family>,
) -> Result<AdapterConfig> {
    let config = read_config(dir)?;
    let mut adapted = tree.clone();
    attach(
        &mut adapted,
        &config.lora_parameters,
        config.num_layers,
        0,
        config.fine_tune_type,
    )
    .map_err(|err| match err {
        // The model's fault, not the file's.
        Error::AlreadyAdapted { .. } => err,
        other => error(&dir.join(CONFIG_FILE), other.to_string()),
    })?;
    let expected = adapters(&adapted, family)
        .into_iter()
        .map(|(name, array)| Ok((name, array.as_dtype(Dtype::Float32)?)))
        .collect::<Result<Named>>()?;
    let specs = tree::specs(&adapted);
    let roles: Vec<LeafRole> = specs
        .iter()
        .map(|spec| spec.role)
        .filter(|role| saved(*role))
        .collect();
    let buffer = |index: usize| roles[index] == LeafRole::Buffer;
    let mut read = read_named(&dir.join(ADAPTERS_FILE), &expected, &buffer)?.into_iter();
    let mut specs = specs.iter();
    let mut failed = None;
    adapted.for_each_mut(&mut |leaf| {
        if !saved(specs.next().expect("one spec per leaf").role) {
            return;
        }
        let Some(array) = read.next().expect("one array per saved leaf") else {
            return; // a buffer the file leaves to the base
        };
        match array.as_dtype(leaf.dtype()) {
            Ok(array) => *leaf = array,
            Err(err) => {
                failed.get_or_insert(err);
            }
        }
    });
    if let Some(err) = failed {
        return Err(err.into());
    }
    *tree = adapted;
    Ok(config)
}
