//! Operations whose output decoding's next kernel computes from their input as it reads it.
//!
//! A decoder layer rotates its queries (RoPE) before attention, and on a GPU the rotation is an
//! operation of its own, whose host time a decoded token pays (docs/benchmarks.md, "Third
//! session of 2026-11-28"). Where no gradient is taken on CUDA, a rotation of one position over
//! a few rows is remembered here with its input: attention whose query is that rotation's output
//! rotates the query itself as it reads it ([`cuda::Rotation`]), and the rotation's own
//! output, which no one else reads, is never computed (MLX computes only what an evaluated array
//! needs; a compiled decode step records only that). The keys' rotation is remembered too: the
//! same kernel rotates the token's key as it writes it into the cache. Where an output is read
//! elsewhere too, it is computed there as before, and the kernel's numbers are the same.
//!
//! In the same way a one-row norm (RMS or layer) is remembered: a decoding product over its output
//! normalises the norm's input as it reads it ([`cuda::normed_matvec`]), and the norm is never
//! computed. A decoding product group of two layers (dense or quantized, not adapted) is
//! remembered too: a gated MLP's down projection whose gate and up inputs are the two outputs of
//! one group over a remembered RMS norm's output is the whole block in one kernel
//! ([`cuda::GatedMlp`]), and the norm and the group are never computed.
//!
//! Arrays are matched by identity (MLX's array id, the same for every handle to one array), and
//! an entry holds a handle to the operation's output, so that no other array takes its id while
//! the entry lives. Only the last [`KEPT`] operations of the thread are kept: a kernel reads the
//! output of an operation made just before it.

use super::custom_vjp::gradient_free;
use crate::cuda::{self, HeldWeight, NormKind, Rotation, RowNorm, Weight};
use mlx_rs::Array;
use std::cell::RefCell;
use std::collections::VecDeque;

/// Outputs remembered per thread (a layer's two norms, its query and key rotations, its gate and
/// up products, with room).
const KEPT: usize = 8;

/// What made a remembered output.
enum Made {
    /// A rotation of one position's `input` (`[B, heads, 1, head_dim]`) at `offset` by `rates`
    /// (each pair's angle per position, float32).
    Rope {
        input: Array,
        offset: Array,
        rates: Array,
    },
    /// `norm` of one row `input`.
    Norm { input: Array, norm: RowNorm },
    /// Output `index` of one launch of the products of `x` by `weights` (no biases).
    Product {
        x: Array,
        weights: Vec<HeldWeight>,
        index: usize,
    },
}

thread_local! {
    static MADE: RefCell<VecDeque<(usize, Array, Made)>> = const { RefCell::new(VecDeque::new()) };
}

/// MLX's identity of the array `a` is a handle to.
fn id(a: &Array) -> usize {
    // SAFETY: `a` is a live handle for the call, which only reads it.
    unsafe { mlx_sys::lmx_array_id(a.as_ptr()) }
}

fn remember(output: &Array, made: Made) {
    MADE.with(|kept| {
        let mut kept = kept.borrow_mut();
        if kept.len() == KEPT {
            kept.pop_front();
        }
        kept.push_back((id(output), output.clone(), made));
    });
}

/// What made `output`, where it is remembered, through `read`.
fn made<T>(output: &Array, read: impl FnOnce(&Made) -> Option<T>) -> Option<T> {
    let key = id(output);
    MADE.with(|kept| {
        let kept = kept.borrow();
        let (_, _, made) = kept.iter().rev().find(|(id, _, _)| *id == key)?;
        read(made)
    })
}

/// The rotation `output` of one position's `input` (`[B, heads, 1, head_dim]`) at `offset` by
/// `rates`, made by lmx's CUDA kernel, remembered for [`rotation`] where no gradient is
/// taken, over at most a decoding product's rows.
pub(super) fn remember_rope(output: &Array, input: &Array, offset: &Array, rates: &Array) {
    let one_position = input.ndim() == 4 && input.shape()[2] == 1;
    if !one_position || input.shape()[0] > cuda::MAX_ROWS || !gradient_free() {
        return;
    }
    let made = Made::Rope {
        input: input.clone(),
        offset: offset.clone(),
        rates: rates.clone(),
    };
    remember(output, made);
}

/// The query or key before its rotation, where `x` is a remembered rotation's output: attention
/// may rotate it as it reads it.
pub(super) fn rotation(x: &Array) -> Option<Rotation> {
    made(x, |made| match made {
        Made::Rope {
            input,
            offset,
            rates,
        } => Some(Rotation {
            input: input.clone(),
            offset: offset.clone(),
            rates: rates.clone(),
        }),
        _ => None,
    })
}

/// The norm `output` of one row `input` (of `kind`, scaled by `weight`, shifted by `bias`),
/// remembered for [`normed`] and [`normed_gated`] where no gradient is taken on CUDA.
pub(super) fn remember_norm(
    output: &Array,
    input: &Array,
    (kind, weight, bias): (NormKind, &Array, Option<&Array>),
    eps: f32,
) {
    let one_row = input
        .shape()
        .last()
        .is_some_and(|&d| input.size() as i32 == d);
    if !one_row || !gradient_free() || !cuda::available() {
        return;
    }
    let norm = RowNorm {
        kind,
        weight: weight.clone(),
        bias: bias.cloned(),
        eps,
    };
    let made = Made::Norm {
        input: input.clone(),
        norm,
    };
    remember(output, made);
}

/// The input of the remembered norm whose output is `x`, and the norm: a product may normalise
/// the input as it reads it.
pub(super) fn normed(x: &Array) -> Option<(Array, RowNorm)> {
    made(x, |made| match made {
        Made::Norm { input, norm } => Some((input.clone(), norm.clone())),
        _ => None,
    })
}

/// The outputs of one decoding product launch over `x` by `weights` (layers without biases),
/// where they are a pair: the only group [`normed_gated`] reads (a gate and an up projection),
/// so that a layer's query, key and value products take no room and no host time here.
pub(super) fn remember_products(outputs: &[Array], x: &Array, weights: &[Weight]) {
    if weights.len() != 2 {
        return;
    }
    let weights: Vec<HeldWeight> = weights.iter().map(Weight::held).collect();
    for (index, output) in outputs.iter().enumerate() {
        let made = Made::Product {
            x: x.clone(),
            weights: weights.clone(),
            index,
        };
        remember(output, made);
    }
}

/// A gated MLP's input before its norm and products: where `gate` and `up` are the two outputs
/// of one remembered product launch (in that order) over a remembered norm's output, that norm's
/// input, weight and epsilon and the gate and up weights.
pub(super) fn normed_gated(gate: &Array, up: &Array) -> Option<NormedGated> {
    let product = |output: &Array, want: usize| {
        made(output, |made| match made {
            Made::Product { x, weights, index } if *index == want && weights.len() == 2 => {
                Some((x.clone(), weights.clone()))
            }
            _ => None,
        })
    };
    let (x, weights) = product(gate, 0)?;
    let (x_up, weights_up) = product(up, 1)?;
    let same = id(&x) == id(&x_up)
        && weights
            .iter()
            .zip(&weights_up)
            .all(|(a, b)| id(a.weight().values()) == id(b.weight().values()));
    if !same {
        return None;
    }
    let (input, norm) = normed(&x).filter(|(_, norm)| norm.kind == NormKind::Rms)?;
    let [gate, up]: [HeldWeight; 2] = weights.try_into().ok()?;
    Some(NormedGated {
        input,
        norm: norm.weight,
        eps: norm.eps,
        gate,
        up,
    })
}

/// What [`normed_gated`] finds: `gate(n)` and `up(n)` of `n = rms_norm(input) * norm`.
pub(super) struct NormedGated {
    pub input: Array,
    pub norm: Array,
    pub eps: f32,
    pub gate: HeldWeight,
    pub up: HeldWeight,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::without_gradients;
    use crate::test_arrays::normal;
    use mlx_rs::Dtype;

    /// Every handle to one array has its id; another array has another, even of equal values
    /// or made from it.
    #[test]
    fn ids_follow_arrays_not_handles() {
        let a = normal(&[4], Dtype::Float32);
        let copy = a.clone();
        assert_eq!(id(&a), id(&copy));
        let equal = Array::from_slice(&[1.0f32], &[1]);
        let other = Array::from_slice(&[1.0f32], &[1]);
        assert_ne!(id(&equal), id(&other));
        assert_ne!(id(&a), id(&a.multiply(&equal).unwrap()));
    }

    /// Where no gradient is taken on CUDA, decode attention of a rotated query with the token's
    /// rotated key and its value (one query per row: 1 and 2 rows, 8 query heads over 2 and 8 key
    /// heads, heads of 64 and 128, bfloat16 and float32, the slots in one block and split over
    /// several) rotates both as it reads them and writes the key and value into the buffers at
    /// the query's slot: its output and buffers equal, to rounding, the rotations computed by
    /// their own kernel, written by a dynamic-offset update, and MLX's attention in float32 under
    /// the mask; off CUDA nothing is remembered.
    #[test]
    fn decode_attention_rotates_and_writes_the_token() {
        let cuda = crate::cuda::available();
        let f32 = |x: &Array| x.as_dtype(Dtype::Float32).unwrap();
        let largest = |a: &Array, b: &Array| {
            let err = f32(a).subtract(f32(b)).unwrap().abs().unwrap();
            err.max(None).unwrap().item_cast::<f32>()
        };
        for (dtype, tolerance) in [(Dtype::Bfloat16, 1e-2), (Dtype::Float32, 1e-5)] {
            for (rows, kv_heads, head_dim, capacity) in
                [(1, 2, 64, 48), (2, 8, 128, 40), (1, 2, 64, 2100)]
            {
                let q = normal(&[rows, 8, 1, head_dim], dtype);
                let k = normal(&[rows, kv_heads, 1, head_dim], dtype);
                let v = normal(&[rows, kv_heads, 1, head_dim], dtype);
                let keys = normal(&[rows, kv_heads, capacity, head_dim], dtype);
                let values = normal(&[rows, kv_heads, capacity, head_dim], dtype);
                let position = Array::from_int(capacity - 3);
                let rotate = |x: &Array| {
                    without_gradients(|| crate::nn::rope(x, head_dim, 10000.0, &position).unwrap())
                };
                let (q_rotated, k_rotated) = (rotate(&q), rotate(&k));
                assert_eq!(rotation(&q_rotated).is_some(), cuda);
                assert_eq!(rotation(&k_rotated).is_some(), cuda);
                // The reference's operands, evaluated before the kernel writes the buffers.
                let one = Array::from_f32(1.0).as_dtype(dtype).unwrap();
                let copy = |x: &Array| x.multiply(&one).unwrap();
                let (q_plain, k_plain) = (copy(&q_rotated), copy(&k_rotated));
                let (keys_before, values_before) = (copy(&keys), copy(&values));
                mlx_rs::transforms::eval([&q_plain, &k_plain, &keys_before, &values_before])
                    .unwrap();
                let update = |buffer: &Array, x: &Array| {
                    crate::nn::slice_update_dynamic(buffer, x, &position, 2).unwrap()
                };
                let keys_after = update(&keys_before, &k_plain);
                let values_after = update(&values_before, &v);
                let mask = || -> crate::error::Result<Array> {
                    let slots = mlx_rs::ops::arange::<_, i32>(None, capacity, None)?;
                    Ok(slots.le(&position)?.reshape(&[1, 1, 1, capacity])?)
                };
                let expected = crate::nn::attention(
                    &f32(&q_plain),
                    &f32(&keys_after),
                    &f32(&values_after),
                    crate::nn::AttentionMask::Array(&mask().unwrap()),
                )
                .unwrap();
                let slots = crate::nn::DecodeSlots {
                    position: position.clone(),
                    starts: None,
                };
                let (out, keys, values) = crate::nn::decode_attention(
                    &q_rotated,
                    (&k_rotated, &v),
                    (keys, values),
                    &slots,
                    mask,
                )
                .unwrap();
                let case = format!(
                    "{dtype:?} rows {rows} kv heads {kv_heads} head {head_dim} capacity {capacity}"
                );
                let err = largest(&out, &expected);
                assert!(err <= tolerance, "{case}: output off by {err}");
                let err = largest(&keys, &keys_after);
                assert!(err <= tolerance, "{case}: keys off by {err}");
                assert_eq!(largest(&values, &values_after), 0.0, "{case}: values");
            }
        }
    }
}
