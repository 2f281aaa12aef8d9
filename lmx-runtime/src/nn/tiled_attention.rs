//! Causal attention over a whole sequence, padded on CUDA to the length MLX's fused backward takes.
//!
//! MLX's CUDA backend computes the attention's gradient with cuDNN's fused kernel only when the
//! sequence's length is a multiple of its tile, 128 positions
//! (`ScaledDotProductAttentionVJP::use_fallback`); at any other length it falls back to the
//! attention written out (the `[B, heads, T, T]` scores materialised, masked, soft-maxed and
//! multiplied back), several times the time and memory. Fine-tuning data is rarely a multiple of
//! 128 long (examples of 512 tokens give 511 inputs). Here the queries, keys and values are padded
//! with zeros to the next multiple and the output cut back: under the causal mask no real query
//! sees a padded key (every one lies after it), so the kept outputs and every gradient are the
//! unpadded attention's, for at most `(T + 127)² / T²` of its products. On the CPU and on Metal,
//! whose backward is never fused, nothing is padded.

use super::layers::{attention, AttentionMask};
use crate::error::Result;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, Array};

/// The tile of cuDNN's fused attention backward in MLX.
const TILE: i32 = 128;

/// Causal attention of `[B, heads, T, head_dim]` queries over keys and values of the same length
/// (fewer heads allowed), padded to a multiple of [`TILE`] positions where MLX computes on CUDA
/// and the sequence is at least one tile long.
pub fn causal_attention(q: &Array, k: &Array, v: &Array) -> Result<Array> {
    let length = q.shape()[2];
    let pad = (TILE - length % TILE) % TILE;
    if pad == 0 || length < TILE || k.shape()[2] != length || !crate::cuda::available() {
        return attention(q, k, v, AttentionMask::Causal);
    }
    padded(q, k, v, pad)
}

/// Causal attention over `q`, `k` and `v` padded with `pad` zero positions, cut back.
fn padded(q: &Array, k: &Array, v: &Array, pad: i32) -> Result<Array> {
    let widths = [(0, 0), (0, 0), (0, pad), (0, 0)];
    let pad = |x: &Array| ops::pad(x, &widths, None, None);
    let out = attention(&pad(q)?, &pad(k)?, &pad(v)?, AttentionMask::Causal)?;
    Ok(out.index((.., .., ..q.shape()[2], ..)))
}

#[cfg(test)]
mod tests {
    use super::super::same_gradients::assert_same_values_and_gradients;
    use super::*;

    /// Padded by 5 positions, grouped-query attention of 6 positions gives the unpadded
    /// attention's output and gradients in `q`, `k` and `v`.
    #[test]
    fn padding_changes_neither_the_attention_nor_its_gradients() {
        assert_same_values_and_gradients(
            &[&[2, 4, 6, 8], &[2, 2, 6, 8], &[2, 2, 6, 8]],
            |args| attention(&args[0], &args[1], &args[2], AttentionMask::Causal),
            |args| padded(&args[0], &args[1], &args[2], 5),
            1e-5,
        );
    }
}
