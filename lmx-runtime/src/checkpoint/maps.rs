//! Parameter trees as flat maps by dotted name, as mlx-rs modules flatten their parameters: for
//! interop, never on the training path.

use crate::error::{Error, Result};
use crate::tree::{self, Tree};
use mlx_rs::Array;
use std::collections::HashMap;

/// The leaves of `tree` by dotted name.
pub fn tree_to_map<R: Tree<Array>>(tree: &R) -> HashMap<String, Array> {
    tree::names(tree)
        .into_iter()
        .zip(tree::flatten(tree))
        .collect()
}

/// Replaces every leaf of `tree` by the tensor of its name in `tensors`.
///
/// Fails, naming the tensor, when one is missing, has another shape or dtype, or when `tensors`
/// holds names the tree does not have; `tree` is unchanged then.
pub fn update_tree_from_map<R: Tree<Array>>(
    tree: &mut R,
    mut tensors: HashMap<String, Array>,
) -> Result<()> {
    let names = tree::names(tree);
    let mut leaves = Vec::with_capacity(names.len());
    for (name, leaf) in names.iter().zip(tree::flatten(tree)) {
        let tensor = tensors
            .remove(name)
            .ok_or_else(|| Error::Layout(format!("tensor `{name}` is missing")))?;
        if tensor.shape() != leaf.shape() {
            return Err(Error::Layout(format!(
                "tensor `{name}` has shape {:?}, expected {:?}",
                tensor.shape(),
                leaf.shape()
            )));
        }
        if tensor.dtype() != leaf.dtype() {
            return Err(Error::Layout(format!(
                "tensor `{name}` has dtype {:?}, expected {:?}",
                tensor.dtype(),
                leaf.dtype()
            )));
        }
        leaves.push(tensor);
    }
    if !tensors.is_empty() {
        let mut unexpected: Vec<String> = tensors.into_keys().collect();
        unexpected.sort();
        return Err(Error::Layout(format!(
            "unexpected tensors: {}",
            unexpected.join(", ")
        )));
    }
    let mut leaves = leaves.into_iter();
    tree.for_each_mut(&mut |leaf| *leaf = leaves.next().expect("one tensor per leaf"));
    Ok(())
}
