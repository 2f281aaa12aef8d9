//! One batch of inputs and targets, on the host, and its MLX arrays.

use mlx_rs::Array;

/// `batch_size` windows: inputs and targets in row-major `[batch_size, seq_len]` order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// Input ids, `batch_size * seq_len` of them.
    pub inputs: Vec<i32>,
    /// Target ids (the inputs shifted left by one), `batch_size * seq_len` of them.
    pub targets: Vec<i32>,
    /// Rows.
    pub batch_size: usize,
    /// Columns.
    pub seq_len: usize,
}

impl Batch {
    /// `[batch_size, seq_len]`.
    pub fn shape(&self) -> [usize; 2] {
        [self.batch_size, self.seq_len]
    }

    /// How many targets the loss counts: those that are not negative
    /// ([`IGNORE_TARGET`](crate::nn::IGNORE_TARGET)).
    pub fn kept_targets(&self) -> usize {
        self.targets.iter().filter(|&&target| target >= 0).count()
    }

    /// The inputs and targets as `int32` arrays of shape `[batch_size, seq_len]`.
    pub fn to_arrays(&self) -> (Array, Array) {
        let shape = [self.batch_size as i32, self.seq_len as i32];
        (
            Array::from_slice(&self.inputs, &shape),
            Array::from_slice(&self.targets, &shape),
        )
    }
}
