//! mlx-lm's quantized layout: `config.json`'s `quantization` entry (mirrored as
//! `quantization_config`) holds the default `group_size`, `bits` and `mode`, and per-layer entries
//! by dotted name: a `{group_size, bits}` object for a layer quantized otherwise, `false` for one
//! left in floating point. A quantized layer stores `NAME.weight` (packed `uint32`),
//! `NAME.scales` and `NAME.biases`.
//!
//! Reading ([`QuantizedLayout::from_config`], [`QuantizedLayout::prepare`]) restructures a
//! model's tree before its weights load: each quantized layer gets placeholders of the shapes
//! and dtypes the file must hold, so that loading by name fills and checks them. A layer without
//! an entry is quantized when the files hold its `scales`, as mlx-lm decides. Writing
//! ([`config_entry`], [`write_config`]) records every layer's quantization so that either tool
//! reads the model back exactly as it was.

use super::{packed_shapes, QuantError, Quantization, StoredMismatch};
use crate::error::{Error, Result};
use crate::hf::{HfError, HfFolder, CONFIG_FILE};
use crate::tree::{LayerMut, Scope, Tree};
use mlx_rs::{Array, Dtype};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// The only mode lmx reads and writes: MLX's affine quantization.
const AFFINE: &str = "affine";

/// A model's quantization as its `config.json` gives it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QuantizedLayout {
    /// The quantization of a layer with no entry of its own whose `scales` the files hold.
    pub default: Option<Quantization>,
    /// Per-layer entries by dotted name: `Some` quantized so, `None` (`false`) not quantized.
    pub layers: BTreeMap<String, Option<Quantization>>,
}

impl QuantizedLayout {
    /// The layout that `config` (a `config.json` value; `place` names it in errors) declares,
    /// or `None` for an unquantized model. `quantization` is read, else `quantization_config`
    /// when it is mlx-lm's form (with `group_size` and `bits`); other quantizers' configurations
    /// (GPTQ, AWQ, bitsandbytes) are refused, never read as unquantized.
    pub fn from_config(config: &Value, place: &str) -> Result<Option<QuantizedLayout>> {
        let (key, entry) = match (
            config.get("quantization"),
            config.get("quantization_config"),
        ) {
            (Some(entry), _) => ("quantization", entry),
            (None, Some(entry)) => ("quantization_config", entry),
            (None, None) => return Ok(None),
        };
        let place = format!("{place}: {key}");
        let Value::Object(entries) = entry else {
            return Err(config_error(&place, "expected an object").into());
        };
        if let Some(method) = entries.get("quant_method") {
            return Err(QuantError::Mode {
                place: format!("{place}.quant_method"),
                mode: method
                    .as_str()
                    .map_or_else(|| method.to_string(), str::to_owned),
            }
            .into());
        }
        let mut layout = QuantizedLayout {
            default: Some(quantization(entries, &place)?),
            layers: BTreeMap::new(),
        };
        for (name, value) in entries {
            if matches!(name.as_str(), "group_size" | "bits" | "mode") {
                continue;
            }
            let place = format!("{place}.{name}");
            let layer = match value {
                Value::Bool(false) => None,
                Value::Bool(true) => layout.default,
                Value::Object(fields) => Some(quantization(fields, &place)?),
                _ => return Err(config_error(&place, "expected an object or a boolean").into()),
            };
            layout.layers.insert(name.clone(), layer);
        }
        Ok(Some(layout))
    }

    /// The quantization of the layer `name`: its own entry, else the default when the files
    /// hold its scales (`has_tensor("NAME.scales")`).
    pub fn layer(&self, name: &str, has_tensor: &dyn Fn(&str) -> bool) -> Option<Quantization> {
        match self.layers.get(name) {
            Some(entry) => *entry,
            None if has_tensor(&format!("{name}.scales")) => self.default,
            None => None,
        }
    }

    /// Makes `tree`'s quantized layers (as [`layer`](Self::layer) decides) placeholders of the
    /// quantized tensors: `weight` a `uint32` array of the packed shape, `scales` and `biases`
    /// of the weight's dtype, so that loading by name fills and checks them. `place` names the
    /// configuration in errors: an entry for a layer the model lacks, or a layer whose rows do
    /// not divide into groups.
    pub fn prepare<R: Tree<Array> + ?Sized>(
        &self,
        tree: &mut R,
        has_tensor: &dyn Fn(&str) -> bool,
        place: &str,
    ) -> Result<()> {
        let mut seen = Vec::new();
        let mut failure = None;
        tree.for_each_layer_mut(&Scope::root(), &mut |scope, layer| {
            let name = scope.name();
            seen.push(name.to_owned());
            let Some(q) = self.layer(name, has_tensor) else {
                return;
            };
            if failure.is_none() {
                if let Err(err) = placeholders(name, layer, q) {
                    failure = Some(err);
                }
            }
        });
        if let Some(err) = failure {
            return Err(err);
        }
        match self.layers.keys().find(|name| !seen.contains(name)) {
            Some(name) => Err(QuantError::UnknownLayer {
                place: format!("{place}: quantization.{name}"),
                layer: name.clone(),
            }
            .into()),
            None => Ok(()),
        }
    }
}

/// Restructures `template` (a model's parameters for `folder`'s configuration) as the
/// quantization that `folder`'s `config.json` declares, if it declares one: what a loader calls
/// before reading the weights into the template.
pub fn prepare_folder<R: Tree<Array> + ?Sized>(template: &mut R, folder: &HfFolder) -> Result<()> {
    let place = folder.dir().join(CONFIG_FILE).display().to_string();
    if let Some(mut layout) = QuantizedLayout::from_config(folder.config(), &place)? {
        let family = folder.family();
        // Entries named as mlx-lm's tree names its layers (GPT-2's `model.h.0...`).
        layout.layers = std::mem::take(&mut layout.layers)
            .into_iter()
            .map(|(name, entry)| (family.name_of_mlx_lm(&name), entry))
            .collect();
        let tied = family.tied(folder.config());
        // The head of a tied model is read from the embedding, so it is quantized as that is.
        let head = family.stored_names("lm_head.weight", tied);
        if let Some(embedding) = head.get(1).and_then(|name| name.strip_suffix(".weight")) {
            if let Some(entry) = layout.layers.get(embedding).copied() {
                layout.layers.entry("lm_head".into()).or_insert(entry);
            }
        }
        let has_tensor = |name: &str| {
            family
                .stored_names(name, tied)
                .iter()
                .any(|stored| folder.weights().contains(stored))
        };
        layout.prepare(template, &has_tensor, &place)?;
    }
    Ok(())
}

/// `err`, an error of loading `folder`'s weights into `template` (prepared by
/// [`prepare_folder`]), told as the quantization setting it breaks when the tensor it names
/// belongs to a quantized layer (a `weight`, `scales` or `biases` of the wrong shape, or
/// missing) or is a packed weight whose `scales` are missing; other errors are returned as they
/// are.
pub fn loading_error<R: Tree<Array> + ?Sized>(
    err: Error,
    template: &R,
    folder: &HfFolder,
) -> Error {
    let (path, tensor, problem) = match &err {
        Error::Hf(HfError::WrongShape {
            path,
            tensor,
            expected,
            found,
        }) => (
            path.display().to_string(),
            tensor,
            format!("has shape {found:?}, not {expected:?}"),
        ),
        Error::Hf(HfError::MissingTensor { path, tensor }) => {
            (path.display().to_string(), tensor, "is missing".to_owned())
        }
        _ => return err,
    };
    let place = folder.dir().join(CONFIG_FILE).display().to_string();
    let Ok(Some(layout)) = QuantizedLayout::from_config(folder.config(), &place) else {
        return err;
    };
    let Some((layer, part)) = tensor.rsplit_once('.') else {
        return err;
    };
    let mut quantized = None;
    let family = folder.family();
    template.for_each_layer(&Scope::root(), &mut |scope, found| {
        // The layer under any name a folder stores it by (its own, mlx-lm's).
        let name = scope.name();
        if name == layer || family.mlx_lm_name(name) == layer {
            quantized = Some(found.quantization());
        }
    });
    let (q, problem) = match (quantized, part) {
        (Some(Some(q)), "weight" | "scales" | "biases") => (q, problem),
        // A layer left in floating point whose stored weight is packed: its scales are missing.
        (Some(None), "weight") => {
            let packed = folder
                .weights()
                .get(tensor)
                .is_ok_and(|stored| stored.dtype == safetensors::Dtype::U32);
            match (
                packed,
                layout.layers.get(layer).copied().unwrap_or(layout.default),
            ) {
                (true, Some(q)) => (
                    q,
                    format!("holds packed values but `{layer}.scales` is missing"),
                ),
                _ => return err,
            }
        }
        _ => return err,
    };
    QuantError::Stored(Box::new(StoredMismatch {
        path,
        tensor: tensor.clone(),
        problem,
        layer: layer.to_owned(),
        config: format!("{place}: quantization"),
        bits: q.bits,
        group_size: q.group_size,
    }))
    .into()
}

/// `tree`'s quantization as mlx-lm's `quantization` entry, or `None` when nothing is
/// quantized: the most common quantization as the default, an object for each layer quantized
/// otherwise and `false` for each layer left in floating point.
pub fn config_entry<R: Tree<Array> + ?Sized>(tree: &R) -> Option<Value> {
    entry_named(tree, &str::to_owned)
}

/// [`config_entry`] with each layer's entry under `layer_name` of its name.
fn entry_named<R: Tree<Array> + ?Sized>(
    tree: &R,
    layer_name: &dyn Fn(&str) -> String,
) -> Option<Value> {
    let mut layers: Vec<(String, Option<Quantization>)> = Vec::new();
    tree.for_each_layer(&Scope::root(), &mut |scope, layer| {
        layers.push((layer_name(scope.name()), layer.quantization()));
    });
    let mut counts: Vec<(Quantization, usize)> = Vec::new();
    for q in layers.iter().filter_map(|(_, q)| *q) {
        match counts.iter_mut().find(|(seen, _)| *seen == q) {
            Some((_, n)) => *n += 1,
            None => counts.push((q, 1)),
        }
    }
    // The first of the most common, so that ties resolve in traversal order.
    let default = counts
        .iter()
        .rev()
        .max_by_key(|(_, n)| *n)
        .map(|(q, _)| *q)?;
    let mut entry = object(default);
    for (name, q) in layers {
        match q {
            Some(q) if q == default => {}
            Some(q) => {
                entry.insert(name, Value::Object(object(q)));
            }
            None => {
                entry.insert(name, Value::Bool(false));
            }
        }
    }
    Some(Value::Object(entry))
}

/// Sets `config`'s `quantization` and `quantization_config` (mlx-lm writes both, the second for
/// Hugging Face's loaders) to `tree`'s quantization, or removes them when nothing is quantized.
/// A layer's own entry is named as mlx-lm's tree names the layer (`layer_name`,
/// `Family::mlx_lm_name`: GPT-2's `model.h.0...`), as [`prepare_folder`] reads it back.
pub fn write_config<R: Tree<Array> + ?Sized>(
    config: &mut Map<String, Value>,
    tree: &R,
    layer_name: &dyn Fn(&str) -> String,
) {
    match entry_named(tree, layer_name) {
        Some(entry) => {
            config.insert("quantization".into(), entry.clone());
            config.insert("quantization_config".into(), entry);
        }
        None => {
            config.remove("quantization");
            config.remove("quantization_config");
        }
    }
}

/// `tree`'s quantization as a run records it (`run.json`'s `quantization`): [`config_entry`]'s
/// form with every quantized layer named (`true` for one at the default), so that
/// [`prepare_recorded`] lays a template out from the record alone, with no weights file to ask
/// which layers hold scales. `None` when nothing is quantized.
pub fn record<R: Tree<Array> + ?Sized>(tree: &R) -> Option<Value> {
    let Some(Value::Object(mut entry)) = config_entry(tree) else {
        return None;
    };
    tree.for_each_layer(&Scope::root(), &mut |scope, layer| {
        if layer.quantization().is_some() {
            entry
                .entry(scope.name().to_owned())
                .or_insert(Value::Bool(true));
        }
    });
    Some(Value::Object(entry))
}

/// Makes `template`'s layers the placeholders that a run's `record` (of [`record`]) declares
/// quantized; `place` names the record in errors (`RUN/run.json`).
pub fn prepare_recorded<R: Tree<Array> + ?Sized>(
    template: &mut R,
    record: &Value,
    place: &str,
) -> Result<()> {
    let config = json!({ "quantization": record });
    if let Some(layout) = QuantizedLayout::from_config(&config, place)? {
        layout.prepare(template, &|_| false, place)?;
    }
    Ok(())
}

/// `{group_size, bits, mode}` as mlx-lm writes them.
fn object(q: Quantization) -> Map<String, Value> {
    let Value::Object(map) = json!({"group_size": q.group_size, "bits": q.bits, "mode": AFFINE})
    else {
        unreachable!("json! of an object literal is an object")
    };
    map
}

/// The `group_size` and `bits` of an entry (mlx-lm's defaults, 64 and 4, where absent), checked.
fn quantization(fields: &Map<String, Value>, place: &str) -> Result<Quantization, QuantError> {
    if let Some(mode) = fields.get("mode") {
        if mode.as_str() != Some(AFFINE) {
            return Err(QuantError::Mode {
                place: place.to_owned(),
                mode: mode
                    .as_str()
                    .map_or_else(|| mode.to_string(), str::to_owned),
            });
        }
    }
    let int = |key: &str, default: i32| match fields.get(key) {
        None => Ok(default),
        Some(value) => value
            .as_i64()
            .and_then(|v| i32::try_from(v).ok())
            .ok_or_else(|| config_error(&format!("{place}.{key}"), "expected an integer")),
    };
    let q = Quantization {
        group_size: int("group_size", 64)?,
        bits: int("bits", 4)?,
    };
    q.check()
        .map_err(|err| config_error(place, &err.to_string()))?;
    Ok(q)
}

fn config_error(place: &str, message: &str) -> QuantError {
    QuantError::Config {
        place: place.to_owned(),
        message: message.to_owned(),
    }
}

/// Turns one layer into placeholders of its quantized tensors.
fn placeholders(name: &str, layer: LayerMut<'_, Array>, q: Quantization) -> Result<()> {
    let (weight, scales, biases, quantization) = super::parts(layer);
    let dtype = match weight.dtype() {
        Dtype::Uint32 => scales.as_ref().map_or(Dtype::Float32, Array::dtype),
        dtype => dtype,
    };
    let dense = match (quantization.as_ref(), scales.as_ref()) {
        // Already a placeholder (or quantized): its dense shape from the packed one.
        (Some(old), Some(_)) => {
            let (&packed, rows) = weight.shape().split_last().unwrap_or((&0, &[]));
            rows.iter()
                .copied()
                .chain([packed * 32 / old.bits])
                .collect()
        }
        _ => weight.shape().to_vec(),
    };
    let (packed, grouped) = packed_shapes(name, &dense, q)?;
    *weight = Array::zeros::<u32>(&packed)?;
    *scales = Some(Array::zeros::<f32>(&grouped)?.as_dtype(dtype)?);
    *biases = Some(Array::zeros::<f32>(&grouped)?.as_dtype(dtype)?);
    *quantization = Some(q);
    Ok(())
}
