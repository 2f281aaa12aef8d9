//! Tokenized examples as rows of a batch: one padded example a row, or examples packed into
//! windows; the targets the loss leaves out are `IGNORE_TARGET`.

use serde::{Deserialize, Serialize};

use crate::data::error::{DataError, TokenOrigin};
use crate::data::rows::Rows;
use crate::data::source::to_i32;
use crate::nn::IGNORE_TARGET;

use super::encode::Tokenized;

/// How examples become rows of `seq_len` tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Batching {
    /// One example a row, cut to `seq_len + 1` tokens and padded after its end; the padding's
    /// targets are ignored. Every row is `seq_len` wide, so the compiled step is traced once.
    #[default]
    Pad,
    /// The examples one after another (each ends with the end-of-sequence id), cut into windows
    /// of `seq_len + 1` tokens as a text corpus is: no padding and nothing cut off, and the
    /// prompt's targets are still ignored. An example attends to the ones before it in its
    /// window (the models' attention is causal over the window).
    Pack,
}

/// What [`SftRows::new`] did with the examples.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RowStats {
    /// Examples longer than `seq_len + 1` tokens, cut (padding only).
    pub truncated: usize,
    /// Examples left out because no target of theirs is kept within the row (a prompt of
    /// `seq_len` tokens or more).
    pub dropped: usize,
    /// Targets the loss counts, over all rows.
    pub kept_targets: usize,
}

/// Rows of supervised examples.
#[derive(Debug, Clone)]
pub struct SftRows {
    batching: Batching,
    seq_len: usize,
    /// Every row's (padding) or the stream's (packing) ids.
    ids: Vec<u32>,
    /// Whether the target at each id is kept.
    kept: Vec<bool>,
    /// Padding: where each example starts in `ids`, and the end.
    starts: Vec<usize>,
}

impl SftRows {
    /// The rows of `examples`.
    pub fn new(
        examples: &[Tokenized],
        seq_len: usize,
        batching: Batching,
    ) -> Result<(Self, RowStats), DataError> {
        if seq_len == 0 {
            return Err(DataError::InvalidSetting(
                "seq_len must be at least 1".into(),
            ));
        }
        let mut stats = RowStats::default();
        let mut rows = SftRows {
            batching,
            seq_len,
            ids: Vec::new(),
            kept: Vec::new(),
            starts: vec![0],
        };
        for example in examples {
            let len = match batching {
                Batching::Pad => example.ids.len().min(seq_len + 1),
                Batching::Pack => example.ids.len(),
            };
            stats.truncated += usize::from(len < example.ids.len());
            let kept = (0..len).map(|position| position >= example.prompt_len.max(1));
            let kept_targets = kept.clone().filter(|&kept| kept).count();
            if batching == Batching::Pad && kept_targets == 0 {
                stats.dropped += 1;
                continue;
            }
            rows.ids.extend_from_slice(&example.ids[..len]);
            rows.kept.extend(kept);
            // Packed, an example's first token is the target of the one before it.
            if batching == Batching::Pack && example.prompt_len == 0 && rows.ids.len() > len {
                let first = rows.ids.len() - len;
                rows.kept[first] = true;
            }
            rows.starts.push(rows.ids.len());
        }
        if batching == Batching::Pack && rows.ids.len() < seq_len + 1 {
            return Err(DataError::TooFewTokens {
                part: "packed examples",
                tokens: rows.ids.len(),
                needed: seq_len + 1,
            });
        }
        stats.kept_targets = (0..rows.count())
            .map(|row| rows.targets_of(row).filter(|(_, kept)| *kept).count())
            .sum();
        Ok((rows, stats))
    }

    /// How rows are made.
    pub fn batching(&self) -> Batching {
        self.batching
    }

    /// The ids of row `index` and whether each is a kept target, from its second on.
    fn targets_of(&self, index: usize) -> impl Iterator<Item = (u32, bool)> + '_ {
        let (start, end) = self.span(index);
        (start + 1..end).map(|at| (self.ids[at], self.kept[at]))
    }

    /// The ids of row `index`: an example (padding) or a window (packing), `seq_len + 1` at most.
    fn span(&self, index: usize) -> (usize, usize) {
        match self.batching {
            Batching::Pad => (self.starts[index], self.starts[index + 1]),
            Batching::Pack => (
                index * self.seq_len,
                index * self.seq_len + self.seq_len + 1,
            ),
        }
    }
}

impl Rows for SftRows {
    fn count(&self) -> usize {
        match self.batching {
            Batching::Pad => self.starts.len() - 1,
            Batching::Pack => (self.ids.len() - 1) / self.seq_len,
        }
    }

    fn seq_len(&self) -> usize {
        self.seq_len
    }

    fn read(&self, index: usize, inputs: &mut [i32], targets: &mut [i32]) -> Result<(), DataError> {
        assert!(index < self.count(), "row {index} of {}", self.count());
        assert_eq!(inputs.len(), self.seq_len, "inputs buffer length");
        assert_eq!(targets.len(), self.seq_len, "targets buffer length");
        let (start, end) = self.span(index);
        inputs.fill(0);
        targets.fill(IGNORE_TARGET);
        for (column, at) in (start..end).enumerate() {
            if column < self.seq_len {
                inputs[column] = to_i32(self.ids[at], at)?;
            }
            if column > 0 && self.kept[at] {
                targets[column - 1] = to_i32(self.ids[at], at)?;
            }
        }
        Ok(())
    }

    fn check_vocab(&self, vocab_size: usize) -> Result<(), DataError> {
        match self.ids.iter().position(|&id| id as usize >= vocab_size) {
            None => Ok(()),
            Some(position) => Err(DataError::OutOfVocab {
                origin: TokenOrigin::Memory,
                position: position as u64,
                id: self.ids[position],
                vocab_size,
            }),
        }
    }

    fn describe(&self) -> String {
        match self.batching {
            Batching::Pad => format!("{} examples", self.count()),
            Batching::Pack => format!(
                "{} packed windows of {} tokens",
                self.count(),
                self.seq_len + 1
            ),
        }
    }
}
