//! Curricula, after lmxlab's `difficulty_curriculum` and `length_curriculum`: which data each
//! batch of a run draws, as a pure function of the batch's index, so that a resumed run draws
//! exactly what an uninterrupted one would.

use crate::error::{Error, Result};

/// Easy-to-hard mixing: batch `i` of `batches` holds `floor(batch_size · p)` hard rows and the
/// rest easy ones, with `p = min(1, i / max(batches - 1, 1) / warmup_fraction)` (lmxlab's
/// `difficulty_curriculum`), so the mix moves linearly from all easy to all hard over the
/// warm-up and stays all hard after it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DifficultyCurriculum {
    /// Batches in the whole run.
    pub batches: usize,
    /// The fraction of the run over which the hard share grows to 1 (lmxlab's default 0.5).
    pub warmup_fraction: f64,
}

impl DifficultyCurriculum {
    /// The schedule, checked.
    ///
    /// # Errors
    /// [`Error::Config`] naming the setting when `batches` is 0 or `warmup_fraction` is not in
    /// `(0, 1]`.
    pub fn new(batches: usize, warmup_fraction: f64) -> Result<Self> {
        if batches == 0 {
            return Err(Error::Config(
                "difficulty curriculum: `batches` must be at least 1".into(),
            ));
        }
        if !(warmup_fraction > 0.0 && warmup_fraction <= 1.0) {
            return Err(Error::Config(format!(
                "difficulty curriculum: `warmup_fraction` must be in (0, 1], got {warmup_fraction}"
            )));
        }
        Ok(DifficultyCurriculum {
            batches,
            warmup_fraction,
        })
    }

    /// The share of hard rows in batch `index`, in `[0, 1]`.
    pub fn hard_share(&self, index: usize) -> f64 {
        let progress = index as f64 / self.batches.saturating_sub(1).max(1) as f64;
        (progress / self.warmup_fraction).min(1.0)
    }

    /// How many of `batch_size` rows of batch `index` are hard.
    pub fn hard_rows(&self, index: usize, batch_size: usize) -> usize {
        (batch_size as f64 * self.hard_share(index)).floor() as usize
    }
}

/// Sequence length growing by declared stages: stage `s` (batches `s · per_stage ..`) trains at
/// `lengths[s]`, the last stage until the run ends. The lengths are fixed before the run, so the
/// compiled step is traced once per declared length and never for another.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LengthCurriculum {
    lengths: Vec<usize>,
    per_stage: usize,
}

impl LengthCurriculum {
    /// Stages at the given lengths, `per_stage` batches each.
    ///
    /// # Errors
    /// [`Error::Config`] when there is no stage, a length is 0, the lengths decrease or
    /// `per_stage` is 0.
    pub fn new(lengths: Vec<usize>, per_stage: usize) -> Result<Self> {
        if lengths.is_empty() || per_stage == 0 {
            return Err(Error::Config(
                "length curriculum: needs at least one stage of at least one batch".into(),
            ));
        }
        if lengths.contains(&0) || lengths.windows(2).any(|pair| pair[1] < pair[0]) {
            return Err(Error::Config(format!(
                "length curriculum: stage lengths must be positive and non-decreasing, got {lengths:?}"
            )));
        }
        Ok(LengthCurriculum { lengths, per_stage })
    }

    /// lmxlab's `length_curriculum` stages: `stages` lengths spaced evenly from `min` to `max`
    /// (rounded down), `per_stage` batches each.
    ///
    /// # Errors
    /// As [`LengthCurriculum::new`], and when `min > max` or `stages` is 0.
    pub fn linear(min: usize, max: usize, stages: usize, per_stage: usize) -> Result<Self> {
        if min > max || stages == 0 {
            return Err(Error::Config(format!(
                "length curriculum: {stages} stages from {min} to {max}"
            )));
        }
        let lengths = (0..stages)
            .map(|s| match stages {
                1 => max,
                _ => min + (max - min) * s / (stages - 1),
            })
            .collect();
        LengthCurriculum::new(lengths, per_stage)
    }

    /// The declared lengths, in order.
    pub fn lengths(&self) -> &[usize] {
        &self.lengths
    }

    /// Batches per stage.
    pub fn per_stage(&self) -> usize {
        self.per_stage
    }

    /// The sequence length of batch `index`.
    pub fn length(&self, index: usize) -> usize {
        let stage = (index / self.per_stage).min(self.lengths.len() - 1);
        self.lengths[stage]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn difficulty_moves_from_easy_to_hard_over_the_warmup() -> Result<()> {
        let schedule = DifficultyCurriculum::new(200, 0.5)?;
        let rows: Vec<usize> = [0, 1, 50, 99, 100, 150, 199]
            .iter()
            .map(|&i| schedule.hard_rows(i, 8))
            .collect();
        assert_eq!(rows, [0, 0, 4, 7, 8, 8, 8]);
        assert!(DifficultyCurriculum::new(10, 0.0).is_err());
        assert!(DifficultyCurriculum::new(0, 0.5).is_err());
        Ok(())
    }

    #[test]
    fn length_stages_are_the_declared_ones() -> Result<()> {
        let stages = LengthCurriculum::linear(32, 512, 4, 100)?;
        assert_eq!(stages.lengths(), [32, 192, 352, 512]);
        assert_eq!(
            [0, 99, 100, 399, 10_000].map(|i| stages.length(i)),
            [32, 32, 192, 512, 512]
        );
        assert!(LengthCurriculum::new(vec![64, 32], 1).is_err());
        Ok(())
    }

    /// A run over three stages traces the compiled step once per declared length, and going
    /// back to a length traced before traces nothing more.
    #[test]
    fn the_compiled_step_is_traced_once_per_declared_length() -> Result<()> {
        use crate::nn::{self, init::Keys};
        use crate::optim::Sgd;
        use crate::state::TrainState;
        use crate::step::{StepOptions, TrainStep};
        use mlx_rs::Array;

        let table = nn::init::embedding(8, 8, &mut Keys::from_seed(0)?)?;
        let optimizer = Sgd::default();
        let mut state = TrainState::new(table, &optimizer, 0)?;
        let loss = |params: &nn::EmbeddingParams, batch: &[Array], _: &Array| {
            nn::cross_entropy(&nn::embedding(params, &batch[0])?, &batch[1])
        };
        let mut step = TrainStep::new(&state, optimizer, loss, StepOptions::default())?;
        let stages = LengthCurriculum::new(vec![4, 8, 16], 2)?;
        for index in (0..8).chain([0]) {
            let len = stages.length(index) as i32;
            let ids: Vec<i32> = (0..2 * len).map(|i| i % 8).collect();
            let tokens = Array::from_slice(&ids, &[2, len]);
            let targets = Array::from_slice(
                &ids.iter().map(|i| (i + 1) % 8).collect::<Vec<_>>(),
                &[2, len],
            );
            let metrics = step.step(&mut state, 0.1, &[tokens, targets])?;
            mlx_rs::transforms::eval(&metrics.outputs)?;
        }
        assert_eq!(step.traces(), stages.lengths().len());
        Ok(())
    }
}
