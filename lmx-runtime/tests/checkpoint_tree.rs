//! `save_tree`/`load_tree`: an exact round trip of an initialised model, and errors that name the
//! file and the first tensor that is missing, mismatched, extra, or a file that is corrupt.

use lmx_runtime::checkpoint::{load_tree, save_tree};
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
