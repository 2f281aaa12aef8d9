//! A parameter tree's leaves read from a folder's weights by the tree's dotted names.
//!
//! The tree decides what is read: every leaf is looked up under the names a checkpoint gives it
//! ([`Family::stored_names`]), so a tree that other code restructured (adapters, quantized layers)
//! loads the same way, as long as its leaves are named as the file's tensors.

use super::error::HfError;
use super::experts::per_expert_names;
use super::family::Family;
use super::weights::Weights;
use crate::error::Result;
use crate::nn;
use crate::tree::{self, LeafSpec, Tree};
use mlx_rs::transforms::eval;
use mlx_rs::{ops, Array, Dtype};
use std::collections::HashSet;

/// Which leaves to read, and as what.
#[derive(Clone, Copy)]
pub struct LoadOptions<'a> {
    /// The dtype floating-point tensors are cast to; `None`: the template leaf's dtype. Integer
    /// tensors (quantized weights) keep their stored dtype.
    pub dtype: Option<Dtype>,
    /// Leaves the weights need not hold: they keep the template's value (new adapters).
    pub optional: &'a dyn Fn(&LeafSpec) -> bool,
}

impl Default for LoadOptions<'_> {
    fn default() -> Self {
        LoadOptions {
            dtype: None,
            optional: &|_| false,
        }
    }
}

fn is_float(dtype: Dtype) -> bool {
    matches!(dtype, Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16)
}

/// `template` with every leaf read from `weights` (of a `family` model whose head is `tied` to
/// the embedding in its `config.json`).
///
/// Each leaf's stored shape must be the template's (transposed where the family stores it so);
/// every stored tensor must be read, or be one transformers itself skips. The template's values
/// are not read: a template whose arrays are unevaluated (fresh from `init`) costs no memory.
pub fn load_into<R: Tree<Array>>(
    template: &R,
    weights: &Weights,
    family: Family,
    tied: bool,
    options: LoadOptions,
) -> Result<R> {
    let specs = tree::specs(template);
    let leaves = tree::flatten(template);
    let mut used = HashSet::new();
    let mut loaded = Vec::with_capacity(leaves.len());
    for (spec, leaf) in specs.iter().zip(leaves) {
        let candidates = family.stored_names(&spec.name, tied);
        let experts = leaf.shape().first().map_or(0, |&n| n as usize);
        let per_expert = per_expert_names(family, &candidates[0], experts);
        let Some(stored_name) = candidates.iter().find(|name| weights.contains(name)) else {
            // A stacked experts' leaf that the file stores per expert (transformers' layout).
            let missing = per_expert
                .as_ref()
                .and_then(|names| names.iter().find(|name| !weights.contains(name)));
            if let (Some(names), None) = (&per_expert, missing) {
                loaded.push(stacked(weights, names, &leaf, options)?);
                used.extend(names.iter().cloned());
                continue;
            }
            if (options.optional)(spec) {
                loaded.push(leaf);
                continue;
            }
            let tensor = missing.unwrap_or_else(|| named_as_stored(&candidates, weights));
            return Err(HfError::MissingTensor {
                path: weights.source().to_owned(),
                tensor: tensor.clone(),
            }
            .into());
        };
        used.insert(stored_name.clone());
        let stored = weights.get(stored_name)?;
        let transposed = family.stored_transposed(&spec.name, stored_name);
        let mut expected: Vec<usize> = leaf.shape().iter().map(|&dim| dim as usize).collect();
        if transposed {
            expected.reverse();
        }
        if stored.shape != expected {
            return Err(HfError::WrongShape {
                path: stored.path.to_owned(),
                tensor: stored_name.clone(),
                expected,
                found: stored.shape,
            }
            .into());
        }
        let mut array = stored.to_array()?;
        if transposed {
            array = array.t();
        }
        let want = options.dtype.unwrap_or(leaf.dtype());
        let converted = is_float(array.dtype()) && is_float(want) && array.dtype() != want;
        if converted {
            array = array.as_dtype(want)?;
        }
        if transposed {
            array = array.contiguous()?;
        }
        // Converted, or transposed with two axes longer than 1 (so that making it contiguous
        // copies it), it is a device operation's output; otherwise the host made it.
        let copied =
            converted || (transposed && stored.shape.iter().filter(|&&d| d > 1).count() > 1);
        if !copied {
            array = nn::device_resident(&array)?;
        }
        // Evaluated now, so that the stored-dtype copy is freed before the next tensor.
        eval([&array])?;
        loaded.push(array);
    }
    let extra: Vec<&str> = weights
        .names()
        .filter(|name| !used.contains(*name) && !family.skipped(name, tied))
        .collect();
    if let Some(first) = extra.first() {
        return Err(HfError::UnexpectedTensor {
            path: weights.source().to_owned(),
            tensor: (*first).to_owned(),
            count: extra.len(),
        }
        .into());
    }
    nn::release_host_buffers()?;
    let mut loaded = loaded.into_iter();
    Ok(template.map_same(&mut |_| loaded.next().expect("one array per leaf")))
}

/// Which of a missing leaf's `candidates` (its stored names, the family's usual first) to name:
/// the first whose prefix the file's other tensors share (GPT-2's `transformer.` or `model.`),
/// so that the message names the tensor as the file would hold it.
fn named_as_stored<'a>(candidates: &'a [String], weights: &Weights) -> &'a String {
    let leaf = &candidates[0];
    candidates
        .iter()
        .find(|name| {
            let prefix = name.strip_suffix(leaf.as_str()).unwrap_or("");
            !prefix.is_empty() && weights.names().any(|stored| stored.starts_with(prefix))
        })
        .unwrap_or(leaf)
}

/// The experts' tensors `names` stacked into one `[experts, out, in]` leaf shaped as `leaf`.
fn stacked(
    weights: &Weights,
    names: &[String],
    leaf: &Array,
    options: LoadOptions,
) -> Result<Array> {
    let expected: Vec<usize> = leaf.shape()[1..].iter().map(|&dim| dim as usize).collect();
    let want = options.dtype.unwrap_or(leaf.dtype());
    let mut experts = Vec::with_capacity(names.len());
    for name in names {
        let stored = weights.get(name)?;
        if stored.shape != expected {
            return Err(HfError::WrongShape {
                path: stored.path.to_owned(),
                tensor: name.clone(),
                expected,
                found: stored.shape,
            }
            .into());
        }
        let mut array = stored.to_array()?;
        if is_float(array.dtype()) && is_float(want) && array.dtype() != want {
            array = array.as_dtype(want)?;
        }
        experts.push(array);
    }
    let array = ops::stack(&experts, 0)?;
    eval([&array])?;
    Ok(array)
}
