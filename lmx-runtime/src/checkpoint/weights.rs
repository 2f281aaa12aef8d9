//! Any parameter tree to and from one safetensors file, its tensors named by the tree's dotted
//! names: model weights export and import.

use super::atomic::{write_file, DurableWriter};
use super::file::{encode, read_expected, read_named, read_named_skipping, Named};
use crate::error::Result;
use crate::tree::{self, Tree};
use mlx_rs::Array;
use std::path::Path;

/// The leaves of `tree` with their dotted names, in traversal order.
pub(crate) fn named<R: Tree<Array> + ?Sized>(tree: &R) -> Named {
    tree::names(tree)
        .into_iter()
        .zip(tree::flatten(tree))
        .collect()
}

/// Writes the leaves of `tree` to the safetensors file `path` (atomically), each tensor named by
/// its dotted name.
pub fn save_tree<R: Tree<Array> + ?Sized>(path: &Path, tree: &R) -> Result<()> {
    let bytes = encode(path, &named(tree))?;
    write_file(path, &bytes, &mut DurableWriter)
}

/// A tree shaped like `template` with its leaves read from the safetensors file `path`.
///
/// The file must hold exactly the template's leaves, by name, with the template's shapes and
/// dtypes; the error names the file and the first tensor that is missing, mismatched or extra.
pub fn load_tree<R: Tree<Array>>(path: &Path, template: &R) -> Result<R> {
    let mut arrays = read_expected(path, &named(template))?.into_iter();
    Ok(template.map_same(&mut |_| arrays.next().expect("one array per leaf")))
}

/// [`load_tree`] over `base`: a file without `base`'s frozen leaves (all of them: a checkpoint
/// saved with [`FrozenLeaves::Omitted`](super::FrozenLeaves), which holds the buffers) keeps
/// `base`'s.
pub fn load_tree_over<R: Tree<Array>>(path: &Path, base: &R) -> Result<R> {
    let frozen: Vec<bool> = tree::specs(base)
        .iter()
        .map(|spec| !spec.changes_in_training())
        .collect();
    let mut arrays = read_named(path, &named(base), &|index| frozen[index])?.into_iter();
    Ok(base.map_same(&mut |leaf| {
        arrays
            .next()
            .expect("one array per leaf")
            .unwrap_or_else(|| leaf.clone())
    }))
}

/// [`load_tree_over`] of a file that may hold more than `base`'s leaves: the tensors whose names
/// `skipped` accepts are left out (the heads of a model trained with multi-token prediction, read
/// as the plain model); any other tensor the tree lacks is still an error.
pub fn load_tree_over_skipping<R: Tree<Array>>(
    path: &Path,
    base: &R,
    skipped: &dyn Fn(&str) -> bool,
) -> Result<R> {
    let frozen: Vec<bool> = tree::specs(base)
        .iter()
        .map(|spec| !spec.changes_in_training())
        .collect();
    let mut arrays =
        read_named_skipping(path, &named(base), &|index| frozen[index], skipped)?.into_iter();
    Ok(base.map_same(&mut |leaf| {
        arrays
            .next()
            .expect("one array per leaf")
            .unwrap_or_else(|| leaf.clone())
    }))
}
