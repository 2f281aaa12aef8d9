//! When a product is rewritten for the GPU's fast kernels: the rule that padding odd output
//! counts (`padded_product`) and dequantizing packed weights (`quantized_product`) share.
//!
//! Both rewrites copy the weight once, which pays where the product is compute-bound: many
//! input rows (training and prefill). Decoding a few rows reads the weight once in a
//! matrix-vector product, where a copy is pure cost; so is it on the CPU (and Metal), whose
//! kernels have neither cliff.

use crate::device::{default_kind, DeviceKind};
use crate::error::Result;
use mlx_rs::Array;

/// The fewest input rows for which a rewrite pays for its copy of the weight.
pub(super) const MIN_ROWS: i32 = 256;

/// Whether `x @ W.T` runs on a GPU over at least [`MIN_ROWS`] rows of `x` (all its axes but the
/// last).
pub(super) fn many_rows_on_gpu(x: &Array) -> Result<bool> {
    Ok(rows(x) >= MIN_ROWS && default_kind()? == DeviceKind::Gpu)
}

/// Whether `x @ W.T` runs on a GPU over a single row of `x` (decoding one token).
pub(super) fn one_row_on_gpu(x: &Array) -> Result<bool> {
    Ok(rows(x) == 1 && default_kind()? == DeviceKind::Gpu)
}

/// The rows of `x` as a product's left operand: the product of all its axes but the last.
fn rows(x: &Array) -> i32 {
    let shape = x.shape();
    shape[..shape.len().saturating_sub(1)].iter().product()
}
