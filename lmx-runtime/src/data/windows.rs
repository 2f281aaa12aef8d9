//! Packed windows of `seq_len + 1` tokens, and the train/validation split.

use std::fmt;
use std::sync::Arc;

use super::error::DataError;
use super::rows::Rows;
use super::source::TokenSource;

/// The windows of a contiguous range of tokens: window `i` is the `seq_len + 1` tokens starting at
/// `i * seq_len`, its first `seq_len` the inputs and its last `seq_len` the targets.
///
/// Consecutive windows share one token, so every token but the first is a target exactly once;
/// the tail too short for a whole window is left out.
#[derive(Clone)]
pub struct Windows {
    source: Arc<dyn TokenSource>,
    start: usize,
    len: usize,
    seq_len: usize,
}

/// The two parts of a split corpus.
#[derive(Debug, Clone)]
pub struct Split {
    /// The windows of the leading tokens.
    pub train: Windows,
    /// The windows of the trailing tokens; `None` for a validation fraction of 0.
    pub validation: Option<Windows>,
}

impl Windows {
    /// The windows of all of `source`.
    pub fn new(source: Arc<dyn TokenSource>, seq_len: usize) -> Result<Self, DataError> {
        let len = source.len();
        Self::over(source, 0, len, seq_len, "corpus")
    }

    fn over(
        source: Arc<dyn TokenSource>,
        start: usize,
        len: usize,
        seq_len: usize,
        part: &'static str,
    ) -> Result<Self, DataError> {
        if seq_len == 0 {
            return Err(DataError::InvalidSetting(
                "seq_len must be at least 1".into(),
            ));
        }
        if len < seq_len + 1 {
            return Err(DataError::TooFewTokens {
                part,
                tokens: len,
                needed: seq_len + 1,
            });
        }
        Ok(Self {
            source,
            start,
            len,
            seq_len,
        })
    }

    /// Tokens of inputs (and of targets) per window.
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// How many tokens the windows are cut from.
    pub fn tokens(&self) -> usize {
        self.len
    }

    /// How many windows there are: `(tokens - 1) / seq_len`.
    pub fn count(&self) -> usize {
        (self.len - 1) / self.seq_len
    }

    /// Fails with [`DataError::OutOfVocab`] if a token of these windows is not below
    /// `vocab_size`, naming the first such token: a model of that vocabulary would read its
    /// embedding out of bounds.
    pub fn check_vocab(&self, vocab_size: usize) -> Result<(), DataError> {
        self.source
            .check_vocab(self.start..self.start + self.len, vocab_size)
    }

    /// Copies window `index` into `inputs` and `targets` (`seq_len` ids each).
    ///
    /// # Panics
    /// If `index` is not below [`count`](Self::count) or a buffer is not `seq_len` long.
    pub fn read(
        &self,
        index: usize,
        inputs: &mut [i32],
        targets: &mut [i32],
    ) -> Result<(), DataError> {
        assert!(index < self.count(), "window {index} of {}", self.count());
        assert_eq!(inputs.len(), self.seq_len, "inputs buffer length");
        assert_eq!(targets.len(), self.seq_len, "targets buffer length");
        let first = self.start + index * self.seq_len;
        self.source.read_i32(first, inputs)?;
        targets[..self.seq_len - 1].copy_from_slice(&inputs[1..]);
        self.source
            .read_i32(first + self.seq_len, &mut targets[self.seq_len - 1..])
    }

    /// Splits the tokens in two: the last `validation_fraction` of them (rounded to the nearest
    /// token) for validation, the rest for training. No window of one part reads a token of the
    /// other.
    pub fn split(&self, validation_fraction: f64) -> Result<Split, DataError> {
        if !(0.0..1.0).contains(&validation_fraction) {
            return Err(DataError::InvalidSetting(format!(
                "validation fraction {validation_fraction} is not in [0, 1)"
            )));
        }
        let validation_len = (self.len as f64 * validation_fraction).round() as usize;
        let train_len = self.len - validation_len;
        let train = Self::over(
            self.source.clone(),
            self.start,
            train_len,
            self.seq_len,
            "training split",
        )?;
        let validation = (validation_len > 0)
            .then(|| {
                Self::over(
                    self.source.clone(),
                    self.start + train_len,
                    validation_len,
                    self.seq_len,
                    "validation split",
                )
            })
            .transpose()?;
        Ok(Split { train, validation })
    }
}

impl Rows for Windows {
    fn count(&self) -> usize {
        Windows::count(self)
    }

    fn seq_len(&self) -> usize {
        Windows::seq_len(self)
    }

    fn read(&self, index: usize, inputs: &mut [i32], targets: &mut [i32]) -> Result<(), DataError> {
        Windows::read(self, index, inputs, targets)
    }

    fn check_vocab(&self, vocab_size: usize) -> Result<(), DataError> {
        Windows::check_vocab(self, vocab_size)
    }

    fn describe(&self) -> String {
        format!("{} windows of {} tokens", self.count(), self.seq_len + 1)
    }
}

impl fmt::Debug for Windows {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Windows")
            .field("start", &self.start)
            .field("tokens", &self.len)
            .field("seq_len", &self.seq_len)
            .field("count", &self.count())
            .finish()
    }
}
