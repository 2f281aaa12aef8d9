//! The rotating key-value buffers of a layer whose queries see a bounded set of keys, as mlx-lm's
//! `RotatingKVCache` keeps them: a ring of `size` slots of which the first `keep` hold the
//! sequence's first `keep` positions for good and the others rotate, position `p >= keep` in slot
//! `keep + (p - keep) mod (size - keep)`, so that the layer's memory is bounded however long the
//! sequence. A sliding-window layer's ring is its window with nothing kept; a bounded cache
//! (mlx-lm's `max_kv_size`) gives every layer a ring that keeps the first tokens (the "attention
//! sinks" of StreamingLLM, mlx-lm's `keep`). Until the sequence reaches `size` the ring is
//! shorter, grown in blocks as a plain buffer is (the positions so far are then in the slots of
//! their own number), so that a short sequence neither holds nor attends over the whole ring.
//!
//! A query at position `q` sees the keys at `0 .. keep` and at `q - (size - keep) + 1 ..= q`
//! ([`visible`]): when the ring holds those before a call, it holds every key an earlier position
//! of the call needs. A call of `T` tokens sees the ring's keys followed by its own (`size + T`
//! keys, their positions given beside them for the mask); those of them the ring keeps are then
//! written to their slots. A traced step (one token, its position an array) writes its token
//! first and sees the ring alone. Slots not yet written carry position -1, which the mask hides.

use crate::error::Result;
use crate::nn;
use mlx_rs::{ops, Array};

/// A ring's shape: `size` slots, the first `keep` of them never overwritten (`keep < size`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ring {
    pub(crate) size: i32,
    pub(crate) keep: i32,
}

impl Ring {
    /// A sliding window's ring: `window` slots, nothing kept.
    pub(crate) fn window(window: i32) -> Ring {
        Ring {
            size: window,
            keep: 0,
        }
    }

    /// Slots that rotate.
    fn rotating(self) -> i32 {
        self.size - self.keep
    }

    /// The slot position `position` goes to.
    fn slot(self, position: i32) -> i32 {
        if position < self.keep {
            position
        } else {
            self.keep + (position - self.keep) % self.rotating()
        }
    }
}

/// The positions the first `slots` slots of `ring` hold once positions `0 .. filled` went
/// through it: slot `s` holds the last of them that goes to `s`, or -1 when none does.
fn slot_positions(filled: i32, slots: i32, ring: Ring) -> Array {
    let last = filled - 1;
    let positions: Vec<i32> = (0..slots)
        .map(|slot| {
            if last < slot {
                -1
            } else if slot < ring.keep {
                slot
            } else {
                last - (last - slot) % ring.rotating()
            }
        })
        .collect();
    Array::from_slice(&positions, &[slots])
}

/// Slots `ring` needs to hold `filled` positions: `filled` rounded up to a block of `step`, at
/// most the ring's size.
pub(crate) fn slots_for(filled: i32, ring: Ring, step: i32) -> i32 {
    ((filled + step - 1) / step * step).min(ring.size)
}

/// Which keys at `keys` (positions `[T_k]` int32, -1 for an empty slot) queries at `queries`
/// (`[T_q]`) of a layer with `ring` see, `[1, 1, T_q, T_k]` bool: the first `keep` positions and
/// the last `size - keep` up to the query's own.
pub(crate) fn visible(queries: &Array, keys: &Array, ring: Ring) -> Result<Array> {
    let rows = queries.reshape(&[1, 1, -1, 1])?;
    let cols = keys.reshape(&[1, 1, 1, -1])?;
    let behind = rows.subtract(&cols)?;
    let recent = behind.lt(Array::from_int(ring.rotating()))?;
    let kept = cols.lt(Array::from_int(ring.keep))?;
    Ok(cols
        .ge(Array::from_int(0))?
        .logical_and(&behind.ge(Array::from_int(0))?)?
        .logical_and(&recent.logical_or(&kept)?)?)
}

/// A call of `new.dim(2)` tokens at positions from `filled` on: the keys it sees (the ring's,
/// then its own) with their positions, and the ring with the call's tokens that it keeps written
/// (the ring holds `min(size, filled + T)` slots at least).
pub(crate) fn extend(
    ring: &Array,
    new: &Array,
    filled: i32,
    shape: Ring,
) -> Result<(Array, Array, Array)> {
    let count = new.dim(2);
    let seen = ops::concatenate(&[ring, new], 2)?;
    let own = Array::arange::<_, i32>(filled, filled + count, None)?;
    let held = slot_positions(filled, ring.dim(2), shape);
    let positions = ops::concatenate(&[held, own], 0)?;
    // The call's first positions that are kept for good, and its last that still rotate.
    let end = filled + count;
    let kept: Vec<i32> = (filled..end)
        .filter(|&position| position < shape.keep || end - position <= shape.rotating())
        .collect();
    let slots: Vec<i32> = kept.iter().map(|&position| shape.slot(position)).collect();
    let picked: Vec<i32> = kept.iter().map(|&position| position - filled).collect();
    let len = kept.len() as i32;
    let dims = new.shape();
    let slots = Array::from_slice(&slots, &[1, 1, len, 1]);
    let slots = ops::broadcast_to(&slots, &[dims[0], dims[1], len, dims[3]])?;
    let picked = new.take_axis(Array::from_slice(&picked, &[len]), 2)?;
    let written = ring.put_along_axis(&slots, picked, 2)?;
    Ok((seen, positions, written))
}

/// A traced step's one token at position `position` (an int32 scalar array): the ring with the
/// token written in its slot, which is also every key the token sees, and the slots' positions
/// (the ring holds `min(size, position + 1)` slots at least).
pub(crate) fn extend_traced(
    ring: &Array,
    new: &Array,
    position: &Array,
    shape: Ring,
) -> Result<(Array, Array)> {
    let keep = Array::from_int(shape.keep);
    let rotating = Array::from_int(shape.rotating());
    let kept = position.lt(&keep)?;
    let rotated = position.subtract(&keep)?.remainder(&rotating)?.add(&keep)?;
    let slot = ops::select(&kept, position, &rotated)?;
    let written = nn::slice_update_dynamic(ring, new, &slot, 2)?;
    // A kept slot `s` holds position `s` once the sequence reached it; a rotating slot the last
    // position up to `position` that goes to it: `position - d` for `d = (position - s) mod
    // (size - keep)`, taken non-negative, which is a position of the slot once at least `s`.
    let slots = Array::arange::<_, i32>(None, ring.dim(2), None)?;
    let behind = position
        .subtract(&slots)?
        .remainder(&rotating)?
        .add(&rotating)?
        .remainder(&rotating)?;
    let last = position.subtract(&behind)?;
    let kept_slot = slots.lt(&keep)?;
    let positions = ops::select(&kept_slot, &slots, &last)?;
    let held = ops::select(&kept_slot, &position.ge(&slots)?, &last.ge(&slots)?)?;
    let positions = ops::select(&held, &positions, Array::from_int(-1))?;
    Ok((written, positions))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::ops::indexing::IndexOp;

    fn held(filled: i32, slots: i32, size: i32, keep: i32) -> Vec<i32> {
        slot_positions(filled, slots, Ring { size, keep })
            .as_slice::<i32>()
            .to_vec()
    }

    #[test]
    fn slots_hold_the_last_positions_that_go_to_them() {
        assert_eq!(held(0, 4, 4, 0), [-1, -1, -1, -1]);
        assert_eq!(held(2, 4, 4, 0), [0, 1, -1, -1]);
        assert_eq!(held(7, 4, 4, 0), [4, 5, 6, 3]);
        // A ring not yet grown to its size holds the positions so far in their own slots.
        assert_eq!(held(3, 4, 8, 0), [0, 1, 2, -1]);
        assert_eq!(
            (
                slots_for(3, Ring::window(8), 2),
                slots_for(30, Ring::window(8), 2)
            ),
            (4, 8)
        );
        // The first `keep` positions stay; the others rotate through the remaining slots.
        assert_eq!(held(1, 5, 5, 2), [0, -1, -1, -1, -1]);
        assert_eq!(held(5, 5, 5, 2), [0, 1, 2, 3, 4]);
        assert_eq!(held(6, 5, 5, 2), [0, 1, 5, 3, 4]);
        assert_eq!(held(10, 5, 5, 2), [0, 1, 8, 9, 7]);
        for (size, keep) in [(4, 0), (5, 2), (4, 3)] {
            let traced = |position: i32| -> Vec<i32> {
                let ring = ops::zeros::<f32>(&[1, 1, size, 1]).unwrap();
                let new = ops::ones::<f32>(&[1, 1, 1, 1]).unwrap();
                let at = Array::from_int(position);
                let (_, positions) = extend_traced(&ring, &new, &at, Ring { size, keep }).unwrap();
                positions.as_slice::<i32>().to_vec()
            };
            // A traced step at position p sees what the ring holds after p + 1 positions.
            for position in [0, 1, 3, 6, 9, 13] {
                assert_eq!(
                    traced(position),
                    held(position + 1, size, size, keep),
                    "ring of {size} keeping {keep}, position {position}"
                );
            }
        }
    }

    /// A bounded cache's attention, fed in chunks and token by token (eagerly, and as a traced
    /// step sees it: its buffers and position as inputs), equals full attention over every key
    /// masked to the same visible set: the first `keep` positions and the last `size - keep` up
    /// to the query; and the layer holds `size` slots however long the sequence.
    #[test]
    fn a_bounded_cache_attends_as_full_attention_over_its_visible_set() -> Result<()> {
        use super::super::cache::KvCache;
        use crate::model::Context;
        use crate::nn::AttentionMask;
        use mlx_rs::random;
        let (size, keep, total) = (6, 2, 16);
        let draw =
            |seed| random::normal::<f32>(&[1, 2, total, 4][..], None, None, &random::key(seed)?);
        let (q, k, v) = (draw(1)?, draw(2)?, draw(3)?);
        let mut visible = Vec::new();
        for query in 0..total {
            for key in 0..total {
                visible.push(key <= query && (key < keep || query - key < size - keep));
            }
        }
        let visible = Array::from_slice(&visible, &[1, 1, total, total]);
        let reference = nn::attention(&q, &k, &v, AttentionMask::Array(&visible))?;
        let ring = Ring { size, keep };
        let mut ctx = Context::with_cache(KvCache::bounded(ring));
        // Calls of these many tokens: a prompt within the ring, single tokens (traced on odd
        // positions), a chunk after the ring went round, single tokens again.
        let calls = [4, 1, 1, 1, 1, 1, 3, 1, 1, 1, 1];
        let mut from = 0;
        for count in calls {
            let part = |x: &Array| x.index((.., .., from..from + count, ..));
            let traced = count == 1 && from % 2 == 1;
            let out = if traced {
                let cache = ctx.cache_mut().expect("a generation context");
                cache.reserve(from + 1)?;
                let buffers = cache.take_buffers();
                let inside = KvCache::traced(
                    buffers,
                    &Array::from_int(from),
                    cache.rings(),
                    cache.bound(),
                )?;
                let mut step = Context::with_cache(inside);
                let out = step.attend(0, &part(&q), &part(&k), &part(&v))?;
                let written = step.cache_mut().expect("a traced cache").take_buffers();
                ctx.cache_mut()
                    .expect("a generation context")
                    .put_buffers(written, 1);
                out
            } else {
                let out = ctx.attend(0, &part(&q), &part(&k), &part(&v))?;
                ctx.advance(count);
                out
            };
            let gap = out
                .subtract(part(&reference))?
                .abs()?
                .max(None)?
                .item_exact::<f32>();
            assert!(
                gap < 1e-5,
                "{count} tokens from {from} (traced: {traced}): off by {gap}"
            );
            from += count;
        }
        assert_eq!(from, total);
        assert_eq!(ctx.cached_slots(), [size]);
        Ok(())
    }
}
