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
//! computed. A decoding product of one layer, or a group of two (dense or quantized, not
//! adapted), is remembered too, and a product with a residual sum (attention's output
//! projection, `r + o(a)`): an MLP's down projection whose input is a gated pair of one group's
//! outputs, or one activated layer's output, over a remembered norm's output is the whole block
//! in one kernel ([`cuda::MlpBlock`]), and where that norm's input is a remembered projection's
//! sum that the down projection adds to, the projection is in the kernel too; the norm, the
//! group and the projection are never computed.
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

/// Outputs remembered per thread (a layer's two norms, its query and key rotations, a fused
/// query-key-value product, its output projection, its gate and up products, with room).
const KEPT: usize = 10;

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
    /// Output `index` of one launch of the products of `x` by `weights` (and `biases`).
    Product {
        x: Array,
        weights: Vec<HeldWeight>,
        biases: Option<Vec<Array>>,
        index: usize,
    },
    /// `residual + x @ weight.T (+ bias)`.
    Projected(Projection),
}

thread_local! {
    static MADE: RefCell<VecDeque<(usize, Array, Made)>> = const { RefCell::new(VecDeque::new()) };
}

/// MLX's identity of the array `a` is a handle to.
fn id(a: &Array) -> usize {
    // SAFETY: `a` is a live handle for the call, which only reads it.
    unsafe { mlx_sys::lmx_array_id(a.as_ptr()) }
}

/// Whether `a` and `b` are handles to one array.
pub(super) fn same_array(a: &Array, b: &Array) -> bool {
    id(a) == id(b)
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
/// remembered for [`normed`], [`normed_gated`] and [`normed_product`] where no gradient is
/// taken on CUDA.
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

/// The outputs of one decoding product launch over `x` by `weights` (and `biases`), where they
/// are what [`normed_gated`] and [`normed_product`] read: a pair without biases (a gate and an up
/// projection), or one layer (a plain MLP's first), so that a layer's query, key and value
/// products take no room and no host time here.
pub(super) fn remember_products(
    outputs: &[Array],
    x: &Array,
    weights: &[Weight],
    biases: Option<&[&Array]>,
) {
    if !matches!((weights.len(), biases), (1, _) | (2, None)) {
        return;
    }
    let weights: Vec<HeldWeight> = weights.iter().map(Weight::held).collect();
    let biases: Option<Vec<Array>> = biases.map(|b| b.iter().map(|&b| b.clone()).collect());
    for (index, output) in outputs.iter().enumerate() {
        let made = Made::Product {
            x: x.clone(),
            weights: weights.clone(),
            biases: biases.clone(),
            index,
        };
        remember(output, made);
    }
}

/// The sum `output = residual + x @ weight.T (+ bias)` of one decoding launch, for
/// [`projected`].
pub(super) fn remember_projected(
    output: &Array,
    x: &Array,
    (weight, bias): (Weight, Option<&Array>),
    residual: &Array,
) {
    let made = Made::Projected(Projection {
        x: x.clone(),
        weight: weight.held(),
        bias: bias.cloned(),
        residual: residual.clone(),
    });
    remember(output, made);
}

/// Output `want` of a remembered product launch of `count` weights: its input, weights and
/// biases.
fn product(output: &Array, want: usize, count: usize) -> Option<ProductMade> {
    made(output, |made| match made {
        Made::Product {
            x,
            weights,
            biases,
            index,
        } if *index == want && weights.len() == count => {
            Some((x.clone(), weights.clone(), biases.clone()))
        }
        _ => None,
    })
}

/// A remembered product's input, weights and biases.
type ProductMade = (Array, Vec<HeldWeight>, Option<Vec<Array>>);

/// A gated MLP's input before its norm and products: where `gate` and `up` are the two outputs
/// of one remembered product launch without biases (in that order) over a remembered norm's
/// output, that norm's input and the norm, and the gate and up weights.
pub(super) fn normed_gated(gate: &Array, up: &Array) -> Option<NormedGated> {
    let (x, weights, None) = product(gate, 0, 2)? else {
        return None;
    };
    let (x_up, weights_up, _) = product(up, 1, 2)?;
    let same = id(&x) == id(&x_up)
        && weights
            .iter()
            .zip(&weights_up)
            .all(|(a, b)| id(a.weight().values()) == id(b.weight().values()));
    if !same {
        return None;
    }
    let (input, norm) = normed(&x)?;
    let [gate, up]: [HeldWeight; 2] = weights.try_into().ok()?;
    Some(NormedGated {
        input,
        norm,
        gate,
        up,
    })
}

/// What [`normed_gated`] finds: `gate(n)` and `up(n)` of `n = norm(input)`.
pub(super) struct NormedGated {
    pub input: Array,
    pub norm: RowNorm,
    pub gate: HeldWeight,
    pub up: HeldWeight,
}

/// A plain MLP's input before its norm and first product: where `x` is the output of a
/// remembered one-layer product launch over a remembered norm's output, that norm's input and the
/// norm, and the layer's weight and bias.
pub(super) fn normed_product(x: &Array) -> Option<NormedProduct> {
    let (normed_x, weights, biases) = product(x, 0, 1)?;
    let (input, norm) = normed(&normed_x)?;
    let [weight]: [HeldWeight; 1] = weights.try_into().ok()?;
    let bias = biases.and_then(|b| b.into_iter().next());
    Some(NormedProduct {
        input,
        norm,
        weight,
        bias,
    })
}

/// What [`normed_product`] finds: `layer(n) (+ bias)` of `n = norm(input)`.
pub(super) struct NormedProduct {
    pub input: Array,
    pub norm: RowNorm,
    pub weight: HeldWeight,
    pub bias: Option<Array>,
}

/// How `h` was made, where it is a remembered projection's sum `residual + x @ weight.T (+
/// bias)`: an MLP block's kernel may compute it itself.
pub(super) fn projected(h: &Array) -> Option<Projection> {
    made(h, |made| match made {
        Made::Projected(projection) => Some(projection.clone()),
        _ => None,
    })
}

/// What [`projected`] finds: `residual + x @ weight.T (+ bias)`.
#[derive(Clone)]
pub(super) struct Projection {
    pub x: Array,
    pub weight: HeldWeight,
    pub bias: Option<Array>,
    pub residual: Array,
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
