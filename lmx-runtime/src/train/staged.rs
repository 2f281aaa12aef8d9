//! Training batches handed to the device many steps at a time.

use crate::data::{BatchIterator, BatchPosition};
use crate::error::Result;
use crate::nn;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;
use std::ops::Range;

/// Bytes of token ids one upload holds at most (inputs and targets together): 64 steps of GPT-2's
/// 16 x 1024. The upload stays on the device while its steps run, so this is also what it adds to
/// the run's peak memory. Each upload stalls the device for a few milliseconds, mostly whatever
/// its size, so fewer, larger uploads: at 1 MiB, GPT-2's every eighth step on one GPU, and every
/// fourth on two, was that much slower (docs/benchmarks.md).
const UPLOAD_BYTES: usize = 8 << 20;

/// Steps one upload serves at most.
const MAX_STEPS_PER_UPLOAD: usize = 64;

/// Batches from a [`BatchIterator`], uploaded to a CUDA device for many steps at once.
///
/// Made from host memory, an MLX array lives in memory the host and the device share. On CUDA
/// that is managed memory: writing a step's tokens into it cost the host 0.06 to 0.09 ms a step
/// at the tiny preset on an H100, and a gather in the step (most likely the embedding's, by
/// those ids) took 165 to 202 us, where none of the anchor's 15 costliest kernels is a gather
/// (docs/benchmarks.md). Staged, one upload holds the batches of several steps (up to
/// [`MAX_STEPS_PER_UPLOAD`], within [`UPLOAD_BYTES`]), copied once into the device's own memory
/// ([`nn::device_resident`]), and each step takes its rows as a view of that copy: no upload and
/// no kernel of its own. Unstaged (on the CPU, and on Metal, whose memory is the host's), each
/// upload is one step's batch, handed out as it is, as a plain [`Batch`]'s arrays are.
///
/// Only this process's rows of each drawn batch are uploaded: all of them, or a data-parallel
/// rank's share.
///
/// The positions of the batches handed out are kept, so that a checkpoint records where the
/// next batch comes from, as if the batches had been drawn one at a time.
///
/// [`Batch`]: crate::data::Batch
pub struct StagedBatches {
    staged: bool,
    /// The rows of each drawn batch this process trains on.
    rows: Range<usize>,
    steps_per_upload: usize,
    upload: Option<(Array, Array)>,
    /// The source's position after each batch of the current upload.
    positions: Vec<BatchPosition>,
    /// Batches of the current upload handed out.
    taken: usize,
}

impl StagedBatches {
    /// Uploads of `rows` of each batch (`seq_len` tokens a row): staged (many steps, copied into
    /// device memory) or not (one step each).
    pub fn new(rows: Range<usize>, seq_len: usize, staged: bool) -> Self {
        let step_bytes = 2 * rows.len() * seq_len * std::mem::size_of::<i32>();
        let steps_per_upload = if staged {
            (UPLOAD_BYTES / step_bytes.max(1)).clamp(1, MAX_STEPS_PER_UPLOAD)
        } else {
            1
        };
        StagedBatches {
            staged,
            rows,
            steps_per_upload,
            upload: None,
            positions: Vec::new(),
            taken: 0,
        }
    }

    /// The next step's inputs and targets, `[rows, seq_len]` each. When the current upload
    /// is used up, draws the batches of up to `remaining` steps from `source` into the next.
    pub fn next(&mut self, source: &mut BatchIterator, remaining: u64) -> Result<(Array, Array)> {
        if self.taken == self.positions.len() {
            self.upload(source, remaining)?;
        }
        let (inputs, targets) = self.upload.as_ref().expect("uploaded above");
        let row = self.taken as i32;
        let take = |all: &Array| -> Result<Array> {
            if !self.staged {
                return Ok(all.clone());
            }
            let shape = &all.shape()[1..];
            Ok(all.index(row..row + 1).reshape(shape)?)
        };
        let batch = (take(inputs)?, take(targets)?);
        self.taken += 1;
        Ok(batch)
    }

    /// Where `source` stands after the batches handed out so far: the position a run resumed
    /// from this point must seek.
    pub fn position(&self, source: &BatchIterator) -> BatchPosition {
        match self.taken {
            0 => BatchIterator::position(source),
            taken => self.positions[taken - 1],
        }
    }

    fn upload(&mut self, source: &mut BatchIterator, remaining: u64) -> Result<()> {
        let steps = (remaining.max(1) as usize).min(self.steps_per_upload);
        let (mut inputs, mut targets) = (Vec::new(), Vec::new());
        self.positions.clear();
        let mut columns = 0;
        for _ in 0..steps {
            let batch = source.next_rows(self.rows.clone())?;
            columns = batch.seq_len;
            inputs.extend_from_slice(&batch.inputs);
            targets.extend_from_slice(&batch.targets);
            self.positions.push(BatchIterator::position(source));
        }
        let [rows, columns] = [self.rows.len(), columns].map(|n| n as i32);
        let staged = self.staged;
        let on_device = |ids: &[i32]| -> Result<Array> {
            if !staged {
                // One step's batch, as it is.
                return Ok(Array::from_slice(ids, &[rows, columns]));
            }
            let written = Array::from_slice(ids, &[steps as i32, rows, columns]);
            nn::device_resident(&written)
        };
        self.upload = Some((on_device(&inputs)?, on_device(&targets)?));
        self.taken = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{Order, Windows};
    use std::sync::Arc;

    fn source() -> BatchIterator {
        let tokens: Vec<u32> = (0..400).map(|t| (t * 7 % 97) as u32).collect();
        let windows = Windows::new(Arc::new(tokens), 8).unwrap();
        BatchIterator::new(windows, 3, Order::Shuffled, 5).unwrap()
    }

    #[test]
    fn an_upload_holds_as_many_steps_as_fit_in_eight_mebibytes_up_to_64() {
        let steps = |rows, seq| StagedBatches::new(0..rows, seq, true).steps_per_upload;
        assert_eq!(steps(16, 256), 64);
        assert_eq!(steps(16, 1024), 64);
        assert_eq!(steps(64, 1024), 16);
        assert_eq!(steps(1, 8), 64);
        assert_eq!(steps(512, 2048), 1);
        assert_eq!(StagedBatches::new(0..1, 8, false).steps_per_upload, 1);
        // A rank's share of the rows: as many steps as its own rows fit.
        assert_eq!(
            StagedBatches::new(32..64, 1024, true).steps_per_upload,
            steps(32, 1024)
        );
    }

    #[test]
    fn batches_and_positions_are_those_drawn_one_at_a_time() {
        // Staged, 3 x 8 tokens a step: an upload of 64 steps, then one of the 6 that remain. An
        // epoch (49 windows, 16 batches) ends four times inside the first upload. All three rows,
        // and a rank's share of them (the last two).
        for stage in [true, false] {
            for rows in [0..3, 1..3] {
                check_against_one_at_a_time(stage, rows);
            }
        }
    }

    fn check_against_one_at_a_time(stage: bool, rows: Range<usize>) {
        let mut one_at_a_time = source();
        let mut staged_source = source();
        let mut staged = StagedBatches::new(rows.clone(), 8, stage);
        let own = rows.start * 8..rows.end * 8;
        let steps = 70u64;
        assert_eq!(
            staged.position(&staged_source),
            one_at_a_time.position(),
            "before the first batch"
        );
        for done in 0..steps {
            let batch = one_at_a_time.next_batch().unwrap();
            let (inputs, targets) = staged.next(&mut staged_source, steps - done).unwrap();
            assert_eq!(inputs.shape(), &[rows.len() as i32, 8]);
            assert_eq!(
                inputs.as_slice::<i32>(),
                &batch.inputs[own.clone()],
                "{stage}: step {done}"
            );
            assert_eq!(
                targets.as_slice::<i32>(),
                &batch.targets[own.clone()],
                "{stage}: step {done}"
            );
            assert_eq!(
                staged.position(&staged_source),
                one_at_a_time.position(),
                "after step {done}"
            );
        }
        let last_upload = if stage { 6 } else { 1 };
        assert_eq!(staged.positions.len(), last_upload, "staged: {stage}");
    }
}
