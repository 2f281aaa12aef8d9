//! The token cross-entropy, fused on MLX's CUDA backend.

use crate::cuda;
use crate::error::{Error, Result};
use mlx_rs::{Array, Dtype, Stream};

/// A target id that no class has: its position counts for nothing in [`cross_entropy`]. Any
/// negative target is ignored; this is the one the data pipeline writes (PyTorch's
/// `ignore_index`), for prompt tokens under prompt masking and for padding.
pub const IGNORE_TARGET: i32 = -100;

/// Mean token cross-entropy of `logits: [..., vocab]` against integer `targets: [...]`,
/// computed in float32 whatever the logits' precision, over the targets that are not ignored
/// (negative, [`IGNORE_TARGET`]): the sum of their losses over their count, as mlx-lm's
/// `ce.sum() / ntoks`, so a model's loss counts only completion tokens under prompt masking
/// without any change to its step. Where every target is ignored the loss is 0 (and so are its
/// gradients), not the 0/0 of an empty mean.
///
/// With no target ignored the result is the plain mean to the bit: MLX's `mean` is the sum times
/// the float32 reciprocal of the count, which is what this computes, and a kept position's
/// weight is exactly 1.
///
/// On MLX's CUDA backend this is MLX's fused kernel (what `mlx.nn.losses.cross_entropy` uses
/// there): it reads the logits in their own precision and accumulates in float32, so neither a
/// float32 copy of the logits nor their softmax is ever stored, which at a 50K vocabulary is most
/// of a step's activation memory. Elsewhere it is `logsumexp(logits) - logits[target]` over
/// float32 logits.
pub fn cross_entropy(logits: &Array, targets: &Array) -> Result<Array> {
    let (losses, weights) = kept_token_losses(logits, targets)?;
    let count = mlx_rs::ops::maximum(weights.sum(false)?, Array::from_f32(1.0))?;
    Ok(losses.sum(false)?.multiply(count.reciprocal()?)?)
}

/// Each position's cross-entropy in float32, 0 where its target is ignored (negative), and the
/// float32 weights (1 kept, 0 ignored) that made it so: [`cross_entropy`]'s terms, and the
/// negated token log-probabilities that DPO and GRPO compare.
pub(crate) fn kept_token_losses(logits: &Array, targets: &Array) -> Result<(Array, Array)> {
    let weights = targets.ge(Array::from_int(0))?.as_dtype(Dtype::Float32)?;
    // An ignored position still needs a valid class to gather; its loss is multiplied by 0.
    let classes = mlx_rs::ops::maximum(targets, Array::from_int(0))?;
    let losses = per_token_cross_entropy(logits, &classes)?
        .as_dtype(Dtype::Float32)?
        .multiply(&weights)?;
    Ok((losses, weights))
}

/// Per-token losses `logsumexp(logits) - logits[target]` for non-negative `targets`: by the fused
/// kernel on CUDA, composed over float32 logits elsewhere.
fn per_token_cross_entropy(logits: &Array, targets: &Array) -> Result<Array> {
    if cuda::available() {
        fused_cross_entropy(logits, targets)
    } else {
        composed_cross_entropy(logits, targets)
    }
}

/// Per-token losses, `logsumexp(logits) - logits[target]`, in float32.
fn composed_cross_entropy(logits: &Array, targets: &Array) -> Result<Array> {
    let logits = logits.as_dtype(Dtype::Float32)?;
    let log_norm = logits.logsumexp_axis(-1, false)?;
    let picked = logits
        .take_along_axis(targets.expand_dims(-1)?, -1)?
        .squeeze_axes(&[-1])?;
    Ok(log_norm.subtract(picked)?)
}

/// Per-token losses from MLX's fused kernel (`mlx::core::fast::cross_entropy`).
fn fused_cross_entropy(logits: &Array, targets: &Array) -> Result<Array> {
    let (logits_shape, targets_shape) = (logits.shape(), targets.shape());
    if logits_shape.split_last().map(|(_, rest)| rest) != Some(targets_shape) {
        return Err(Error::Layout(format!(
            "cross_entropy: targets of shape {targets_shape:?} for logits of shape {logits_shape:?}"
        )));
    }
    let stream = Stream::thread_local_or_default();
    // SAFETY: mlx-c owns the result handle it writes into `out`; `Array::from_ptr` takes that
    // ownership exactly once. The inputs are borrowed for the duration of the call.
    let (status, out) = unsafe {
        let mut out = mlx_sys::mlx_array_new();
        let status = mlx_sys::mlx_fast_cross_entropy(
            &mut out,
            logits.as_ptr(),
            targets.as_ptr(),
            stream.as_ptr(),
        );
        (status, Array::from_ptr(out))
    };
    if status != 0 {
        return Err(Error::Layout(format!(
            "MLX's fused cross-entropy rejected logits {logits_shape:?} ({:?}) and targets \
             {targets_shape:?} ({:?})",
            logits.dtype(),
            targets.dtype()
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `log(sum(exp(row))) - row[target]` in f64.
    fn reference(rows: &[Vec<f32>], targets: &[i32]) -> f64 {
        let total: f64 = rows
            .iter()
            .zip(targets)
            .map(|(row, &target)| {
                let max = row.iter().copied().fold(f32::MIN, f32::max) as f64;
                let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
                max + sum.ln() - row[target as usize] as f64
            })
            .sum();
        total / rows.len() as f64
    }

    fn case() -> (Vec<Vec<f32>>, Vec<i32>) {
        let rows: Vec<Vec<f32>> = (0..6)
            .map(|i| {
                (0..11)
                    .map(|j| ((i * 7 + j * 3) % 13) as f32 * 0.7 - 4.0)
                    .collect()
            })
            .collect();
        (rows, vec![0, 3, 10, 5, 5, 7])
    }

    #[test]
    fn cross_entropy_matches_a_hand_computed_mean() {
        let (rows, targets) = case();
        let flat: Vec<f32> = rows.concat();
        let logits = Array::from_slice(&flat, &[2, 3, 11]);
        let targets_array = Array::from_slice(&targets, &[2, 3]);
        let loss = cross_entropy(&logits, &targets_array).unwrap();
        assert_eq!(loss.dtype(), Dtype::Float32);
        let expected = reference(&rows, &targets);
        assert!((loss.item_exact::<f32>() as f64 - expected).abs() < 1e-5);
    }

    /// Prompt masking: the loss is the mean over the kept targets only, computed here in f64
    /// from the logits of those positions alone.
    #[test]
    fn ignored_targets_count_for_nothing() {
        let (rows, targets) = case();
        let masked = vec![IGNORE_TARGET, 3, -1, 5, IGNORE_TARGET, 7];
        let kept: Vec<usize> = vec![1, 3, 5];
        let logits = Array::from_slice(&rows.concat(), &[2, 3, 11]);
        let loss = cross_entropy(&logits, &Array::from_slice(&masked, &[2, 3])).unwrap();
        let kept_rows: Vec<Vec<f32>> = kept.iter().map(|&i| rows[i].clone()).collect();
        let kept_targets: Vec<i32> = kept.iter().map(|&i| targets[i]).collect();
        let expected = reference(&kept_rows, &kept_targets);
        let got = loss.item_exact::<f32>() as f64;
        assert!((got - expected).abs() < 1e-5, "{got} vs {expected}");
        // Not the mean over all six positions.
        assert!((got - reference(&rows, &targets)).abs() > 1e-2);
    }

    #[test]
    fn ignored_positions_get_no_gradient() {
        let (rows, _) = case();
        let masked = Array::from_slice(&[IGNORE_TARGET, 3, 10, IGNORE_TARGET, 5, 7], &[6]);
        let loss =
            move |args: &[Array]| -> std::result::Result<Vec<Array>, mlx_rs::error::Exception> {
                Ok(vec![
                    cross_entropy(&args[0], &masked).map_err(Error::into_exception)?
                ])
            };
        let logits = Array::from_slice(&rows.concat(), &[6, 11]);
        let (_, grads) = mlx_rs::transforms::value_and_grad(loss)(&[logits]).unwrap();
        let grad: &[f32] = grads[0].as_slice();
        for row in [0, 3] {
            assert!(
                grad[row * 11..row * 11 + 11].iter().all(|&g| g == 0.0),
                "row {row}"
            );
        }
        let kept_row: f32 = grad[11..22].iter().map(|g| g.abs()).sum();
        assert!(kept_row > 0.0);
    }

    #[test]
    fn with_every_target_ignored_the_loss_is_zero_not_nan() {
        let (rows, _) = case();
        let logits = Array::from_slice(&rows.concat(), &[6, 11]);
        let targets = Array::from_slice(&[IGNORE_TARGET; 6], &[6]);
        assert_eq!(
            cross_entropy(&logits, &targets)
                .unwrap()
                .item_exact::<f32>(),
            0.0
        );
    }

    /// Nothing ignored: the same bits as the plain mean of the per-token losses, so every run
    /// without masks computes what it computed before masks existed.
    #[test]
    fn with_nothing_ignored_the_loss_is_the_plain_mean_to_the_bit() {
        for (batch, len, vocab) in [
            (2usize, 3usize, 11usize),
            (4, 37, 50),
            (3, 128, 257),
            (16, 33, 7),
        ] {
            let n = batch * len;
            let values: Vec<f32> = (0..n * vocab)
                .map(|i| ((i * 7919 % 1013) as f32 * 0.013).sin() * 3.0)
                .collect();
            let targets: Vec<i32> = (0..n).map(|i| ((i * 31) % vocab) as i32).collect();
            let logits = Array::from_slice(&values, &[batch as i32, len as i32, vocab as i32]);
            let targets = Array::from_slice(&targets, &[batch as i32, len as i32]);
            let plain = per_token_cross_entropy(&logits, &targets)
                .unwrap()
                .as_dtype(Dtype::Float32)
                .unwrap()
                .mean(false)
                .unwrap()
                .item_exact::<f32>();
            let masked = cross_entropy(&logits, &targets)
                .unwrap()
                .item_exact::<f32>();
            assert_eq!(plain.to_bits(), masked.to_bits(), "{batch}x{len}x{vocab}");
        }
    }

    #[test]
    fn the_fused_kernel_agrees_with_the_composed_losses() {
        let (rows, targets) = case();
        let logits = Array::from_slice(&rows.concat(), &[6, 11]);
        let targets = Array::from_slice(&targets, &[6]);
        let fused = fused_cross_entropy(&logits, &targets).unwrap();
        let composed = composed_cross_entropy(&logits, &targets).unwrap();
        let difference = fused
            .subtract(&composed)
            .unwrap()
            .abs()
            .unwrap()
            .max(false)
            .unwrap();
        assert!(difference.item_exact::<f32>() < 1e-5);
    }

    #[test]
    fn the_fused_kernel_has_the_gradient_softmax_minus_one_hot() {
        let (rows, targets) = case();
        let logits = Array::from_slice(&rows.concat(), &[6, 11]);
        let targets_array = Array::from_slice(&targets, &[6]);
        let loss =
            move |args: &[Array]| -> std::result::Result<Vec<Array>, mlx_rs::error::Exception> {
                let per_token =
                    fused_cross_entropy(&args[0], &targets_array).map_err(Error::into_exception)?;
                Ok(vec![per_token.mean(false)?])
            };
        let (_, grads) = mlx_rs::transforms::value_and_grad(loss)(&[logits]).unwrap();
        let grad: Vec<f32> = grads[0].as_slice().to_vec();
        for (i, (row, &target)) in rows.iter().zip(&targets).enumerate() {
            let max = row.iter().copied().fold(f32::MIN, f32::max) as f64;
            let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
            for (j, &x) in row.iter().enumerate() {
                let softmax = (x as f64 - max).exp() / sum;
                let one_hot = if j == target as usize { 1.0 } else { 0.0 };
                let expected = (softmax - one_hot) / rows.len() as f64;
                assert!(
                    (grad[i * 11 + j] as f64 - expected).abs() < 1e-6,
                    "[{i}, {j}]"
                );
            }
        }
    }

    #[test]
    fn the_fused_kernel_names_mismatched_shapes() {
        let logits = Array::zeros::<f32>(&[2, 3, 5]).unwrap();
        let targets = Array::zeros::<i32>(&[2, 4]).unwrap();
        let err = fused_cross_entropy(&logits, &targets).unwrap_err();
        assert!(err.to_string().contains("[2, 4]"), "{err}");
    }
}
