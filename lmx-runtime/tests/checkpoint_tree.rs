//! `save_tree`/`load_tree`: an exact round trip of an initialised model, and errors that name the
//! file and the first tensor that is missing, mismatched, extra, or a file that is corrupt.

use lmx_runtime::checkpoint::{load_tree, load_tree_over, save_tree};
use lmx_runtime::nn::{self, init::Keys, LinearParams};
use lmx_runtime::tree;
use lmx_runtime::{Error, Result};
use safetensors::SafeTensors;
use std::path::{Path, PathBuf};

fn mlp(widths: &[i32], bias: bool, seed: u64) -> Result<Vec<LinearParams>> {
    let mut keys = Keys::from_seed(seed)?;
    widths
        .windows(2)
        .map(|pair| nn::init::linear(pair[0], pair[1], bias, &mut keys))
        .collect()
}

fn bits(tree: &Vec<LinearParams>) -> Vec<Vec<u32>> {
    tree::flatten(tree)
        .iter()
        .map(|leaf| leaf.as_slice::<f32>().iter().map(|v| v.to_bits()).collect())
        .collect()
}

/// The checkpoint error's path and message.
fn checkpoint_error<T>(result: Result<T>) -> (PathBuf, String) {
    match result {
        Err(Error::Checkpoint { path, message }) => (path, message),
        Err(other) => panic!("expected a checkpoint error, got {other}"),
        Ok(_) => panic!("expected a checkpoint error, got success"),
    }
}

fn saved(dir: &Path, tree: &Vec<LinearParams>) -> Result<PathBuf> {
    let path = dir.join("weights.safetensors");
    save_tree(&path, tree)?;
    Ok(path)
}

#[test]
fn an_initialised_model_round_trips_exactly() -> Result<()> {
    let dir = tempfile::tempdir().unwrap();
    let model = mlp(&[8, 16, 4], true, 1)?;
    let path = saved(dir.path(), &model)?;
    let bytes = std::fs::read(&path).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let mut names = file.names();
    names.sort_unstable();
    assert_eq!(names, ["0.bias", "0.weight", "1.bias", "1.weight"]);
    assert_eq!(
        file.tensor("0.weight").unwrap().shape(),
        [16, 8],
        "nn::init::linear is [out, in]"
    );

    let template = mlp(&[8, 16, 4], true, 2)?;
    assert_ne!(
        bits(&template),
        bits(&model),
        "the template holds other values"
    );
    let loaded = load_tree(&path, &template)?;
    assert_eq!(bits(&loaded), bits(&model));
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        leftovers,
        ["weights.safetensors"],
        "no temporary file remains"
    );
    Ok(())
}

#[test]
fn the_wrong_model_names_the_first_mismatching_tensor_and_both_shapes() -> Result<()> {
    let dir = tempfile::tempdir().unwrap();
    let path = saved(dir.path(), &mlp(&[64, 192, 4], true, 1)?)?;
    let (at, message) = checkpoint_error(load_tree(&path, &mlp(&[32, 96, 4], true, 1)?));
    assert_eq!(at, path);
    assert_eq!(
        message,
        "0.weight: checkpoint has [192, 64], model expects [96, 32]"
    );
    assert_eq!(
        format!("{}", Error::Checkpoint { path: at, message }),
        format!(
            "{}: 0.weight: checkpoint has [192, 64], model expects [96, 32]",
            path.display()
        )
    );
    let (_, message) = checkpoint_error(load_tree(&path, &mlp(&[64, 192, 8], true, 1)?));
    assert_eq!(
        message,
        "1.weight: checkpoint has [4, 192], model expects [8, 192]"
    );
    Ok(())
}

#[test]
fn a_missing_tensor_is_named() -> Result<()> {
    let dir = tempfile::tempdir().unwrap();
    let path = saved(dir.path(), &mlp(&[4, 4, 4], false, 1)?)?;
    let (at, message) = checkpoint_error(load_tree(&path, &mlp(&[4, 4, 4], true, 1)?));
    assert_eq!(at, path);
    assert_eq!(message, "missing tensor `0.bias`");
    let (_, message) = checkpoint_error(load_tree(&path, &mlp(&[4, 4, 4, 4], false, 1)?));
    assert_eq!(message, "missing tensor `2.weight`");
    Ok(())
}

#[test]
fn an_extra_tensor_is_named() -> Result<()> {
    let dir = tempfile::tempdir().unwrap();
    let path = saved(dir.path(), &mlp(&[4, 4, 4], true, 1)?)?;
    let (_, message) = checkpoint_error(load_tree(&path, &mlp(&[4, 4, 4], false, 1)?));
    assert_eq!(
        message,
        "unexpected tensor `0.bias` (2 tensors the model does not have)"
    );
    Ok(())
}

#[test]
fn a_corrupt_or_missing_file_is_named() -> Result<()> {
    let dir = tempfile::tempdir().unwrap();
    let model = mlp(&[4, 4], true, 1)?;
    let path = saved(dir.path(), &model)?;
    let bytes = std::fs::read(&path).unwrap();

    std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
    let (at, message) = checkpoint_error(load_tree(&path, &model));
    assert_eq!(at, path);
    assert!(
        message.starts_with("not a valid safetensors file"),
        "{message}"
    );

    std::fs::write(&path, b"this is not a tensor file").unwrap();
    let (at, message) = checkpoint_error(load_tree(&path, &model));
    assert_eq!(at, path);
    assert!(
        message.starts_with("not a valid safetensors file"),
        "{message}"
    );

    let missing = dir.path().join("absent.safetensors");
    match load_tree(&missing, &model) {
        Err(Error::Io { path, .. }) => assert_eq!(path, missing),
        other => panic!("expected an I/O error, got {:?}", other.map(|_| ())),
    }
    Ok(())
}

/// A file of the named leaves of `tree` that `keep` picks.
fn save_some(path: &Path, tree: &Vec<LinearParams>, keep: &dyn Fn(&str) -> bool) {
    let leaves: Vec<(String, Vec<u8>, Vec<usize>)> = tree::names(tree)
        .into_iter()
        .zip(tree::flatten(tree))
        .filter(|(name, _)| keep(name))
        .map(|(name, leaf)| {
            let bytes = leaf
                .as_slice::<f32>()
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            let shape = leaf.shape().iter().map(|&d| d as usize).collect();
            (name, bytes, shape)
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = leaves
        .iter()
        .map(|(name, bytes, shape)| {
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                    .unwrap();
            (name.clone(), view)
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// An MLP whose second layer carries a rank-2 adapter: its other leaves are frozen.
fn adapted(seed: u64) -> Vec<LinearParams> {
    let mut tree = mlp(&[3, 4, 2], true, seed).unwrap();
    let key = mlx_rs::random::key(seed).unwrap();
    let normal = |shape: &[i32]| mlx_rs::random::normal::<f32>(shape, None, None, &key).unwrap();
    tree[1].lora_a = Some(normal(&[4, 2]));
    tree[1].lora_b = Some(normal(&[2, 2]));
    tree[1].lora = Some(nn::LoraSettings {
        scale: 1.0,
        dropout: 0.0,
    });
    tree
}

/// A checkpoint of adapters alone (a LoRA run's over a Hugging Face folder) loads over a base,
/// which keeps its frozen leaves; one that holds some frozen leaves but not all is refused,
/// naming the first missing.
#[test]
fn a_file_without_the_frozen_leaves_loads_over_a_base() {
    let dir = tempfile::tempdir().unwrap();
    let (base, trained) = (adapted(1), adapted(2));
    let adapters_only = dir.path().join("adapters.safetensors");
    let is_adapter = |name: &str| name.ends_with("lora_a") || name.ends_with("lora_b");
    save_some(&adapters_only, &trained, &is_adapter);
    let loaded = load_tree_over(&adapters_only, &base).unwrap();
    let specs = tree::specs(&base);
    for ((spec, got), (from_base, from_file)) in specs
        .iter()
        .zip(bits(&loaded))
        .zip(bits(&base).into_iter().zip(bits(&trained)))
    {
        let want = if spec.trainable { from_file } else { from_base };
        assert_eq!(got, want, "{}", spec.name);
    }
    // Strict loading still wants every leaf.
    let (_, message) = checkpoint_error(load_tree(&adapters_only, &base));
    assert_eq!(message, "missing tensor `0.weight`");

    let partial = dir.path().join("partial.safetensors");
    save_some(&partial, &trained, &|name| {
        is_adapter(name) || name == "0.weight"
    });
    let (path, message) = checkpoint_error(load_tree_over(&partial, &base));
    assert_eq!(
        (path, message.as_str()),
        (partial, "missing tensor `0.bias`")
    );
}
