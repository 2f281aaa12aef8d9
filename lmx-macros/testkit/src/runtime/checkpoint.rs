//! Parameter trees by name: flat maps and safetensors files, with every tensor checked.
//!
//! The dotted names of [`Tree::describe`] are the keys; loading checks that a file or map holds
//! exactly the tree's names, each with the shape and dtype of the leaf it replaces, and names the
//! tensor in every error. Nothing changes when a check fails.

use crate::runtime::tree::{self, LeafSpec, Tree};
use crate::runtime::{Array, Error, Result};
use std::collections::HashMap;
use std::path::Path;

/// The number of scalars in the leaves whose spec passes `keep`.
pub fn parameter_count<R: Tree<Array>>(tree: &R, keep: impl Fn(&LeafSpec) -> bool) -> usize {
    let mut specs = tree::specs(tree).into_iter();
    let mut count = 0;
    tree.for_each(&mut |leaf| {
        if keep(&specs.next().expect("one spec per leaf")) {
            count += leaf.size();
        }
    });
    count
}

/// The leaves by dotted name.
pub fn tree_to_map<R: Tree<Array>>(tree: &R) -> HashMap<String, Array> {
    tree::names(tree)
        .into_iter()
        .zip(tree::flatten(tree))
        .collect()
}

/// Replaces every leaf of `tree` by the tensor of its name in `tensors`.
///
/// Fails, naming the tensor, when one is missing, has another shape or dtype, or when `tensors`
/// holds names the tree does not have.
pub fn update_tree_from_map<R: Tree<Array>>(
    tree: &mut R,
    tensors: HashMap<String, Array>,
) -> Result<()> {
    let leaves = checked_leaves(tree, tensors).map_err(Error::Layout)?;
    let mut leaves = leaves.into_iter();
    tree.for_each_mut(&mut |leaf| *leaf = leaves.next().expect("one tensor per leaf"));
    Ok(())
}

/// Writes the leaves of `tree` to the safetensors file `path`, by dotted name.
pub fn save_tree<R: Tree<Array>>(tree: &R, path: &Path) -> Result<()> {
    Array::save_safetensors(tree_to_map(tree), None, path).map_err(|err| Error::Checkpoint {
        path: path.to_owned(),
        message: err.to_string(),
    })
}

/// Replaces every leaf of `tree` by the tensor of its name in the safetensors file `path`, with
/// the checks of [`update_tree_from_map`].
pub fn load_tree<R: Tree<Array>>(tree: &mut R, path: &Path) -> Result<()> {
    let failure = |message: String| Error::Checkpoint {
        path: path.to_owned(),
        message,
    };
    let tensors = Array::load_safetensors(path).map_err(|err| failure(err.to_string()))?;
    let leaves = checked_leaves(tree, tensors).map_err(failure)?;
    let mut leaves = leaves.into_iter();
    tree.for_each_mut(&mut |leaf| *leaf = leaves.next().expect("one tensor per leaf"));
    Ok(())
}

/// The tensors of `tensors` in the tree's traversal order, each checked against its leaf.
fn checked_leaves<R: Tree<Array>>(
    tree: &R,
    mut tensors: HashMap<String, Array>,
) -> Result<Vec<Array>, String> {
    let names = tree::names(tree);
    let mut leaves = Vec::with_capacity(names.len());
    let mut current = tree::flatten(tree).into_iter();
    for name in names {
        let leaf = current.next().expect("one leaf per name");
        let tensor = tensors
            .remove(&name)
            .ok_or_else(|| format!("tensor `{name}` is missing"))?;
        if tensor.shape() != leaf.shape() {
            return Err(format!(
                "tensor `{name}` has shape {:?}, expected {:?}",
                tensor.shape(),
                leaf.shape()
            ));
        }
        if tensor.dtype() != leaf.dtype() {
            return Err(format!(
                "tensor `{name}` has dtype {:?}, expected {:?}",
                tensor.dtype(),
                leaf.dtype()
            ));
        }
        leaves.push(tensor);
    }
    if !tensors.is_empty() {
        let mut unexpected: Vec<String> = tensors.into_keys().collect();
        unexpected.sort();
        return Err(format!("unexpected tensors: {}", unexpected.join(", ")));
    }
    Ok(leaves)
}
