//! The gradients and loss of the whole global batch from each rank's part of it.
//!
//! Each rank weighs what it adds to the sums by a [`Weight`] it knows without communicating (its
//! kept targets over the target slots of every rank's batch), and sums its weight with its
//! weighed loss and metrics in one collective ([`Weight::sum_values`]). The sum of the weights is
//! the kept fraction of the global batch, by which the summed gradients are then divided
//! ([`Mean`]): one collective for the loss's side of a step, none before the gradients' sum.

use super::Group;
use crate::error::Result;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, Array, Dtype};

/// This rank's weight in the mean over the global batch.
pub(crate) struct Weight {
    /// Float32 scalar: this rank's kept targets over the target slots of all ranks' batches, or
    /// one over the ranks.
    local: Array,
    /// Whether the weights count kept targets, so that their sum is only known once summed;
    /// without targets they sum to one.
    counted: bool,
}

/// What turns sums over the ranks of weighed gradients into the global batch's mean: their
/// factor, `None` where it is one.
pub(crate) type Mean = Option<Array>;

impl Weight {
    /// The weight of this rank of `group`, from `targets` (the batch input of target ids, of one
    /// shape on every rank; negative ids are masked out), or one over the ranks without them.
    pub(crate) fn of(group: &Group, targets: Option<&Array>) -> Result<Self> {
        Ok(match targets {
            Some(targets) => {
                let slots = (targets.size() * group.size()) as f32;
                let kept = targets
                    .ge(Array::from_int(0))?
                    .as_dtype(Dtype::Float32)?
                    .sum(false)?;
                Self {
                    local: kept.divide(Array::from_f32(slots))?,
                    counted: true,
                }
            }
            None => Self {
                local: Array::from_f32(1.0 / group.size() as f32),
                counted: false,
            },
        })
    }

    /// The weight, a float32 scalar.
    pub(crate) fn local(&self) -> &Array {
        &self.local
    }

    /// One float32 vector of this rank's weight, then its weighed `values` (the loss and any
    /// metrics, means over this rank's batch, each flattened): what [`Weight::sum_values`] sums,
    /// and what a caller that sums it elsewhere hands to [`mean_values`].
    pub(crate) fn pack_values(&self, values: &[Array]) -> Result<Array> {
        let mut parts = vec![self.local.reshape(&[1])?];
        for value in values {
            let value = value.as_dtype(Dtype::Float32)?.reshape(&[-1])?;
            parts.push(value.multiply(&self.local)?);
        }
        Ok(ops::concatenate(&parts, 0)?)
    }

    /// [`Weight::pack_values`] summed over the ranks of `group` in one collective, then
    /// [`mean_values`].
    pub(crate) fn sum_values(&self, group: &Group, values: &[Array]) -> Result<(Vec<Array>, Mean)> {
        let summed = group.all_sum(&self.pack_values(values)?)?;
        mean_values(&summed, values, self.counted)
    }
}

/// `array` times `weight` (a float32 scalar), in `array`'s dtype: what a rank adds to a sum over
/// the ranks.
pub(crate) fn weigh(array: &Array, weight: &Array) -> Result<Array> {
    Ok(array.multiply(weight.as_dtype(array.dtype())?)?)
}

/// The values of the global batch (in the shapes and dtypes of `like`, this rank's) from
/// `summed`, the sum over the ranks of their [`Weight::pack_values`], and the [`Mean`] of the
/// gradients summed beside them; `counted`: whether the weights count kept targets (the
/// step has a batch input of target ids).
pub(crate) fn mean_values(
    summed: &Array,
    like: &[Array],
    counted: bool,
) -> Result<(Vec<Array>, Mean)> {
    let mean = if counted {
        // One over the summed weights, or zero where no rank kept a target (every sum is
        // then zero, and stays so in half precision, where one over the floor is not finite).
        let total = summed.index(0);
        let kept = total.gt(Array::from_f32(0.0))?.as_dtype(Dtype::Float32)?;
        Some(kept.divide(ops::maximum(&total, Array::from_f32(f32::MIN_POSITIVE))?)?)
    } else {
        None
    };
    let mut values = Vec::with_capacity(like.len());
    let mut start = 1;
    for value in like {
        let size = value.size() as i32;
        let sum = summed.index(start..start + size).reshape(value.shape())?;
        let sum = match &mean {
            Some(mean) => sum.multiply(mean)?,
            None => sum,
        };
        values.push(sum.as_dtype(value.dtype())?);
        start += size;
    }
    Ok((values, mean))
}

/// `grads` times `mean`, where there is one.
fn to_mean(grads: Vec<Array>, mean: &Mean) -> Result<Vec<Array>> {
    match mean {
        Some(mean) => crate::clip::scale(&grads, mean),
        None => Ok(grads),
    }
}

/// The mean gradients and values (the loss, then any metrics the loss reports) over every
/// rank's batch, on every rank, from this rank's `grads` and `values` (means over its own
/// batch), weighed by its [`Weight`] of `targets` (the batch input of target ids, when the step
/// has one). The update is then the one a single process makes on the whole batch, however
/// unevenly prompt masking and padding spread the kept targets.
pub(crate) fn average(
    group: &Group,
    grads: Vec<Array>,
    values: Vec<Array>,
    targets: Option<&Array>,
) -> Result<(Vec<Array>, Vec<Array>)> {
    let weight = Weight::of(group, targets)?;
    let (values, mean) = weight.sum_values(group, &values)?;
    let grads = grads
        .iter()
        .map(|grad| group.all_sum(&weigh(grad, weight.local())?))
        .collect::<Result<Vec<_>>>()?;
    Ok((to_mean(grads, &mean)?, values))
}
