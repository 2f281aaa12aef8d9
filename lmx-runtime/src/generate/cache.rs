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
//! In a traced decode step ([`super::step`]) the cache is *traced*: its buffers are inputs of the
//! trace, read whole (every slot of their capacity) and written at the step's position, an int32
//! scalar input too (with a dynamic-offset update, or on CUDA by decode attention itself,
//! [`KvCache::attend_decoding`]), and the mask hides the slots past each query.
//! Nothing in the trace then depends on how many slots are filled, so one trace serves every token
//! until the buffers grow.
//!
//! A single sequence's cache ([`KvCache::rotating`]) keeps only the window of a sliding-window
//! layer, in a ring ([`super::ring`]), and a bounded one ([`KvCache::bounded`], mlx-lm's
//! `max_kv_size`) keeps every causal layer's first and last tokens in a ring too; a batch's, which joins and reorders rows, and a
//! speculative decoder's, which cuts rejected tokens back, keep every position.
//!
//! Beside the keys and values it holds the states of recurrent layers ([`super::state`]), which
//! the same rows and slots index.

use super::ring::{self, Ring};
use super::state::RecurrentStates;
use crate::error::{Error, Result};
use crate::nn;
use mlx_rs::ops::indexing::{IndexOp, TryIndexMutOp};
use mlx_rs::{ops, Array};

/// Keys and values of every attention layer so far, `len` slots filled. Not `Clone`: on CUDA
/// decode attention writes a cache's buffers in place, so no two caches may share them.
#[derive(Default)]
pub(crate) struct KvCache {
    layers: Vec<Option<(Array, Array)>>,
    /// Slots filled in every row.
    pub(crate) len: i32,
    /// Per row, the first slot its sequence fills; `None` where every row starts at slot 0.
    starts: Option<Vec<i32>>,
    /// The last mask built, for `(query length, key length)`: every layer of a pass shares it.
    mask: Option<((i32, i32), Array)>,
    /// In a traced decode step, the position of the step's first slot (an int32 scalar input).
    traced: Option<Array>,
    /// In a traced batched decode step, every row's first slot (`[B]` int32, an input): the
    /// traced form of `starts`, so that one trace serves rows of any starts.
    traced_starts: Option<Array>,
    /// Whether sliding-window layers keep only their window ([`super::ring`]): a cache that is
    /// never cut back to an earlier length or joined with others (a single sequence's).
    rotating: bool,
    /// Per layer, the shape of a layer whose buffers are a ring.
    rings: Vec<Option<Ring>>,
    /// In a rotating cache, the ring of every layer that attends causally through
    /// [`Context::attend`](crate::model::Context::attend) (and of a sliding-window layer whose
    /// window is larger): `None` keeps every position.
    bound: Option<Ring>,
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
            traced: None,
            traced_starts: None,
            rotating: false,
            rings: Vec::new(),
            bound: None,
            states: RecurrentStates::default(),
        }
    }

    /// An empty cache whose sliding-window layers keep only their window.
    pub(crate) fn rotating() -> KvCache {
        KvCache {
            rotating: true,
            ..KvCache::default()
        }
    }

    /// An empty cache whose layers keep at most `ring.size` positions each, the first
    /// `ring.keep` and the latest (a rotating cache of mlx-lm's `max_kv_size` and `keep`).
    pub(crate) fn bounded(ring: Ring) -> KvCache {
        KvCache {
            bound: Some(ring),
            ..KvCache::rotating()
        }
    }

    /// The ring of every causal layer of a bounded rotating cache ([`bounded`](Self::bounded)).
    pub(crate) fn bound(&self) -> Option<Ring> {
        self.bound
            .filter(|_| self.rotating && self.starts.is_none())
    }

    /// The cache inside a traced step: every layer's buffers (`keys, values, keys, values, ..`,
    /// as [`take_buffers`](Self::take_buffers) gives them), written at slot `offset` (an int32
    /// scalar); its one row starts at slot 0; the layers with a shape in `rings` are rings, and
    /// `bound` is the prefilled cache's. Every layer reads the offset: it is kept in device
    /// memory ([`nn::device_resident`]).
    pub(crate) fn traced(
        buffers: Vec<Array>,
        offset: &Array,
        rings: Vec<Option<Ring>>,
        bound: Option<Ring>,
    ) -> Result<KvCache> {
        Ok(KvCache {
            layers: pairs(buffers),
            len: 0,
            starts: None,
            mask: None,
            traced: Some(nn::device_resident(offset)?),
            traced_starts: None,
            rotating: true,
            rings,
            bound,
            states: RecurrentStates::default(),
        })
    }

    /// The cache inside a traced batched step: as [`traced`](Self::traced), for rows that start
    /// at slots `starts` (`[B]` int32, also kept in device memory) and whose layers all keep
    /// every position (a batch's).
    pub(crate) fn traced_rows(
        buffers: Vec<Array>,
        offset: &Array,
        starts: &Array,
    ) -> Result<KvCache> {
        Ok(KvCache {
            layers: pairs(buffers),
            traced: Some(nn::device_resident(offset)?),
            traced_starts: Some(nn::device_resident(starts)?),
            ..KvCache::default()
        })
    }

    /// Every row's first slot as an int32 array `[B]` (a traced batched step's input), `None`
    /// where every row starts at slot 0.
    pub(crate) fn starts(&self) -> Option<Array> {
        self.starts
            .as_ref()
            .map(|starts| Array::from_slice(starts, &[starts.len() as i32]))
    }

    /// Every row's first slot, inside a traced batched step or out: what absolute positions
    /// count from ([`Positions::rows`](crate::nn::Positions)).
    pub(crate) fn row_starts(&self) -> Option<Array> {
        self.traced_starts.clone().or_else(|| self.starts())
    }

    /// Per layer, the shape of a layer whose buffers are a ring.
    pub(crate) fn rings(&self) -> Vec<Option<Ring>> {
        self.rings.clone()
    }

    /// Whether `layer`'s buffers are a ring.
    fn is_ring(&self, layer: usize) -> bool {
        self.rings.get(layer).copied().flatten().is_some()
    }

    /// The position of the current call's first slot as an int32 scalar: the traced offset, or
    /// the filled length.
    pub(crate) fn position(&self) -> Array {
        self.traced
            .clone()
            .unwrap_or_else(|| Array::from_int(self.len))
    }

    /// How many keys a call of `q_len` queries sees: a traced step sees the buffers' whole
    /// capacity, another call the filled slots and its own.
    pub(crate) fn key_len(&self, q_len: i32) -> i32 {
        match &self.traced {
            Some(_) => self.capacity(),
            None => self.len + q_len,
        }
    }

    /// Slots the buffers of the layers that are not rings hold (filled or not); 0 before the
    /// first call.
    pub(crate) fn capacity(&self) -> i32 {
        self.layers
            .iter()
            .enumerate()
            .filter(|(layer, _)| !self.is_ring(*layer))
            .find_map(|(_, buffers)| buffers.as_ref())
            .map_or(0, |(keys, _)| keys.dim(2))
    }

    /// Slots each layer's buffers hold (a ring's are its window), for tests of memory bounds.
    pub(crate) fn slots(&self) -> Vec<i32> {
        self.layers
            .iter()
            .map(|buffers| buffers.as_ref().map_or(0, |(keys, _)| keys.dim(2)))
            .collect()
    }

    /// Grows every layer's buffers, if needed, to hold slots up to `end` (in blocks of
    /// [`KvCache::STEP`]): done before a traced step, whose buffers cannot grow inside it.
    pub(crate) fn reserve(&mut self, end: i32) -> Result<()> {
        let filled = self.len;
        for (layer, buffers) in self.layers.iter_mut().enumerate() {
            let Some((keys, values)) = buffers else {
                continue;
            };
            match self.rings.get(layer).copied().flatten() {
                Some(shape) => {
                    let slots = ring::slots_for(end, shape, Self::STEP);
                    *keys = widen(keys.clone(), slots)?;
                    *values = widen(values.clone(), slots)?;
                }
                None if keys.dim(2) < end => {
                    *keys = grow(Some(keys.clone()), &*keys, filled, end)?;
                    *values = grow(Some(values.clone()), &*values, filled, end)?;
                }
                None => {}
            }
        }
        Ok(())
    }

    /// Takes every layer's buffers out (`keys, values` per layer, in layer order), so that a
    /// traced step is their only holder and may update them in place.
    pub(crate) fn take_buffers(&mut self) -> Vec<Array> {
        self.layers
            .iter_mut()
            .flat_map(|layer| {
                layer
                    .take()
                    .map(|(keys, values)| [keys, values])
                    .into_iter()
                    .flatten()
            })
            .collect()
    }

    /// Puts buffers back as [`take_buffers`](Self::take_buffers) gave them (a traced step's new
    /// ones), `tokens` more slots filled.
    pub(crate) fn put_buffers(&mut self, buffers: Vec<Array>, tokens: i32) {
        self.layers = pairs(buffers);
        self.len += tokens;
        self.mask = None;
    }

    /// [`extend`](Self::extend) for a layer whose queries see only the keys fewer than `window`
    /// positions back: in a rotating cache its buffers are a ring of `window` slots
    /// ([`super::ring`]; the bound's ring where that is smaller), and the keys and values it
    /// returns come with their positions (`[T_k]` int32, -1 for an empty slot), which the mask
    /// must then go by; otherwise as `extend`.
    pub(crate) fn extend_windowed(
        &mut self,
        layer: usize,
        k: &Array,
        v: &Array,
        window: i32,
    ) -> Result<(Array, Array, Option<Array>)> {
        if !self.rotating || self.starts.is_some() {
            let (keys, values) = self.extend(layer, k, v)?;
            return Ok((keys, values, None));
        }
        let shape = match self.bound {
            Some(bound) if bound.size < window => bound,
            _ => Ring::window(window),
        };
        let (keys, values, positions) = self.extend_ring(layer, k, v, shape)?;
        Ok((keys, values, Some(positions)))
    }

    /// Writes `k` and `v` into layer `layer`'s ring of `shape` ([`super::ring`]) and returns
    /// the keys and values the call sees with their positions (`[T_k]` int32, -1 for an empty
    /// slot), which the mask must go by. For a rotating cache's layers.
    pub(crate) fn extend_ring(
        &mut self,
        layer: usize,
        k: &Array,
        v: &Array,
        shape: Ring,
    ) -> Result<(Array, Array, Array)> {
        if self.layers.len() <= layer {
            self.layers.resize(layer + 1, None);
        }
        if self.rings.len() <= layer {
            self.rings.resize(layer + 1, None);
        }
        self.rings[layer] = Some(shape);
        if let Some(offset) = &self.traced {
            let (keys, values) = self.layers[layer].take().ok_or_else(|| {
                Error::Layout(format!(
                    "a traced decode step attends in layer {layer}, which holds no keys yet"
                ))
            })?;
            let (keys, positions) = ring::extend_traced(&keys, k, offset, shape)?;
            let (values, _) = ring::extend_traced(&values, v, offset, shape)?;
            self.layers[layer] = Some((keys.clone(), values.clone()));
            return Ok((keys, values, positions));
        }
        let slots = ring::slots_for(self.len + k.dim(2), shape, Self::STEP);
        let (keys, values) = match self.layers[layer].take() {
            Some((keys, values)) => (widen(keys, slots)?, widen(values, slots)?),
            None => (blank(k, slots)?, blank(v, slots)?),
        };
        let (seen_keys, positions, keys) = ring::extend(&keys, k, self.len, shape)?;
        let (seen_values, _, values) = ring::extend(&values, v, self.len, shape)?;
        self.layers[layer] = Some((keys, values));
        Ok((seen_keys, seen_values, positions))
    }

    /// Writes `k` and `v` (`[B, heads, T, head_dim]`) at slots `len .. len + T` of layer
    /// `layer`'s buffers and returns the filled part, `[.., :len + T, :]`.
    pub(crate) fn extend(&mut self, layer: usize, k: &Array, v: &Array) -> Result<(Array, Array)> {
        if self.layers.len() <= layer {
            self.layers.resize(layer + 1, None);
        }
        if let Some(offset) = &self.traced {
            let (keys, values) = self.layers[layer].take().ok_or_else(|| {
                Error::Layout(format!(
                    "a traced decode step attends in layer {layer}, which holds no keys yet"
                ))
            })?;
            let keys = nn::slice_update_dynamic(&keys, k, offset, 2)?;
            let values = nn::slice_update_dynamic(&values, v, offset, 2)?;
            self.layers[layer] = Some((keys.clone(), values.clone()));
            return Ok((keys, values));
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

    /// In a traced step of one token per row (where [`decode_slots`](Self::decode_slots) gives
    /// its slots), attention of layer `layer`'s queries `q` over its buffers with this token's
    /// keys `k` and values `v` written into them (`nn::decode_attention`: on CUDA in place, by
    /// the kernel that attends).
    pub(crate) fn attend_decoding(
        &mut self,
        layer: usize,
        q: &Array,
        (k, v): (&Array, &Array),
        slots: &nn::DecodeSlots,
    ) -> Result<Array> {
        let buffers = self.layers.get_mut(layer).and_then(Option::take);
        let buffers = buffers.ok_or_else(|| {
            Error::Layout(format!(
                "a traced decode step attends in layer {layer}, which holds no keys yet"
            ))
        })?;
        let capacity = buffers.0.dim(2);
        let (out, keys, values) = nn::decode_attention(q, (k, v), buffers, slots, || {
            self.mask(1, capacity)?
                .ok_or_else(|| Error::Layout("a traced decode step's cache built no mask".into()))
        })?;
        self.layers[layer] = Some((keys, values));
        Ok(out)
    }

    /// In a traced step of one token per row, which of the buffers' slots its queries see (the
    /// same view as [`mask`](Self::mask), for attention that reads only those slots).
    pub(crate) fn decode_slots(&self, q_len: i32) -> Option<nn::DecodeSlots> {
        let position = self.traced.clone().filter(|_| q_len == 1)?;
        Some(nn::DecodeSlots {
            position,
            starts: self.traced_starts.clone(),
        })
    }

    /// The boolean mask `[B, 1, T_q, T_k]` of which keys the last `q_len` slots' queries see, `None`
    /// where no row is padded (plain causal attention then). A query sees its own row's slots
    /// from the row's start up to itself; a query on a padding slot sees only itself, so that
    /// no query sees nothing (a softmax over no key is NaN, which would reach the padding's
    /// keys and values and, through a zero weight, every query that skips them).
    ///
    /// In a traced step the mask is always given: the keys are the buffers' whole capacity, of
    /// which a query sees the slots up to itself (after its row's start).
    pub(crate) fn mask(&mut self, q_len: i32, k_len: i32) -> Result<Option<Array>> {
        if self.starts.is_none() && self.traced.is_none() {
            return Ok(None);
        }
        let starts = match (&self.traced_starts, &self.starts) {
            (Some(starts), _) => Some(starts.reshape(&[-1, 1, 1, 1])?),
            (None, Some(starts)) => {
                Some(Array::from_slice(starts, &[starts.len() as i32, 1, 1, 1]))
            }
            (None, None) => None,
        };
        if let Some((shape, mask)) = &self.mask {
            if *shape == (q_len, k_len) {
                return Ok(Some(mask.clone()));
            }
        }
        let first = self
            .traced
            .clone()
            .unwrap_or_else(|| Array::from_int(k_len - q_len));
        let rows = nn::positions_after(&first, q_len)?.reshape(&[1, 1, q_len, 1])?;
        let cols = Array::arange::<_, i32>(None, k_len, None)?.reshape(&[1, 1, 1, k_len])?;
        let mut seen = cols.le(&rows)?;
        if let Some(starts) = &starts {
            seen = seen.logical_and(&cols.ge(starts)?)?;
        }
        let mask = seen.logical_or(&cols.eq(&rows)?)?;
        self.mask = Some(((q_len, k_len), mask.clone()));
        Ok(Some(mask))
    }

    /// Which of the next `t_len` slots each row's sequence fills, `[B, T]` bool: `None` where
    /// no row is padded. (Recurrent layers zero their inputs on a row's padding, so that its
    /// state starts as an unpadded row's does.)
    pub(crate) fn valid(&self, t_len: i32) -> Result<Option<Array>> {
        let starts = match (&self.traced_starts, &self.starts) {
            (Some(starts), _) => starts.reshape(&[-1, 1])?,
            (None, Some(starts)) => Array::from_slice(starts, &[starts.len() as i32, 1]),
            (None, None) => return Ok(None),
        };
        let slots = nn::positions_after(&self.position(), t_len)?.reshape(&[1, t_len])?;
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
    /// only a prefix with the cached one). A ring that went round has lost positions before
    /// `len` that the next pass would see: the whole cache is then dropped. Returns the length
    /// kept.
    pub(crate) fn truncate(&mut self, len: i32) -> i32 {
        let lost = self.rings.iter().flatten().any(|ring| self.len > ring.size);
        if len < self.len && lost {
            *self = KvCache {
                bound: self.bound,
                ..KvCache::rotating()
            };
        }
        self.len = self.len.min(len);
        self.len
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

/// Layers' `(keys, values)` from buffers laid out `keys, values, keys, values, ..`.
fn pairs(buffers: Vec<Array>) -> Vec<Option<(Array, Array)>> {
    let mut buffers = buffers.into_iter();
    let mut layers = Vec::new();
    while let (Some(keys), Some(values)) = (buffers.next(), buffers.next()) {
        layers.push(Some((keys, values)));
    }
    layers
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

/// Zeros of `like`'s shape (`[B, heads, T, head_dim]`) and type over `slots` slots.
fn blank(like: &Array, slots: i32) -> Result<Array> {
    let shape = like.shape();
    Ok(ops::zeros_dtype(
        &[shape[0], shape[1], slots, shape[3]],
        like.dtype(),
    )?)
}

/// A buffer with room for slots up to `end` (rounded up to a multiple of [`KvCache::STEP`]): the
/// first `filled` slots of `held` (zeros where nothing is held), then zeros.
fn grow(held: Option<Array>, new: &Array, filled: i32, end: i32) -> Result<Array> {
    let capacity = (end + KvCache::STEP - 1) / KvCache::STEP * KvCache::STEP;
    Ok(match held {
        Some(held) => widen(held.index((.., .., ..filled, ..)), capacity)?,
        None => blank(new, capacity)?,
    })
}
