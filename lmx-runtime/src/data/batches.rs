//! The batch iterator: epochs of seeded window orders, with a position that can be saved and
//! restored.

use std::ops::Range;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::batch::Batch;
use super::error::DataError;
use super::rng::epoch_permutation;
use super::rows::Rows;

/// In which order an epoch visits the windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Order {
    /// A new seeded permutation every epoch (training).
    Shuffled,
    /// Window 0, 1, 2, ... every epoch (evaluation).
    Sequential,
}

/// Where a [`BatchIterator`] stands: restoring it with [`BatchIterator::seek`] makes the iterator
/// yield exactly the batches it would have yielded next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BatchPosition {
    /// The epoch, from 0.
    pub epoch: u64,
    /// How many windows of the epoch's order have been handed out.
    pub index: u64,
    /// The seed of the window orders.
    pub seed: u64,
}

/// Endless batches of `batch_size` rows ([`Windows`](super::Windows), [`SftRows`](super::SftRows)),
/// epoch after epoch.
///
/// Every batch is full: the `count % batch_size` rows left at the end of an epoch's order are
/// skipped in that epoch (with [`Order::Shuffled`], different ones each epoch), so the shape never
/// changes and a compiled step is traced once.
#[derive(Debug, Clone)]
pub struct BatchIterator {
    rows: Arc<dyn Rows>,
    batch_size: usize,
    order: Order,
    position: BatchPosition,
    /// The current epoch's window order (empty for [`Order::Sequential`]).
    permutation: Vec<u32>,
}

impl BatchIterator {
    /// Batches of `batch_size` rows in `order`, starting at epoch 0 with `seed`.
    pub fn new(
        rows: impl Rows + 'static,
        batch_size: usize,
        order: Order,
        seed: u64,
    ) -> Result<Self, DataError> {
        Self::over(Arc::new(rows), batch_size, order, seed)
    }

    /// [`new`](Self::new) over shared rows.
    pub fn over(
        rows: Arc<dyn Rows>,
        batch_size: usize,
        order: Order,
        seed: u64,
    ) -> Result<Self, DataError> {
        if batch_size == 0 {
            return Err(DataError::InvalidSetting(
                "batch size must be at least 1".into(),
            ));
        }
        if rows.count() < batch_size {
            return Err(DataError::InvalidSetting(format!(
                "{} cannot fill one batch of {batch_size}",
                rows.describe()
            )));
        }
        if u32::try_from(rows.count()).is_err() {
            return Err(DataError::InvalidSetting(format!(
                "{} rows are more than the 2^32 that are shuffled",
                rows.count()
            )));
        }
        let mut iterator = Self {
            rows,
            batch_size,
            order,
            position: BatchPosition {
                epoch: 0,
                index: 0,
                seed,
            },
            permutation: Vec::new(),
        };
        iterator.reorder();
        Ok(iterator)
    }

    /// The rows batched.
    pub fn rows(&self) -> &Arc<dyn Rows> {
        &self.rows
    }

    /// Full batches per epoch: `count / batch_size`.
    pub fn batches_per_epoch(&self) -> usize {
        self.rows.count() / self.batch_size
    }

    /// Where the iterator stands now (save it with serde).
    pub fn position(&self) -> BatchPosition {
        self.position
    }

    /// Moves to a saved position, its seed included.
    pub fn seek(&mut self, position: BatchPosition) -> Result<(), DataError> {
        if position.index > self.rows.count() as u64 {
            return Err(DataError::BadPosition(format!(
                "window {} of an epoch of {} windows",
                position.index,
                self.rows.count()
            )));
        }
        let same_order =
            position.epoch == self.position.epoch && position.seed == self.position.seed;
        self.position = position;
        if !same_order {
            self.reorder();
        }
        Ok(())
    }

    /// The next batch, starting the next epoch when this one cannot fill it.
    pub fn next_batch(&mut self) -> Result<Batch, DataError> {
        self.next_rows(0..self.batch_size)
    }

    /// Rows `rows` of the next batch (a data-parallel rank's share of it), read alone; the
    /// position moves past the whole batch, as [`next_batch`](Self::next_batch)'s does.
    pub fn next_rows(&mut self, rows: Range<usize>) -> Result<Batch, DataError> {
        assert!(
            rows.end <= self.batch_size,
            "rows {rows:?} of a batch of {}",
            self.batch_size
        );
        let count = self.rows.count() as u64;
        if self.position.index + self.batch_size as u64 > count {
            self.position.epoch += 1;
            self.position.index = 0;
            self.reorder();
        }
        let seq_len = self.rows.seq_len();
        let mut inputs = vec![0; rows.len() * seq_len];
        let mut targets = vec![0; rows.len() * seq_len];
        let first = self.position.index as usize + rows.start;
        for (row, (inputs, targets)) in inputs
            .chunks_exact_mut(seq_len)
            .zip(targets.chunks_exact_mut(seq_len))
            .enumerate()
        {
            let window = match self.order {
                Order::Shuffled => self.permutation[first + row] as usize,
                Order::Sequential => first + row,
            };
            self.rows.read(window, inputs, targets)?;
        }
        self.position.index += self.batch_size as u64;
        Ok(Batch {
            inputs,
            targets,
            batch_size: rows.len(),
            seq_len,
        })
    }

    fn reorder(&mut self) {
        self.permutation = match self.order {
            Order::Shuffled => epoch_permutation(
                self.position.seed,
                self.position.epoch,
                self.rows.count() as u32,
            ),
            Order::Sequential => Vec::new(),
        };
    }
}

impl Iterator for BatchIterator {
    type Item = Result<Batch, DataError>;

    /// Never `None`: the batches go on epoch after epoch.
    fn next(&mut self) -> Option<Self::Item> {
        Some(self.next_batch())
    }
}
