//! The rotating key-value buffers of a sliding-window attention layer, as mlx-lm's
//! `RotatingKVCache` keeps them: a ring of `window` slots, position `p` in slot `p mod window`,
//! so that the layer's memory is bounded by its window however long the sequence. Until the
//! sequence reaches the window the ring is shorter, grown in blocks as a plain buffer is (the
//! positions so far are then in the slots of their own number), so that a short sequence of a
//! model with a long window neither holds nor attends over the whole window.
//!
//! A query at position `q` of a layer with window `w` sees the keys at `q - w + 1 ..= q`: when
//! the ring holds the `w` positions before a call, it holds every key an earlier position of
//! the call needs. A call of `T` tokens sees the ring's keys followed by its own (`w + T` keys,
//! their positions given beside them for the mask); the last `min(T, w)` are then written to
//! their slots. A traced step (one token, its position an array) writes its token first and
//! sees the ring alone. Slots not yet written carry position -1, which the mask hides.

use crate::error::Result;
use crate::nn;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, Array};

/// The positions the first `slots` slots of a ring hold once positions `0 .. filled` went
/// through it: slot `s` holds the last of them congruent to `s` modulo `window`, or -1 when none
/// is.
fn slot_positions(filled: i32, slots: i32, window: i32) -> Array {
    let positions: Vec<i32> = (0..slots)
        .map(|slot| {
            let last = filled - 1;
            if last < slot {
                -1
            } else {
                last - (last - slot) % window
            }
        })
        .collect();
    Array::from_slice(&positions, &[slots])
}

/// Slots a ring of `window` needs to hold `filled` positions: `filled` rounded up to a block of
/// `step`, at most `window`.
pub(crate) fn slots_for(filled: i32, window: i32, step: i32) -> i32 {
    ((filled + step - 1) / step * step).min(window)
}

/// A call of `new.dim(2)` tokens at positions from `filled` on: the keys it sees (the ring's,
/// then its own) with their positions, and the ring with the call's last `window` tokens written
/// (the ring holds `min(window, filled + T)` slots at least).
pub(crate) fn extend(
    ring: &Array,
    new: &Array,
    filled: i32,
    window: i32,
) -> Result<(Array, Array, Array)> {
    let count = new.dim(2);
    let seen = ops::concatenate(&[ring, new], 2)?;
    let own = Array::arange::<_, i32>(filled, filled + count, None)?;
    let held = slot_positions(filled, ring.dim(2), window);
    let positions = ops::concatenate(&[held, own], 0)?;
    let kept = count.min(window);
    let slots: Vec<i32> = (filled + count - kept..filled + count)
        .map(|position| position % window)
        .collect();
    let shape = new.shape();
    let slots = Array::from_slice(&slots, &[1, 1, kept, 1]);
    let slots = ops::broadcast_to(&slots, &[shape[0], shape[1], kept, shape[3]])?;
    let written = ring.put_along_axis(&slots, new.index((.., .., count - kept.., ..)), 2)?;
    Ok((seen, positions, written))
}

/// A traced step's one token at position `position` (an int32 scalar array): the ring with the
/// token written in its slot, which is also every key the token sees, and the slots' positions
/// (the ring holds `min(window, position + 1)` slots at least).
pub(crate) fn extend_traced(
    ring: &Array,
    new: &Array,
    position: &Array,
    window: i32,
) -> Result<(Array, Array)> {
    let size = Array::from_int(window);
    let slot = position.remainder(&size)?;
    let written = nn::slice_update_dynamic(ring, new, &slot, 2)?;
    // Slot `s` holds the last position up to `position` congruent to it: `position - d` for
    // `d = (position - s) mod window`, taken non-negative.
    let slots = Array::arange::<_, i32>(None, ring.dim(2), None)?;
    let behind = position
        .subtract(&slots)?
        .remainder(&size)?
        .add(&size)?
        .remainder(&size)?;
    let positions = position.subtract(&behind)?;
    // A slot whose position would be negative holds nothing yet.
    let positions = ops::maximum(&positions, Array::from_int(-1))?;
    Ok((written, positions))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_hold_the_last_positions_congruent_to_them() {
        assert_eq!(slot_positions(0, 4, 4).as_slice::<i32>(), [-1, -1, -1, -1]);
        assert_eq!(slot_positions(2, 4, 4).as_slice::<i32>(), [0, 1, -1, -1]);
        assert_eq!(slot_positions(7, 4, 4).as_slice::<i32>(), [4, 5, 6, 3]);
        // A ring not yet grown to its window holds the positions so far in their own slots.
        assert_eq!(slot_positions(3, 4, 8).as_slice::<i32>(), [0, 1, 2, -1]);
        assert_eq!((slots_for(3, 8, 2), slots_for(30, 8, 2)), (4, 8));
        let traced = |position: i32| -> Vec<i32> {
            let ring = ops::zeros::<f32>(&[1, 1, 4, 1]).unwrap();
            let new = ops::ones::<f32>(&[1, 1, 1, 1]).unwrap();
            let at = Array::from_int(position);
            let (_, positions) = extend_traced(&ring, &new, &at, 4).unwrap();
            positions.as_slice::<i32>().to_vec()
        };
        // A traced step at position p sees what the ring holds after p + 1 positions.
        assert_eq!(traced(1), slot_positions(2, 4, 4).as_slice::<i32>());
        assert_eq!(traced(6), slot_positions(7, 4, 4).as_slice::<i32>());
        assert_eq!(traced(9), slot_positions(10, 4, 4).as_slice::<i32>());
    }
}
