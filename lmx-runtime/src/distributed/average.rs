//! The gradients and loss of the whole global batch from each rank's part of it.

use super::Group;
use crate::error::Result;
use mlx_rs::{Array, Dtype};

/// The mean gradients and values (the loss, then any metrics the loss reports) over every
/// rank's batch, on every rank, from this rank's `grads` and `values` (means over its own
/// batch): each rank's share is its count of kept targets over the count of all ranks
/// (`targets`, the batch input of target ids, when the step has one), or one over the ranks.
/// The update is then the one a single process makes on the whole batch, however unevenly
/// prompt masking and padding spread the kept targets.
pub(crate) fn average(
    group: &Group,
    grads: Vec<Array>,
    values: Vec<Array>,
    targets: Option<&Array>,
) -> Result<(Vec<Array>, Vec<Array>)> {
    let share = share(group, targets)?;
    let summed = |array: &Array| group.all_sum(&weigh(array, &share)?);
    let grads = grads.iter().map(summed).collect::<Result<Vec<_>>>()?;
    let values = values.iter().map(summed).collect::<Result<Vec<_>>>()?;
    Ok((grads, values))
}

/// `array` times this rank's `share` (a float32 scalar), in `array`'s dtype: what the rank adds
/// to the sum over the ranks.
pub(crate) fn weigh(array: &Array, share: &Array) -> Result<Array> {
    Ok(array.multiply(share.as_dtype(array.dtype())?)?)
}

/// This rank's share of the global batch's mean (float32): its kept targets over all ranks'
/// (of `targets`, the batch input of target ids), or one over the ranks.
pub(crate) fn share(group: &Group, targets: Option<&Array>) -> Result<Array> {
    Ok(match targets {
        Some(targets) => {
            let kept = targets
                .ge(Array::from_int(0))?
                .as_dtype(Dtype::Float32)?
                .sum(false)?;
            let total = mlx_rs::ops::maximum(group.all_sum(&kept)?, Array::from_f32(1.0))?;
            kept.divide(&total)?
        }
        None => Array::from_f32(1.0 / group.size() as f32),
    })
}
