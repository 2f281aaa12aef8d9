//! What batches are cut from: rows of inputs and targets of one width.

use std::fmt;

use super::error::DataError;

/// A numbered set of rows, each `seq_len` input ids and `seq_len` target ids, that a
/// [`BatchIterator`](super::BatchIterator) draws batches from.
///
/// Implemented by [`Windows`](super::Windows) (a token stream cut into windows, every target
/// kept) and by [`SftRows`](super::SftRows) (supervised examples, padded or packed, whose prompt
/// and padding targets are [`IGNORE_TARGET`](crate::nn::IGNORE_TARGET)).
pub trait Rows: Send + Sync + fmt::Debug {
    /// How many rows there are.
    fn count(&self) -> usize;

    /// Tokens of inputs (and of targets) per row.
    fn seq_len(&self) -> usize;

    /// Copies row `index` into `inputs` and `targets` (`seq_len` ids each).
    ///
    /// # Panics
    /// If `index` is not below [`count`](Self::count) or a buffer is not `seq_len` long.
    fn read(&self, index: usize, inputs: &mut [i32], targets: &mut [i32]) -> Result<(), DataError>;

    /// Fails with [`DataError::OutOfVocab`] if an input or kept target id is not below
    /// `vocab_size`: a model of that vocabulary would read its embedding out of bounds.
    fn check_vocab(&self, vocab_size: usize) -> Result<(), DataError>;

    /// The rows in words, for errors: `24 windows of 5 tokens`.
    fn describe(&self) -> String;

    /// Whether training reads the rows in their own order, row 0 first, instead of shuffled:
    /// rows laid out as a run's batches (a difficulty curriculum's).
    fn in_order(&self) -> bool {
        false
    }
}
