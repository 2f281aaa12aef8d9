//! The key-value cache of generation: per attention layer, buffers `[B, heads, capacity, head_dim]`
//! preallocated and grown in blocks of [`KvCache::STEP`] positions and written in place, as
//! mlx-lm's `KVCache` keeps them.
//!
//! Rows of a batch share the positions ("slots") of the cache: every forward pass writes the same
//! slots in every row. A row whose sequence is shorter starts later (left padding): its slots
//! before its `start` are masked out of every query's view. Attention depends only on how far
//! apart a query and a key are (rotary embeddings, ALiBi, no positions at all), so a sequence's
//! logits are the same whatever slot it starts at.
//!
//! Beside the keys and values it holds the states of recurrent layers ([`super::state`]), which
//! the same rows and slots index.

use super::state::RecurrentStates;
use crate::error::Result;
use mlx_rs::ops::indexing::{IndexOp, TryIndexMutOp};
use mlx_rs::{ops, Array};

/// Keys and values of every attention layer so far, `len` slots filled.
#[derive(Clone, Default)]
pub(crate) struct KvCache {
    layers: Vec<Option<(Array, Array)>>,
    /// Slots filled in every row.
    pub(crate) len: i32,
    /// Per row, the first slot its sequence fills; `None` where every row starts at slot 0.
    starts: Option<Vec<i32>>,
    /// The last mask built, for `(query length, key length)`: every layer of a pass shares it.
    mask: Option<((i32, i32), Array)>,
    /// The recurrent layers' states after the `len` filled slots.
    pub(crate) states: RecurrentStates,
}

impl KvCache {
    /// Positions added to a layer's buffer when it is full.
    pub(crate) const STEP: i32 = 256;

    /// A cache whose rows start at slots `starts` and of which `len` slots count as filled (the
    /// slots before a row's start hold nothing it sees).
    pub(crate) fn padded(starts: Vec<i32>, len: i32) -> KvCache {
        KvCache {
            layers: Vec::new(),
            len,
            starts: Some(starts),
            mask: None,
            states: RecurrentStates::default(),
        }
    }

    /// Writes `k` and `v` (`[B, heads, T, head_dim]`) at slots `len .. len + T` of layer
    /// `layer`'s buffers and returns the filled part, `[.., :len + T, :]`.
    pub(crate) fn extend(&mut self, layer: usize, k: &Array, v: &Array) -> Result<(Array, Array)> {
        if self.layers.len() <= layer {
            self.layers.resize(layer + 1, None);
        }
        let start = self.len;
        let end = start + k.dim(2);
        let (mut keys, mut values) = match self.layers[layer].take() {
            Some((keys, values)) if keys.dim(2) >= end => (keys, values),
            held => {
                let (keys, values) = held.unzip();
                (grow(keys, k, start, end)?, grow(values, v, start, end)?)
            }
        };
        keys.try_index_mut((.., .., start..end, ..), k)?;
        values.try_index_mut((.., .., start..end, ..), v)?;
        let filled = (
            keys.index((.., .., ..end, ..)),
            values.index((.., .., ..end, ..)),
        );
        self.layers[layer] = Some((keys, values));
        Ok(filled)
    }

    /// The boolean mask `[B, 1, T_q, T_k]` of which keys the last `q_len` slots' queries see, `None`
    /// where no row is padded (plain causal attention then). A query sees its own row's slots
    /// from the row's start up to itself; a query on a padding slot sees only itself, so that
    /// no query sees nothing (a softmax over no key is NaN, which would reach the padding's
    /// keys and values and, through a zero weight, every query that skips them).
    pub(crate) fn mask(&mut self, q_len: i32, k_len: i32) -> Result<Option<Array>> {
        let Some(starts) = &self.starts else {
            return Ok(None);
        };
        if let Some((shape, mask)) = &self.mask {
            if *shape == (q_len, k_len) {
                return Ok(Some(mask.clone()));
            }
        }
        let rows =
            Array::arange::<_, i32>(k_len - q_len, k_len, None)?.reshape(&[1, 1, q_len, 1])?;
        let cols = Array::arange::<_, i32>(None, k_len, None)?.reshape(&[1, 1, 1, k_len])?;
        let starts = Array::from_slice(starts, &[starts.len() as i32, 1, 1, 1]);
        let seen = cols.ge(&starts)?.logical_and(&cols.le(&rows)?)?;
        let mask = seen.logical_or(&cols.eq(&rows)?)?;
        self.mask = Some(((q_len, k_len), mask.clone()));
        Ok(Some(mask))
    }

    /// Which of the next `t_len` slots each row's sequence fills, `[B, T]` bool: `None` where
    /// no row is padded. (Recurrent layers zero their inputs on a row's padding, so that its
    /// state starts as an unpadded row's does.)
    pub(crate) fn valid(&self, t_len: i32) -> Result<Option<Array>> {
        let Some(starts) = &self.starts else {
            return Ok(None);
        };
        let slots =
            Array::arange::<_, i32>(self.len, self.len + t_len, None)?.reshape(&[1, t_len])?;
        let starts = Array::from_slice(starts, &[starts.len() as i32, 1]);
        Ok(Some(slots.ge(&starts)?))
    }

    /// Every buffer, to evaluate the cache without the logits (a prefill chunk).
    pub(crate) fn arrays(&self) -> Vec<&Array> {
        self.layers
            .iter()
            .flatten()
            .flat_map(|(k, v)| [k, v])
            .chain(self.states.arrays())
            .collect()
    }

    /// Whether [`truncate`](Self::truncate) can cut the cache back to `len` slots: recurrent
    /// states hold no earlier position, so a cache that has them can only keep all it holds.
    pub(crate) fn can_truncate(&self, len: i32) -> bool {
        len >= self.len || self.states.is_empty()
    }

    /// Forgets the slots from `len` on: the next pass writes over them (a prompt that shares
    /// only a prefix with the cached one).
    pub(crate) fn truncate(&mut self, len: i32) {
        self.len = self.len.min(len);
    }

    /// Rows (the batch axis) in `rows`' order, others dropped.
    pub(crate) fn keep_rows(&mut self, rows: &[usize]) -> Result<()> {
        let index = Array::from_slice(
            &rows.iter().map(|&row| row as i32).collect::<Vec<_>>(),
            &[rows.len() as i32],
        );
        for (keys, values) in self.layers.iter_mut().flatten() {
            *keys = keys.take_axis(&index, 0)?;
            *values = values.take_axis(&index, 0)?;
        }
        self.states.take_rows(&index)?;
        if let Some(starts) = &mut self.starts {
            *starts = rows.iter().map(|&row| starts[row]).collect();
        }
        self.mask = None;
        Ok(())
    }

    /// Appends `other`'s rows after this cache's; both hold the same slots (`len`).
    pub(crate) fn append_rows(&mut self, other: KvCache) -> Result<()> {
        debug_assert_eq!(self.len, other.len);
        let rows = |cache: &KvCache| {
            cache
                .layers
                .iter()
                .flatten()
                .next()
                .map_or(0, |(keys, _)| keys.dim(0))
        };
        let mut starts = self
            .starts
            .take()
            .unwrap_or_else(|| vec![0; rows(self) as usize]);
        let other_rows = rows(&other) as usize;
        starts.extend(other.starts.unwrap_or_else(|| vec![0; other_rows]));
        if self.layers.len() < other.layers.len() {
            self.layers.resize(other.layers.len(), None);
        }
        for (mine, theirs) in self.layers.iter_mut().zip(other.layers) {
            *mine = match (mine.take(), theirs) {
                (Some((k1, v1)), Some((k2, v2))) => {
                    let capacity = k1.dim(2).max(k2.dim(2));
                    Some((
                        ops::concatenate(&[widen(k1, capacity)?, widen(k2, capacity)?], 0)?,
                        ops::concatenate(&[widen(v1, capacity)?, widen(v2, capacity)?], 0)?,
                    ))
                }
                (held, None) | (None, held) => held,
            };
        }
        self.starts = Some(starts);
        self.mask = None;
        self.states.append_rows(other.states)?;
        Ok(())
    }
}

/// `buffer` with zeros appended along the slot axis up to `capacity` slots.
fn widen(buffer: Array, capacity: i32) -> Result<Array> {
    let shape = buffer.shape();
    if shape[2] >= capacity {
        return Ok(buffer);
    }
    let zeros = ops::zeros_dtype(
        &[shape[0], shape[1], capacity - shape[2], shape[3]],
        buffer.dtype(),
    )?;
    Ok(ops::concatenate(&[buffer, zeros], 2)?)
}

/// A buffer with room for slots up to `end` (rounded up to a multiple of [`KvCache::STEP`]): the
/// first `filled` slots of `held` (zeros where nothing is held), then zeros.
fn grow(held: Option<Array>, new: &Array, filled: i32, end: i32) -> Result<Array> {
    let shape = new.shape();
    let capacity = (end + KvCache::STEP - 1) / KvCache::STEP * KvCache::STEP;
    Ok(match held {
        Some(held) => widen(held.index((.., .., ..filled, ..)), capacity)?,
        None => ops::zeros_dtype(&[shape[0], shape[1], capacity, shape[3]], new.dtype())?,
    })
}
