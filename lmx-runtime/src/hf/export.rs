//! Writing a model as a Hugging Face folder, as `save_pretrained` lays it out: `config.json`,
//! `model.safetensors` (or shards of at most a given size with `model.safetensors.index.json`),
//! and the tokenizer's files.
//!
//! The folder is written beside its destination under a temporary name, every file fsynced, and
//! renamed into place: it appears complete or not at all.

use super::error::HfError;
use super::experts::per_expert_names;
use super::family::Family;
use super::weights::{INDEX_FILE, WEIGHTS_FILE};
use crate::checkpoint::atomic;
use crate::error::Result;
use crate::tree::{self, Layer, Scope, Tree};
use half::{bf16, f16};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::transforms::eval;
use mlx_rs::{Array, ArrayElement, Dtype};
use safetensors::Dtype as FileDtype;
use serde_json::{json, Value};
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

/// transformers' default largest shard, `"5GB"`.
pub const DEFAULT_MAX_SHARD_BYTES: u64 = 5_000_000_000;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> HfError + '_ {
    move |err| HfError::File {
        path: path.to_owned(),
        message: err.to_string(),
    }
}

/// The leaves of `params` (a `family` model's) named and laid out as the family's published
/// checkpoints store them, floating-point ones cast to `dtype`, evaluated: under their own names
/// (GPT-2's without the `transformer.` prefix of transformers' `GPT2LMHeadModel`, as the
/// published `gpt2` stores them, which transformers and mlx-lm both read; mlx-lm finds no
/// prefixed name), transposed where the family stores them so. Quantized stacked experts stay stacked, with
/// their scales and biases, as mlx-lm saves its `QuantizedSwitchLinear` (transformers has no
/// layout for MLX's quantization, and mlx-lm reads the stacked one). A quantized model whose
/// family stores weights transposed (GPT-2's `Conv1D`, which a packed weight cannot be) is laid
/// out as mlx-lm saves it instead: its own names (`model.h.0...`), every weight as the model holds
/// it, which mlx-lm's loader takes as they are.
pub fn hf_tensors<R: Tree<Array>>(
    family: Family,
    params: &R,
    dtype: Dtype,
) -> Result<Vec<(String, Array)>> {
    let mut packed = HashSet::new();
    params.for_each_layer(&Scope::root(), &mut |scope, layer| {
        if let (Layer::SwitchLinear(_), Some(_)) = (&layer, layer.quantization()) {
            packed.insert(format!("{}.weight", scope.name()));
        }
    });
    let mlx_lm_layout = in_mlx_lm_layout(family, params);
    let mut tensors = Vec::new();
    for (name, leaf) in tree::names(params).into_iter().zip(tree::flatten(params)) {
        let mut array = leaf;
        if matches!(
            array.dtype(),
            Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16
        ) && array.dtype() != dtype
        {
            array = array.as_dtype(dtype)?;
        }
        if mlx_lm_layout {
            tensors.push((family.mlx_lm_name(&name), array.contiguous()?));
            continue;
        }
        if family.transposed(&name) {
            array = array.t();
        }
        let experts = array.shape().first().map_or(0, |&n| n as usize);
        match per_expert_names(family, &name, experts).filter(|_| !packed.contains(&name)) {
            Some(names) => {
                for (e, name) in names.into_iter().enumerate() {
                    let expert = array.index(e as i32);
                    tensors.push((name, expert.contiguous()?));
                }
            }
            None => tensors.push((name, array.contiguous()?)),
        }
    }
    eval(tensors.iter().map(|(_, array)| array))?;
    Ok(tensors)
}

/// Whether `params` (a `family` model's) is written in mlx-lm's own layout: quantized, of a
/// family that stores some weight transposed, which a packed weight cannot be.
fn in_mlx_lm_layout<R: Tree<Array>>(family: Family, params: &R) -> bool {
    let mut quantized = false;
    params.for_each_layer(&Scope::root(), &mut |_, layer| {
        quantized |= layer.quantization().is_some();
    });
    quantized
        && tree::names(params)
            .iter()
            .any(|name| family.transposed(name))
}

/// An evaluated, contiguous array's bytes, as safetensors serializes a tensor.
struct ArrayView<'a> {
    dtype: FileDtype,
    shape: Vec<usize>,
    data: &'a [u8],
}

fn bytes_of<T: ArrayElement>(array: &Array) -> std::result::Result<&[u8], String> {
    let values = array.try_as_slice::<T>().map_err(|err| err.to_string())?;
    // SAFETY: a slice of plain numbers viewed as its bytes, for as long as the array lives.
    Ok(
        unsafe {
            std::slice::from_raw_parts(values.as_ptr().cast(), std::mem::size_of_val(values))
        },
    )
}

impl<'a> ArrayView<'a> {
    fn new(path: &Path, name: &str, array: &'a Array) -> std::result::Result<Self, HfError> {
        let (dtype, data) = match array.dtype() {
            Dtype::Float32 => (FileDtype::F32, bytes_of::<f32>(array)),
            Dtype::Float16 => (FileDtype::F16, bytes_of::<f16>(array)),
            Dtype::Bfloat16 => (FileDtype::BF16, bytes_of::<bf16>(array)),
            Dtype::Int32 => (FileDtype::I32, bytes_of::<i32>(array)),
            Dtype::Uint32 => (FileDtype::U32, bytes_of::<u32>(array)),
            Dtype::Uint8 => (FileDtype::U8, bytes_of::<u8>(array)),
            other => (
                FileDtype::F32,
                Err(format!("{other:?} tensors cannot be stored")),
            ),
        };
        let data = data.map_err(|message| HfError::File {
            path: path.to_owned(),
            message: format!("{name}: {message}"),
        })?;
        Ok(ArrayView {
            dtype,
            shape: array.shape().iter().map(|&dim| dim as usize).collect(),
            data,
        })
    }
}

impl safetensors::View for &ArrayView<'_> {
    fn dtype(&self) -> FileDtype {
        self.dtype
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(self.data)
    }

    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// Groups `tensors` in order into shards of at most `max_bytes` each (a larger tensor alone), as
/// `save_pretrained` does.
fn shards(tensors: &[(String, Array)], max_bytes: u64) -> Vec<&[(String, Array)]> {
    let mut shards = Vec::new();
    let (mut start, mut size) = (0, 0u64);
    for (index, (_, array)) in tensors.iter().enumerate() {
        let bytes = array.nbytes() as u64;
        if index > start && size + bytes > max_bytes {
            shards.push(&tensors[start..index]);
            (start, size) = (index, 0);
        }
        size += bytes;
    }
    shards.push(&tensors[start..]);
    shards
}

/// Writes one safetensors file of `tensors` and fsyncs it.
fn write_safetensors(path: &Path, tensors: &[(String, Array)]) -> Result<()> {
    let views = tensors
        .iter()
        .map(|(name, array)| Ok((name.as_str(), ArrayView::new(path, name, array)?)))
        .collect::<std::result::Result<Vec<_>, HfError>>()?;
    // transformers refuses a file without the format it was saved from.
    let metadata = HashMap::from([("format".to_owned(), "pt".to_owned())]);
    safetensors::serialize_to_file(
        views.iter().map(|(name, view)| (*name, view)),
        Some(metadata),
        path,
    )
    .map_err(|err| HfError::File {
        path: path.to_owned(),
        message: format!("cannot write: {err}"),
    })?;
    sync(path)
}

fn sync(path: &Path) -> Result<()> {
    fs::File::open(path)
        .and_then(|file| file.sync_all())
        .map_err(io(path))?;
    Ok(())
}

fn write_json(path: &Path, value: &Value) -> Result<()> {
    fs::write(path, json_text(value)).map_err(io(path))?;
    sync(path)
}

/// `value` as a folder's JSON files hold it: indented, with a final line break.
fn json_text(value: &Value) -> String {
    let mut text = serde_json::to_string_pretty(value).expect("JSON values serialize");
    text.push('\n');
    text
}

/// A file a written folder carries besides its weights: a copy of one (a tokenizer's files, a
/// model's generation defaults), or one written from its text (the byte tokenizer's
/// `tokenizer.json`, which no file holds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Carried {
    /// A copy of the file `from`, named `name` in the folder.
    Copy { from: PathBuf, name: String },
    /// A file `name` holding `text`.
    Text { name: String, text: String },
}

impl Carried {
    /// A copy of the file `from` under its own name (none for a path that names no file).
    pub fn copy(from: PathBuf) -> Option<Carried> {
        let name = from.file_name()?.to_string_lossy().into_owned();
        Some(Carried::Copy { from, name })
    }

    /// A file `name` holding `value`, written as the folder's `config.json` is.
    pub fn json(name: impl Into<String>, value: &Value) -> Carried {
        Carried::Text {
            name: name.into(),
            text: json_text(value),
        }
    }
}

/// Writes the folder `dir`: `config`, `tensors` (named as stored) in one file or in shards of at
/// most `max_shard_bytes`, and the files `carry`.
///
/// `dir` must not exist or be empty; nothing appears under its name until everything is written.
pub fn write_folder(
    dir: &Path,
    config: &Value,
    tensors: &[(String, Array)],
    carry: &[Carried],
    max_shard_bytes: u64,
) -> Result<()> {
    atomic::create_dir(dir, |temp| {
        fill(temp, config, tensors, carry, max_shard_bytes)
    })
}

fn fill(
    dir: &Path,
    config: &Value,
    tensors: &[(String, Array)],
    carry: &[Carried],
    max_shard_bytes: u64,
) -> Result<()> {
    write_json(&dir.join("config.json"), config)?;
    let shards = shards(tensors, max_shard_bytes.max(1));
    if let [only] = shards.as_slice() {
        write_safetensors(&dir.join(WEIGHTS_FILE), only)?;
    } else {
        let count = shards.len();
        let mut weight_map = serde_json::Map::new();
        for (index, shard) in shards.iter().enumerate() {
            let file = format!("model-{:05}-of-{count:05}.safetensors", index + 1);
            write_safetensors(&dir.join(&file), shard)?;
            for (name, _) in shard.iter() {
                weight_map.insert(name.clone(), file.clone().into());
            }
        }
        let total: usize = tensors.iter().map(|(_, array)| array.nbytes()).sum();
        write_json(
            &dir.join(INDEX_FILE),
            &json!({ "metadata": { "total_size": total }, "weight_map": weight_map }),
        )?;
    }
    for file in carry {
        let target = match file {
            Carried::Copy { from, name } => {
                let target = dir.join(name);
                fs::copy(from, &target).map_err(io(from))?;
                target
            }
            Carried::Text { name, text } => {
                let target = dir.join(name);
                fs::write(&target, text).map_err(io(&target))?;
                target
            }
        };
        sync(&target)?;
    }
    Ok(())
}
