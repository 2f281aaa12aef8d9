//! Where the tokens of a corpus live: in memory or in a mapped token file.

use std::ops::Range;

use super::error::{DataError, TokenOrigin};

/// A random-access sequence of token ids that windows are cut from.
///
/// Implemented by `Vec<u32>` (a corpus in memory) and by
/// [`TokenFile`](super::token_file::TokenFile) (a corpus larger than memory).
pub trait TokenSource: Send + Sync {
    /// How many tokens there are.
    fn len(&self) -> usize;

    /// Whether there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies the tokens `start..start + out.len()` into `out` as MLX's `int32` ids.
    ///
    /// Fails with [`DataError::TokenTooLarge`] on an id above `i32::MAX`.
    ///
    /// # Panics
    /// If the range reaches past [`len`](Self::len).
    fn read_i32(&self, start: usize, out: &mut [i32]) -> Result<(), DataError>;

    /// The first token of `range` whose id is `vocab_size` or more, with its position.
    ///
    /// # Panics
    /// If the range reaches past [`len`](Self::len).
    fn find_outside(&self, range: Range<usize>, vocab_size: usize) -> Option<(usize, u32)>;

    /// Where the tokens are, for errors.
    fn origin(&self) -> TokenOrigin {
        TokenOrigin::Memory
    }

    /// Fails with [`DataError::OutOfVocab`], naming the first such token, if a token of `range`
    /// is not below `vocab_size`: an embedding of `vocab_size` rows would be read out of bounds.
    fn check_vocab(&self, range: Range<usize>, vocab_size: usize) -> Result<(), DataError> {
        match self.find_outside(range, vocab_size) {
            None => Ok(()),
            Some((position, id)) => Err(DataError::OutOfVocab {
                origin: self.origin(),
                position: position as u64,
                id,
                vocab_size,
            }),
        }
    }
}

impl TokenSource for Vec<u32> {
    fn len(&self) -> usize {
        self.as_slice().len()
    }

    fn read_i32(&self, start: usize, out: &mut [i32]) -> Result<(), DataError> {
        let tokens = &self[start..start + out.len()];
        for (offset, (slot, &id)) in out.iter_mut().zip(tokens).enumerate() {
            *slot = to_i32(id, start + offset)?;
        }
        Ok(())
    }

    fn find_outside(&self, range: Range<usize>, vocab_size: usize) -> Option<(usize, u32)> {
        let start = range.start;
        self[range]
            .iter()
            .position(|&id| id as usize >= vocab_size)
            .map(|offset| (start + offset, self[start + offset]))
    }
}

/// `id` as an MLX `int32` id, or the error naming its position.
pub(crate) fn to_i32(id: u32, position: usize) -> Result<i32, DataError> {
    i32::try_from(id).map_err(|_| DataError::TokenTooLarge {
        id,
        position: position as u64,
        target: "int32",
    })
}
