//! One safetensors file of named arrays: encoded from arrays, decoded against the names, shapes
//! and dtypes the caller expects.

use super::tensor::{dtype_name, file_shape, stored_dtype, to_array, TensorBytes};
use crate::error::{Error, Result};
use crate::nn;
use mlx_rs::transforms::eval;
use mlx_rs::Array;
use safetensors::SafeTensors;
use std::collections::HashSet;
use std::path::Path;

/// Named arrays, in the order a tree or state declares them.
pub(crate) type Named = Vec<(String, Array)>;

fn error(path: &Path, message: impl Into<String>) -> Error {
    Error::Checkpoint {
        path: path.to_owned(),
        message: message.into(),
    }
}

/// The bytes of a safetensors file holding `tensors`; `path` (where it will be written) names the
/// file in errors.
pub(crate) fn encode(path: &Path, tensors: &Named) -> Result<Vec<u8>> {
    eval(tensors.iter().map(|(_, array)| array))?;
    let bytes = tensors
        .iter()
        .map(|(name, array)| {
            TensorBytes::from_array(array)
                .map(|bytes| (name.as_str(), bytes))
                .map_err(|message| error(path, format!("{name}: {message}")))
        })
        .collect::<Result<Vec<_>>>()?;
    safetensors::serialize(bytes.iter().map(|(name, bytes)| (*name, bytes)), None)
        .map_err(|err| error(path, format!("cannot encode tensors: {err}")))
}

/// Reads the file at `path`, which must hold exactly the tensors of `expected`, with their dtypes
/// and shapes; returns them as arrays in the order of `expected`.
///
/// Errors name the file and the first tensor (in `expected`'s order) that is missing or
/// mismatched, then any tensor the file holds beyond `expected`.
pub(crate) fn read_expected(path: &Path, expected: &Named) -> Result<Vec<Array>> {
    let arrays = read_named(path, expected, &|_| false)?;
    Ok(arrays
        .into_iter()
        .map(|array| array.expect("no tensor may be left out"))
        .collect())
}

/// [`read_expected`] where the file may leave out the tensors `omittable` picks (by index in
/// `expected`), all of them together: a checkpoint of adapters without its frozen base. Those
/// come back `None`; a file holding some of them but not all names the first one missing.
pub(crate) fn read_named(
    path: &Path,
    expected: &Named,
    omittable: &dyn Fn(usize) -> bool,
) -> Result<Vec<Option<Array>>> {
    read_named_skipping(path, expected, omittable, &|_| false)
}

/// [`read_named`] of a file that may also hold tensors the model does not have where `skipped`
/// accepts their names (they are not read).
pub(crate) fn read_named_skipping(
    path: &Path,
    expected: &Named,
    omittable: &dyn Fn(usize) -> bool,
    skipped: &dyn Fn(&str) -> bool,
) -> Result<Vec<Option<Array>>> {
    let bytes = std::fs::read(path).map_err(|cause| Error::Io {
        path: path.to_owned(),
        cause,
    })?;
    let file = SafeTensors::deserialize(&bytes)
        .map_err(|err| error(path, format!("not a valid safetensors file: {err}")))?;
    let omitted = expected
        .iter()
        .enumerate()
        .filter(|(index, _)| omittable(*index))
        .all(|(_, (name, _))| file.tensor(name).is_err());
    let mut arrays = Vec::with_capacity(expected.len());
    for (index, (name, like)) in expected.iter().enumerate() {
        if omitted && omittable(index) {
            arrays.push(None);
            continue;
        }
        let tensor = file
            .tensor(name)
            .map_err(|_| error(path, format!("missing tensor `{name}`")))?;
        let (shape, want_shape) = (tensor.shape(), file_shape(like));
        if shape != want_shape.as_slice() {
            return Err(error(
                path,
                format!("{name}: checkpoint has {shape:?}, model expects {want_shape:?}"),
            ));
        }
        let want_dtype =
            stored_dtype(like).map_err(|message| error(path, format!("{name}: {message}")))?;
        if tensor.dtype() != want_dtype {
            return Err(error(
                path,
                format!(
                    "{name}: checkpoint has {}, model expects {}",
                    dtype_name(tensor.dtype()),
                    dtype_name(want_dtype)
                ),
            ));
        }
        let array = to_array(tensor.dtype(), shape, tensor.data())
            .map_err(|message| error(path, format!("{name}: {message}")))?;
        let array = nn::device_resident(&array)?;
        // Evaluated now, so that a device copy's host-made source is freed before the next
        // tensor is read.
        eval([&array])?;
        arrays.push(Some(array));
    }
    nn::release_host_buffers()?;
    let known: HashSet<&str> = expected.iter().map(|(name, _)| name.as_str()).collect();
    let mut extra: Vec<&str> = file
        .names()
        .into_iter()
        .filter(|name| !known.contains(name) && !skipped(name))
        .collect();
    extra.sort_unstable();
    if let Some(name) = extra.first() {
        return Err(error(
            path,
            format!(
                "unexpected tensor `{name}` ({} tensors the model does not have)",
                extra.len()
            ),
        ));
    }
    Ok(arrays)
}
