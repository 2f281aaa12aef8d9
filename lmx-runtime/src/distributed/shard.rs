//! One rank's part of a flat buffer, for an optimizer state sharded over the ranks (ZeRO-1).

use super::Group;
use crate::error::Result;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, Array};

/// Cuts flat buffers into one equal part per rank (the last padded with zeros), and puts them
/// back together.
#[derive(Clone, Debug)]
pub struct Shard {
    group: Group,
}

impl Shard {
    /// Parts for the ranks of `group`.
    pub fn new(group: Group) -> Shard {
        Shard { group }
    }

    /// The ranks.
    pub fn group(&self) -> &Group {
        &self.group
    }

    /// The length of each rank's part of a buffer of `length` values.
    pub fn part(&self, length: i32) -> i32 {
        let ranks = self.group.size() as i32;
        (length + ranks - 1) / ranks
    }

    /// This rank's part of `full` (a buffer of `length` values).
    pub fn slice(&self, full: &Array, length: i32) -> Result<Array> {
        let part = self.part(length);
        let start = part * self.group.rank() as i32;
        Ok(self.padded(full, length)?.index(start..start + part))
    }

    /// The whole buffer of `length` values whose parts the ranks hold (`slice` on each).
    pub fn gather(&self, slice: &Array, length: i32) -> Result<Array> {
        let all = self.group.all_gather(slice)?;
        Ok(if all.size() as i32 == length {
            all
        } else {
            all.index(..length)
        })
    }

    /// This rank's part of the sum over the ranks of `full`: a reduce-scatter where the backend
    /// has one (NCCL), else the sum's slice (MLX's ring backend has no `sum_scatter`).
    pub fn sum_scatter(&self, full: &Array, length: i32) -> Result<Array> {
        let padded = self.padded(full, length)?;
        if crate::cuda::available() {
            self.group.sum_scatter(&padded)
        } else {
            let part = self.part(length);
            let start = part * self.group.rank() as i32;
            Ok(self.group.all_sum(&padded)?.index(start..start + part))
        }
    }

    /// `full` with zeros after it up to a whole number of parts.
    fn padded(&self, full: &Array, length: i32) -> Result<Array> {
        let padding = self.part(length) * self.group.size() as i32 - length;
        if padding == 0 {
            return Ok(full.clone());
        }
        let zeros = ops::zeros_dtype(&[padding], full.dtype())?;
        Ok(ops::concatenate(&[full.clone(), zeros], 0)?)
    }
}
