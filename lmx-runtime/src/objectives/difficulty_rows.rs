//! The difficulty curriculum in a run's data path: [`DifficultyRows`] lays out a whole run's
//! batches as rows in order, batch `i`'s easy rows first and its hard rows after, as lmxlab's
//! `difficulty_curriculum` yields them. Every row is a pure function of its index (which set by
//! the schedule, which of that set's rows by a seeded draw), so the trainer reads them in order
//! ([`Rows::in_order`]) and a resumed run, restored to its recorded position, reads exactly the
//! rows of the uninterrupted one.

use super::curriculum::DifficultyCurriculum;
use crate::data::rng::SplitMix64;
use crate::data::{DataError, Rows};
use std::sync::Arc;

/// Which set a row of the curriculum comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Difficulty {
    Easy,
    Hard,
}

/// The rows of a run of `schedule.batches` batches of `batch_size` rows, mixed from `easy` and
/// `hard` by `schedule`; each row drawn uniformly (with replacement, as lmxlab draws random
/// windows) from its set by a generator seeded with the run's seed and the row's index.
#[derive(Clone, Debug)]
pub struct DifficultyRows {
    easy: Arc<dyn Rows>,
    hard: Arc<dyn Rows>,
    schedule: DifficultyCurriculum,
    batch_size: usize,
    seed: u64,
}

impl DifficultyRows {
    /// The curriculum's rows.
    ///
    /// # Errors
    /// [`DataError::InvalidSetting`] when the sets' rows differ in width, a set is empty or
    /// `batch_size` is 0.
    pub fn new(
        easy: Arc<dyn Rows>,
        hard: Arc<dyn Rows>,
        schedule: DifficultyCurriculum,
        batch_size: usize,
        seed: u64,
    ) -> Result<DifficultyRows, DataError> {
        if easy.seq_len() != hard.seq_len() {
            return Err(DataError::InvalidSetting(format!(
                "the easy data's rows are {} tokens, the hard data's {}",
                easy.seq_len(),
                hard.seq_len()
            )));
        }
        if easy.count() == 0 || hard.count() == 0 || batch_size == 0 {
            return Err(DataError::InvalidSetting(format!(
                "a difficulty curriculum needs easy and hard rows and batches of at least one \
                 row: {} easy, {} hard, batches of {batch_size}",
                easy.describe(),
                hard.describe()
            )));
        }
        Ok(DifficultyRows {
            easy,
            hard,
            schedule,
            batch_size,
            seed,
        })
    }

    /// The set row `index` comes from and its index there.
    pub fn source(&self, index: usize) -> (Difficulty, usize) {
        let (batch, slot) = (index / self.batch_size, index % self.batch_size);
        let hard = self.schedule.hard_rows(batch, self.batch_size);
        let (difficulty, set) = match slot < self.batch_size - hard {
            true => (Difficulty::Easy, &self.easy),
            false => (Difficulty::Hard, &self.hard),
        };
        // A generator per row, seeded apart from the window shuffle's (`epoch_permutation`).
        let mut draw =
            SplitMix64::new(self.seed ^ (index as u64).wrapping_mul(0xD1B5_4A32_D192_ED03));
        (difficulty, draw.below(set.count() as u64) as usize)
    }
}

impl Rows for DifficultyRows {
    fn count(&self) -> usize {
        self.schedule.batches * self.batch_size
    }

    fn seq_len(&self) -> usize {
        self.easy.seq_len()
    }

    fn read(&self, index: usize, inputs: &mut [i32], targets: &mut [i32]) -> Result<(), DataError> {
        match self.source(index) {
            (Difficulty::Easy, row) => self.easy.read(row, inputs, targets),
            (Difficulty::Hard, row) => self.hard.read(row, inputs, targets),
        }
    }

    fn check_vocab(&self, vocab_size: usize) -> Result<(), DataError> {
        self.easy.check_vocab(vocab_size)?;
        self.hard.check_vocab(vocab_size)
    }

    fn describe(&self) -> String {
        format!(
            "a difficulty curriculum of {} batches over {} (easy) and {} (hard)",
            self.schedule.batches,
            self.easy.describe(),
            self.hard.describe()
        )
    }

    fn in_order(&self) -> bool {
        true
    }
}
