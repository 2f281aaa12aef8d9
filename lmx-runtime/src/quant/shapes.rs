//! The shapes and dtypes a quantized weight's tensors have: MLX packs `32 / bits` values per
//! `uint32` along the last axis, with one scale and one offset per group of that axis.

use super::{QuantError, Quantization};
use mlx_rs::{Array, Dtype};

/// For a weight of `shape` (`[..., dim]`), the packed weight's shape and the scales' (and
/// biases') shape, or why the rows do not divide into groups.
pub fn packed_shapes(
    layer: &str,
    shape: &[i32],
    q: Quantization,
) -> Result<(Vec<i32>, Vec<i32>), QuantError> {
    let (&dim, rows) = shape.split_last().unwrap_or((&0, &[]));
    if rows.is_empty() || dim % q.group_size != 0 {
        return Err(QuantError::Indivisible {
            layer: layer.to_owned(),
            dim,
            group_size: q.group_size,
        });
    }
    let with_last = |last: i32| rows.iter().copied().chain([last]).collect::<Vec<i32>>();
    Ok((with_last(dim * q.bits / 32), with_last(dim / q.group_size)))
}

/// Checks one quantized layer's packed `weight`, `scales` and `biases` against `q`.
pub fn check_layer(
    layer: &str,
    weight: &Array,
    scales: &Array,
    biases: &Array,
    q: Quantization,
) -> Result<(), QuantError> {
    q.check()?;
    if weight.dtype() != Dtype::Uint32 {
        return Err(QuantError::TensorDtype {
            layer: layer.to_owned(),
            tensor: "weight",
            found: weight.dtype(),
            expected: "uint32 (packed values)",
        });
    }
    for (tensor, array) in [("scales", scales), ("biases", biases)] {
        if !matches!(
            array.dtype(),
            Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16
        ) {
            return Err(QuantError::TensorDtype {
                layer: layer.to_owned(),
                tensor,
                found: array.dtype(),
                expected: "floating point",
            });
        }
    }
    if biases.dtype() != scales.dtype() {
        return Err(QuantError::TensorDtype {
            layer: layer.to_owned(),
            tensor: "biases",
            found: biases.dtype(),
            expected: "the scales' dtype",
        });
    }
    // The dense shape the packed weight implies; the scales and biases must agree with it.
    let (&packed, rows) = weight.shape().split_last().unwrap_or((&0, &[]));
    let dense: Vec<i32> = rows.iter().copied().chain([packed * 32 / q.bits]).collect();
    let shape_error = |tensor, found: &[i32], expected: Vec<i32>| QuantError::Shape {
        layer: layer.to_owned(),
        tensor,
        found: found.to_vec(),
        expected,
        bits: q.bits,
        group_size: q.group_size,
    };
    let (want_weight, want_scales) = packed_shapes(layer, &dense, q)?;
    if weight.shape() != want_weight.as_slice() {
        return Err(shape_error("weight", weight.shape(), want_weight));
    }
    for (tensor, array) in [("scales", scales), ("biases", biases)] {
        if array.shape() != want_scales.as_slice() {
            return Err(shape_error(tensor, array.shape(), want_scales.clone()));
        }
    }
    Ok(())
}
