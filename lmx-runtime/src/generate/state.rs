//! The recurrent half of the generation cache: per recurrent slot (each call of a scan or causal
//! convolution in a forward pass, in order), the state after the positions fed so far, `[B, ..]`
//! with the batch first. [`super::cache::KvCache`] holds it beside the keys and values, so that
//! whatever carries a cache (a prompt cache, a batch's rows) carries both.
//!
//! Unlike keys and values, a state cannot be cut back to an earlier position: a cache that holds
//! one can only be emptied ([`RecurrentStates::is_empty`] tells the callers that rewind).

use crate::error::Result;
use mlx_rs::{ops, Array};

/// The states of the recurrent slots, `None` where a slot has not run yet.
#[derive(Clone, Default)]
pub(crate) struct RecurrentStates {
    slots: Vec<Option<Array>>,
}

impl RecurrentStates {
    /// The state slot `slot` holds, `None` before its first call.
    pub(crate) fn get(&self, slot: usize) -> Option<Array> {
        self.slots.get(slot).cloned().flatten()
    }

    /// Replaces slot `slot`'s state.
    pub(crate) fn set(&mut self, slot: usize, state: Array) {
        if self.slots.len() <= slot {
            self.slots.resize(slot + 1, None);
        }
        self.slots[slot] = Some(state);
    }

    /// Whether no slot holds a state (a model without recurrences, or nothing fed yet).
    pub(crate) fn is_empty(&self) -> bool {
        self.slots.iter().all(Option::is_none)
    }

    /// How many slots have run.
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Takes every slot's state out, in slot order, for a traced decode step's inputs (after a
    /// prefill, which runs every slot).
    pub(crate) fn take_all(&mut self) -> Vec<Array> {
        std::mem::take(&mut self.slots)
            .into_iter()
            .flatten()
            .collect()
    }

    /// The states of `arrays`, one per slot in order (a traced decode step's).
    pub(crate) fn from_arrays(arrays: Vec<Array>) -> RecurrentStates {
        RecurrentStates {
            slots: arrays.into_iter().map(Some).collect(),
        }
    }

    /// Every state, to evaluate with the cache.
    pub(crate) fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.slots.iter().flatten()
    }

    /// Rows `index` (an int array over the batch axis) of every state.
    pub(crate) fn take_rows(&mut self, index: &Array) -> Result<()> {
        for state in self.slots.iter_mut().flatten() {
            *state = state.take_axis(index, 0)?;
        }
        Ok(())
    }

    /// `other`'s rows after these (both caches have run the same slots).
    pub(crate) fn append_rows(&mut self, other: RecurrentStates) -> Result<()> {
        if self.slots.len() < other.slots.len() {
            self.slots.resize(other.slots.len(), None);
        }
        for (mine, theirs) in self.slots.iter_mut().zip(other.slots) {
            *mine = match (mine.take(), theirs) {
                (Some(a), Some(b)) => Some(ops::concatenate(&[a, b], 0)?),
                (held, None) | (None, held) => held,
            };
        }
        Ok(())
    }
}
