//! Recurrences whose state a generation cache carries: Mamba-2's selective state space (SSD,
//! Dao and Gu, 2024), the short causal convolution in front of it, and the gated delta rule
//! (Gated DeltaNet, Yang et al., 2024).
//!
//! Each is written once as a recurrence and computed in two forms: over a sequence, the chunked
//! parallel form (quadratic inside chunks of `chunk` positions, a linear recurrence across them),
//! which is what training and a prompt's prefill run; one position at a time, the step form,
//! which is what decoding runs. Both start from a state (zeros when none is held) and give the
//! state after their last position, so a generation cache can carry it from one call to the next
//! as the KV cache carries keys and values ([`crate::generate::cache`]'s recurrent slots).
//!
//! The state space recurrence, per head `h` (heads share `B` and `C` in groups):
//! `S_t = exp(dt_t a_h) S_{t-1} + dt_t x_t ⊗ B_t` (`S: [head_dim, state]`), `y_t = S_t C_t`.

use super::custom_vjp::{self, WithGradient};
use crate::error::{Error, Result};
use crate::model::Context;
use mlx_rs::ops::indexing::{Ellipsis, IndexOp};
use mlx_rs::{ops, Array, Dtype};

/// `x`'s sizes as `[d0, d1, ...]`, checked to have `rank` axes.
fn dims<const N: usize>(x: &Array, what: &str) -> Result<[i32; N]> {
    x.shape().try_into().map_err(|_| {
        Error::Layout(format!(
            "{what} must have {N} axes, not shape {:?}",
            x.shape()
        ))
    })
}

/// The checked sizes of an SSD call: batch, positions, heads, head width, groups, state width.
struct SsdDims {
    b: i32,
    t: i32,
    h: i32,
    p: i32,
    g: i32,
    n: i32,
}

fn ssd_dims(x: &Array, dt: &Array, a: &Array, b: &Array, c: &Array) -> Result<SsdDims> {
    let [bs, t, h, p] = dims(x, "ssd's x")?;
    let [g_b, n] = {
        let [b0, t0, g, n] = dims(b, "ssd's b")?;
        if [b0, t0] != [bs, t] {
            return Err(Error::Layout(format!(
                "ssd's b {:?} does not match x {:?}",
                b.shape(),
                x.shape()
            )));
        }
        [g, n]
    };
    let ok = dt.shape() == [bs, t, h]
        && a.shape() == [h]
        && c.shape() == b.shape()
        && g_b > 0
        && h % g_b == 0;
    if !ok {
        return Err(Error::Layout(format!(
            "ssd needs x [B, T, H, P], dt [B, T, H], a [H], b and c [B, T, G, N] with G dividing H; \
             got x {:?}, dt {:?}, a {:?}, b {:?}, c {:?}",
            x.shape(),
            dt.shape(),
            a.shape(),
            b.shape(),
            c.shape()
        )));
    }
    Ok(SsdDims {
        b: bs,
        t,
        h,
        p,
        g: g_b,
        n,
    })
}

fn f32(x: &Array) -> Result<Array> {
    Ok(x.as_dtype(Dtype::Float32)?)
}

/// The state space recurrence over a whole sequence in its chunked form: `y [B, T, H, P]` in
/// `x`'s dtype and the state after the last position, `[B, H, P, N]` in float32.
///
/// `x [B, T, H, P]`, `dt [B, T, H]` (positive step sizes), `a [H]` (negative decay rates),
/// `b` and `c [B, T, G, N]` shared by groups of `H / G` heads; `state [B, H, P, N]` is the state
/// before the first position (zeros when `None`). `T` need not divide into chunks: the last one
/// is padded with zero steps, which leave the state as it is.
pub fn ssd_chunked(
    x: &Array,
    dt: &Array,
    a: &Array,
    b: &Array,
    c: &Array,
    chunk: i32,
    state: Option<&Array>,
) -> Result<(Array, Array)> {
    let SsdDims {
        b: bs,
        t,
        h,
        p,
        g,
        n,
    } = ssd_dims(x, dt, a, b, c)?;
    if chunk < 1 {
        return Err(Error::Layout(format!(
            "ssd's chunk must be positive, not {chunk}"
        )));
    }
    let r = h / g;
    let l = chunk.min(t.max(1));
    let nc = (t + l - 1) / l;
    let pad = nc * l - t;
    let padded = |x: Array| -> Result<Array> {
        if pad == 0 {
            return Ok(x);
        }
        let mut width = vec![(0, 0); x.ndim()];
        width[1] = (0, pad);
        Ok(ops::pad(&x, width.as_slice(), None, None)?)
    };
    let dt = padded(f32(dt)?)?;
    // x dt: [B, nc, L, H, P]; dt a: [B, nc, L, H]; B and C: [B, nc, L, G, N].
    let xdt = padded(f32(x)?)?.multiply(dt.expand_dims(-1)?)?;
    let xdt = xdt.reshape(&[bs, nc, l, h, p])?;
    let adt = dt.multiply(f32(a)?)?.reshape(&[bs, nc, l, h])?;
    let bm = padded(f32(b)?)?.reshape(&[bs, nc, l, g, n])?;
    let cm = padded(f32(c)?)?.reshape(&[bs, nc, l, g, n])?;
    // Cumulative decay inside each chunk, per head: [B, nc, H, L].
    let acs = ops::cumsum(adt.transpose_axes(&[0, 1, 3, 2])?, -1, None, None)?;

    // 1. Within chunks: y_l = sum_{s <= l} exp(acs_l - acs_s) (C_l . B_s) x_s dt_s.
    let cg = cm.transpose_axes(&[0, 1, 3, 2, 4])?; // [B, nc, G, L, N]
    let bg = bm.transpose_axes(&[0, 1, 3, 2, 4])?; // [B, nc, G, L, N]
    let scores = cg.matmul(bg.swap_axes(-1, -2)?)?; // [B, nc, G, L, L]
    let gap = acs.expand_dims(-1)?.subtract(acs.expand_dims(-2)?)?; // [B, nc, H, L, L]
                                                                    // Masked before the exponential: above the diagonal the gap is positive and could overflow,
                                                                    // and a masked infinity would give NaN gradients.
    let causal = ops::tril(Array::ones::<bool>(&[l, l])?, 0)?;
    let neg_inf = Array::from_f32(f32::NEG_INFINITY);
    let decay = ops::exp(ops::select(&causal, &gap, &neg_inf)?)?;
    let weights = scores
        .reshape(&[bs, nc, g, 1, l, l])?
        .multiply(decay.reshape(&[bs, nc, g, r, l, l])?)?
        .reshape(&[bs, nc, h, l, l])?;
    let xh = xdt.transpose_axes(&[0, 1, 3, 2, 4])?; // [B, nc, H, L, P]
    let y_diag = weights.matmul(&xh)?; // [B, nc, H, L, P]

    // 2. Each chunk's contribution to the state at its end: sum_l exp(acs_last - acs_l) x_l dt_l ⊗ B_l.
    let last = acs.index((.., .., .., l - 1..l)); // [B, nc, H, 1]
    let to_end = ops::exp(last.subtract(&acs)?)?; // [B, nc, H, L]
    let xs = xh
        .multiply(to_end.expand_dims(-1)?)?
        .swap_axes(-1, -2)? // [B, nc, H, P, L]
        .reshape(&[bs, nc, g, r * p, l])?;
    let chunk_states = xs.matmul(&bg)?.reshape(&[bs, nc, h, p * n])?; // [B, nc, H, P*N]

    // 3. Across chunks: the state at each chunk's start, and after the last one. A linear
    // recurrence over nc + 1 states, written as one matrix of decays between chunk boundaries.
    let initial = match state {
        Some(s) => f32(s)?.reshape(&[bs, 1, h, p * n])?,
        None => ops::zeros::<f32>(&[bs, 1, h, p * n])?,
    };
    let states = ops::concatenate(&[initial, chunk_states], 1)?; // [B, nc+1, H, P*N]
    let totals = last.reshape(&[bs, nc, h])?.transpose_axes(&[0, 2, 1])?; // [B, H, nc]
    let totals = ops::pad(&totals, &[(0, 0), (0, 0), (1, 0)][..], None, None)?;
    let bounds = ops::cumsum(&totals, -1, None, None)?; // [B, H, nc+1]
    let between = bounds.expand_dims(-1)?.subtract(bounds.expand_dims(-2)?)?;
    let causal = ops::tril(Array::ones::<bool>(&[nc + 1, nc + 1])?, 0)?;
    let carry = ops::exp(ops::select(&causal, &between, &neg_inf)?)?; // [B, H, nc+1, nc+1]
    let carried = carry.matmul(states.transpose_axes(&[0, 2, 1, 3])?)?; // [B, H, nc+1, P*N]
    let final_state = carried.index((.., .., nc, ..)).reshape(&[bs, h, p, n])?;
    let starts = carried
        .index((.., .., ..nc, ..))
        .reshape(&[bs, h, nc, p, n])?
        .transpose_axes(&[0, 2, 1, 4, 3])? // [B, nc, H, N, P]
        .reshape(&[bs, nc, g, r, n, p])?
        .transpose_axes(&[0, 1, 2, 4, 3, 5])? // [B, nc, G, N, r, P]
        .reshape(&[bs, nc, g, n, r * p])?;

    // 4. The chunk's start state read out at each position: exp(acs_l) C_l S_start.
    let y_off = cg
        .matmul(&starts)? // [B, nc, G, L, r*P]
        .reshape(&[bs, nc, g, l, r, p])?
        .transpose_axes(&[0, 1, 2, 4, 3, 5])? // [B, nc, G, r, L, P]
        .reshape(&[bs, nc, h, l, p])?
        .multiply(ops::exp(&acs)?.expand_dims(-1)?)?;
    let y = y_diag
        .add(&y_off)?
        .transpose_axes(&[0, 1, 3, 2, 4])?
        .reshape(&[bs, nc * l, h, p])?;
    let y = if pad > 0 { y.index((.., ..t)) } else { y };
    Ok((y.as_dtype(x.dtype())?, final_state))
}

/// The same recurrence as [`ssd_chunked`] in its step form: one position after another, each
/// updating the state and reading it out (what decoding runs, one position per call).
pub fn ssd_steps(
    x: &Array,
    dt: &Array,
    a: &Array,
    b: &Array,
    c: &Array,
    state: Option<&Array>,
) -> Result<(Array, Array)> {
    let SsdDims {
        b: bs,
        t,
        h,
        p,
        g,
        n,
    } = ssd_dims(x, dt, a, b, c)?;
    let r = h / g;
    let mut s = match state {
        Some(s) => f32(s)?.reshape(&[bs, g, r, p, n])?,
        None => ops::zeros::<f32>(&[bs, g, r, p, n])?,
    };
    let (x32, dt32, a32, b32, c32) = (f32(x)?, f32(dt)?, f32(a)?, f32(b)?, f32(c)?);
    let mut ys = Vec::with_capacity(t as usize);
    for i in 0..t {
        let dt_i = dt32.index((.., i)); // [B, H]
        let decay = ops::exp(dt_i.multiply(&a32)?)?.reshape(&[bs, g, r, 1, 1])?;
        let input = x32
            .index((.., i))
            .multiply(dt_i.expand_dims(-1)?)? // [B, H, P]
            .reshape(&[bs, g, r, p, 1])?
            .multiply(b32.index((.., i)).reshape(&[bs, g, 1, 1, n])?)?;
        s = s.multiply(&decay)?.add(&input)?;
        let y = s
            .matmul(c32.index((.., i)).reshape(&[bs, g, 1, n, 1])?)? // [B, G, r, P, 1]
            .reshape(&[bs, 1, h, p])?;
        ys.push(y);
    }
    let y = ops::concatenate(&ys, 1)?;
    Ok((y.as_dtype(x.dtype())?, s.reshape(&[bs, h, p, n])?))
}

/// A depthwise causal convolution over the positions of `x [B, T, C]` with `weight [C, 1, K]`
/// (transformers' `Conv1d` layout) and `bias [C]`: output `t` sees inputs `t - K + 1 ..= t`.
/// `history [B, K - 1, C]` holds the inputs before the first position (zeros when `None`); the
/// second result is the history after the last one.
pub fn causal_conv1d(
    x: &Array,
    weight: &Array,
    bias: Option<&Array>,
    history: Option<&Array>,
) -> Result<(Array, Array)> {
    let [bs, t, ch] = dims(x, "causal_conv1d's x")?;
    let [wc, one, k] = dims(weight, "causal_conv1d's weight")?;
    if wc != ch || one != 1 || k < 1 || bias.is_some_and(|b| b.shape() != [ch]) {
        return Err(Error::Layout(format!(
            "causal_conv1d needs weight [C, 1, K] and bias [C] for x [B, T, C]; got x {:?}, \
             weight {:?}, bias {:?}",
            x.shape(),
            weight.shape(),
            bias.map(|b| b.shape().to_vec())
        )));
    }
    let history = match history {
        Some(history) => history.as_dtype(x.dtype())?,
        None => ops::zeros_dtype(&[bs, k - 1, ch], x.dtype())?,
    };
    let full = ops::concatenate(&[&history, x], 1)?; // [B, K - 1 + T, C]
                                                     // Shifted products summed: K is small (4 in Mamba-2), and each term is one fused multiply.
    let taps = weight.reshape(&[ch, k])?.transpose()?; // [K, C]
    let mut y = full.index((.., 0..t)).multiply(taps.index(0))?;
    for j in 1..k {
        y = y.add(full.index((.., j..j + t)).multiply(taps.index(j))?)?;
    }
    if let Some(bias) = bias {
        y = y.add(bias)?;
    }
    let next = full.index((.., t..t + k - 1));
    Ok((y, next))
}

/// Checks the layouts of a gated delta rule call: `q` and `k [B, T, H, Dk]`, `v [B, T, H, Dv]`,
/// `g` and `beta [B, T, H]`.
fn delta_dims(q: &Array, k: &Array, v: &Array, g: &Array, beta: &Array) -> Result<[i32; 5]> {
    let [bs, t, h, dk] = dims(q, "gated_delta's q")?;
    let [_, _, _, dv] = dims(v, "gated_delta's v")?;
    let ok = k.shape() == q.shape()
        && v.shape()[..3] == [bs, t, h]
        && g.shape() == [bs, t, h]
        && beta.shape() == [bs, t, h];
    if !ok {
        return Err(Error::Layout(format!(
            "gated_delta needs q and k [B, T, H, Dk], v [B, T, H, Dv], g and beta [B, T, H]; got \
             q {:?}, k {:?}, v {:?}, g {:?}, beta {:?}",
            q.shape(),
            k.shape(),
            v.shape(),
            g.shape(),
            beta.shape()
        )));
    }
    Ok([bs, t, h, dk, dv])
}

/// The gated delta rule (Gated DeltaNet, Yang et al., 2024) in its step form: per head, with the
/// state `S [Dk, Dv]`, `S_t = exp(g_t) S_{t-1} + beta_t k_t (v_t - exp(g_t) S_{t-1}^T k_t)^T` and
/// `o_t = S_t^T q_t`. `g` is the log of the decay (at most 0), `beta` the write strength.
pub fn gated_delta_steps(
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    state: Option<&Array>,
) -> Result<(Array, Array)> {
    let [bs, t, h, dk, dv] = delta_dims(q, k, v, g, beta)?;
    let mut s = match state {
        Some(s) => f32(s)?,
        None => ops::zeros::<f32>(&[bs, h, dk, dv])?,
    };
    let (q32, k32, v32, g32, b32) = (f32(q)?, f32(k)?, f32(v)?, f32(g)?, f32(beta)?);
    let mut outs = Vec::with_capacity(t as usize);
    for i in 0..t {
        let ki = k32.index((.., i)).expand_dims(-1)?; // [B, H, Dk, 1]
        s = s.multiply(ops::exp(g32.index((.., i)))?.reshape(&[bs, h, 1, 1])?)?;
        let remembered = s.multiply(&ki)?.sum_axis(-2, None)?; // [B, H, Dv]
        let delta = v32
            .index((.., i))
            .subtract(&remembered)?
            .multiply(b32.index((.., i)).expand_dims(-1)?)?;
        s = s.add(ki.multiply(delta.expand_dims(-2)?)?)?;
        let o = s
            .multiply(q32.index((.., i)).expand_dims(-1)?)?
            .sum_axis(-2, None)?; // [B, H, Dv]
        outs.push(o.expand_dims(1)?);
    }
    Ok((ops::concatenate(&outs, 1)?.as_dtype(v.dtype())?, s))
}

/// `(I - N)^-1` for `n: [.., L, L]` strictly lower triangular, by doubling inverted diagonal
/// blocks: `[[A, 0], [C, B]]^-1 = [[A^-1, 0], [-B^-1 C A^-1, B^-1]]`, `log2(L)` rounds of batched
/// block products. Unlike the Neumann series `I + N + N^2 + ...` (exact, since `N` is nilpotent),
/// no term is larger than the inverse itself: when a chunk's keys point one way the powers `N^m`
/// grow like binomial coefficients and cancel only in exact arithmetic, which made training
/// diverge in bfloat16 on the GPU (its float32 products run in TF32).
fn unit_lower_inverse(n: &Array) -> Result<Array> {
    let shape = n.shape();
    let (lead, l) = (&shape[..shape.len() - 2], shape[shape.len() - 1]);
    let size = (l.max(1) as u32).next_power_of_two() as i32;
    // Zero rows and columns past L leave the top-left block's inverse as it is.
    let n = if size > l {
        let mut widths = vec![(0, 0); shape.len()];
        widths[shape.len() - 2] = (0, size - l);
        widths[shape.len() - 1] = (0, size - l);
        ops::pad(n, widths.as_slice(), None, None)?
    } else {
        n.clone()
    };
    let with_lead = |tail: &[i32]| -> Vec<i32> { lead.iter().chain(tail).copied().collect() };
    let rank = lead.len() as i32;
    // The inverse's diagonal blocks of side `side`: [.., size / side, side, side].
    let mut blocks = ops::ones::<f32>(&with_lead(&[size, 1, 1]))?;
    let mut side = 1;
    while side < size {
        let pairs = size / (2 * side);
        let halves = blocks.reshape(&with_lead(&[pairs, 2, side, side]))?;
        let upper = halves.index((Ellipsis, 0, .., ..)); // [.., pairs, side, side]
        let lower = halves.index((Ellipsis, 1, .., ..));
        // N's block below each pair's first diagonal block: rows (2j+1)·side.., columns 2j·side...
        let grid = n.reshape(&with_lead(&[pairs, 2, side, pairs, 2, side]))?;
        let coupling = grid
            .diagonal(0, rank, rank + 3)? // [.., 2, side, 2, side, pairs]
            .index((Ellipsis, 1, .., 0, .., ..)) // [.., side, side, pairs]
            .move_axis(-1, rank)?;
        let corner = lower.matmul(&coupling)?.matmul(&upper)?;
        let top = ops::concatenate(&[upper.clone(), ops::zeros_like(&upper)?], -1)?;
        let bottom = ops::concatenate(&[corner, lower], -1)?;
        blocks = ops::concatenate(&[top, bottom], -2)?;
        side *= 2;
    }
    let inverse = blocks.reshape(&with_lead(&[size, size]))?;
    Ok(if size > l {
        inverse.index((Ellipsis, ..l, ..l))
    } else {
        inverse
    })
}

/// The gated delta rule of [`gated_delta_steps`] in its chunked form: within each chunk of
/// `chunk` positions the delta updates are folded into one triangular system (the UT transform),
/// solved by [`unit_lower_inverse`], then the chunks run one after another through the state.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_chunked(
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    chunk: i32,
    state: Option<&Array>,
) -> Result<(Array, Array)> {
    let [bs, t, h, dk, dv] = delta_dims(q, k, v, g, beta)?;
    if chunk < 1 {
        return Err(Error::Layout(format!(
            "gated_delta's chunk must be positive, not {chunk}"
        )));
    }
    let l = chunk.min(t.max(1));
    let nc = (t + l - 1) / l;
    let pad = nc * l - t;
    // [B, T, H, ..] -> [B, H, nc, L, ..], padded with zeros (no write, no decay).
    let chunked = |x: &Array, width: Option<i32>| -> Result<Array> {
        let x = f32(x)?;
        let x = if pad > 0 {
            let mut w = vec![(0, 0); x.ndim()];
            w[1] = (0, pad);
            ops::pad(&x, w.as_slice(), None, None)?
        } else {
            x
        };
        Ok(match width {
            Some(d) => x
                .reshape(&[bs, nc, l, h, d])?
                .transpose_axes(&[0, 3, 1, 2, 4])?,
            None => x.reshape(&[bs, nc, l, h])?.transpose_axes(&[0, 3, 1, 2])?,
        })
    };
    let (qc, kc, vc) = (
        chunked(q, Some(dk))?,
        chunked(k, Some(dk))?,
        chunked(v, Some(dv))?,
    );
    let (gc, bc) = (chunked(g, None)?, chunked(beta, None)?);
    let cum = ops::cumsum(&gc, -1, None, None)?; // [B, H, nc, L]
    let gap = cum.expand_dims(-1)?.subtract(cum.expand_dims(-2)?)?;
    let lower = ops::tril(Array::ones::<bool>(&[l, l])?, 0)?;
    let neg_inf = Array::from_f32(f32::NEG_INFINITY);
    let decay = ops::exp(ops::select(&lower, &gap, &neg_inf)?)?; // [B, H, nc, L, L]
    let k_beta = kc.multiply(bc.expand_dims(-1)?)?;
    let v_beta = vc.multiply(bc.expand_dims(-1)?)?;
    let kt = kc.swap_axes(-1, -2)?;
    let strict = ops::tril(Array::ones::<f32>(&[l, l])?, -1)?;
    let n = k_beta
        .matmul(&kt)?
        .multiply(&decay)?
        .multiply(&strict)?
        .negative()?;
    let inverse = unit_lower_inverse(&n)?;
    let new_values = inverse.matmul(&v_beta)?; // [B, H, nc, L, Dv]
    let k_cumdecay = inverse.matmul(k_beta.multiply(ops::exp(&cum)?.expand_dims(-1)?)?)?;
    let intra = qc.matmul(&kt)?.multiply(&decay)?; // [B, H, nc, L, L]
    let q_decayed = qc.multiply(ops::exp(&cum)?.expand_dims(-1)?)?;
    let last = cum.index((.., .., .., l - 1..l)); // [B, H, nc, 1]
    let k_decayed = kc.multiply(ops::exp(last.subtract(&cum)?)?.expand_dims(-1)?)?;
    let chunk_decay = ops::exp(&last)?; // [B, H, nc, 1]
    let mut s = match state {
        Some(s) => f32(s)?,
        None => ops::zeros::<f32>(&[bs, h, dk, dv])?,
    };
    let mut outs = Vec::with_capacity(nc as usize);
    for c in 0..nc {
        let at = |x: &Array| x.index((.., .., c));
        let v_new = at(&new_values).subtract(at(&k_cumdecay).matmul(&s)?)?; // [B, H, L, Dv]
        let out = at(&q_decayed).matmul(&s)?.add(at(&intra).matmul(&v_new)?)?;
        outs.push(out);
        s = s
            .multiply(at(&chunk_decay).expand_dims(-1)?)?
            .add(at(&k_decayed).swap_axes(-1, -2)?.matmul(&v_new)?)?;
    }
    let o = ops::concatenate(&outs, 2)? // [B, H, nc * L, Dv]
        .transpose_axes(&[0, 2, 1, 3])?;
    let o = if pad > 0 { o.index((.., ..t)) } else { o };
    Ok((o.as_dtype(v.dtype())?, s))
}

/// A chunked form over a whole sequence from a zero state, as training runs it, whose gradient
/// computes the form again instead of keeping its intermediates: inside each chunk the forms
/// build `[B, H, nc, L, L]` decays and weights in float32, several per layer, which is most of
/// a recurrent model's saved activations (an activation checkpoint around the one op, as
/// MLX's `checkpoint` makes). The backward pays one more forward of the scan.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Recomputed {
    /// [`ssd_chunked`] over `[x, dt, a, b, c]`.
    Ssd { chunk: i32 },
    /// [`gated_delta_chunked`] over `[q, k, v, g, beta]`.
    GatedDelta { chunk: i32 },
}

impl WithGradient for Recomputed {
    const NAME: &'static str = "a chunked scan";

    fn forward(&self, inputs: &[Array]) -> Result<Vec<Array>> {
        let y = match (*self, inputs) {
            (Recomputed::Ssd { chunk }, [x, dt, a, b, c]) => {
                ssd_chunked(x, dt, a, b, c, chunk, None)?.0
            }
            (Recomputed::GatedDelta { chunk }, [q, k, v, g, beta]) => {
                gated_delta_chunked(q, k, v, g, beta, chunk, None)?.0
            }
            _ => {
                return Err(Error::Layout(format!(
                    "{self:?} takes five arrays, got {}",
                    inputs.len()
                )))
            }
        };
        Ok(vec![y])
    }

    fn vjp(&self, primals: &[Array], cotangents: &[Array]) -> Result<Vec<Array>> {
        let forward = |inputs: &[Array]| self.forward(inputs).map_err(Error::into_exception);
        Ok(mlx_rs::transforms::fallible_vjp(forward, primals, cotangents)?.1)
    }
}

/// `function` over `inputs` through [`Recomputed`]'s custom gradient.
fn recomputed(function: Recomputed, inputs: &[&Array]) -> Result<Array> {
    let inputs: Vec<Array> = inputs.iter().map(|&x| x.clone()).collect();
    custom_vjp::apply(&function, &inputs)?
        .pop()
        .ok_or_else(|| Error::Layout(format!("{function:?} returned nothing")))
}

/// [`ssd_chunked`] or [`ssd_steps`] in recurrent slot `slot` of `ctx`: with a generation cache, the
/// state it holds for the slot is the initial state and the final one replaces it, one position
/// runs the step form and more the chunked form; positions a row's left padding holds take no
/// step (their `dt` is zeroed), so its state stays what it was.
#[allow(clippy::too_many_arguments)]
pub fn ssd(
    ctx: &mut Context,
    slot: usize,
    x: &Array,
    dt: &Array,
    a: &Array,
    b: &Array,
    c: &Array,
    chunk: i32,
) -> Result<Array> {
    let Some(cache) = ctx.cache_mut() else {
        return recomputed(Recomputed::Ssd { chunk }, &[x, dt, a, b, c]);
    };
    let t = x.dim(1);
    let dt = match cache.valid(t)? {
        Some(valid) => dt.multiply(valid.expand_dims(-1)?.as_dtype(dt.dtype())?)?,
        None => dt.clone(),
    };
    let held = cache.states.get(slot);
    let (y, state) = if t == 1 {
        ssd_steps(x, &dt, a, b, c, held.as_ref())?
    } else {
        ssd_chunked(x, &dt, a, b, c, chunk, held.as_ref())?
    };
    cache.states.set(slot, state);
    Ok(y)
}

/// [`gated_delta_chunked`] or [`gated_delta_steps`] in recurrent slot `slot` of `ctx`, as
/// [`ssd`] runs its forms: a row's left padding neither decays nor writes its state.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta(
    ctx: &mut Context,
    slot: usize,
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    chunk: i32,
) -> Result<Array> {
    let Some(cache) = ctx.cache_mut() else {
        return recomputed(Recomputed::GatedDelta { chunk }, &[q, k, v, g, beta]);
    };
    let t = q.dim(1);
    let (g, beta) = match cache.valid(t)? {
        Some(valid) => {
            let valid = valid.expand_dims(-1)?;
            (
                g.multiply(valid.as_dtype(g.dtype())?)?,
                beta.multiply(valid.as_dtype(beta.dtype())?)?,
            )
        }
        None => (g.clone(), beta.clone()),
    };
    let held = cache.states.get(slot);
    let (o, state) = if t == 1 {
        gated_delta_steps(q, k, v, &g, &beta, held.as_ref())?
    } else {
        gated_delta_chunked(q, k, v, &g, &beta, chunk, held.as_ref())?
    };
    cache.states.set(slot, state);
    Ok(o)
}

/// [`causal_conv1d`] in recurrent slot `slot` of `ctx`: with a generation cache, the history it
/// holds for the slot comes first and the last `K - 1` inputs replace it; inputs on a row's left
/// padding are zeroed, so the history a row starts with is zeros as without padding.
pub fn conv_causal(
    ctx: &mut Context,
    slot: usize,
    x: &Array,
    weight: &Array,
    bias: Option<&Array>,
) -> Result<Array> {
    let Some(cache) = ctx.cache_mut() else {
        return Ok(causal_conv1d(x, weight, bias, None)?.0);
    };
    let x = match cache.valid(x.dim(1))? {
        Some(valid) => x.multiply(valid.expand_dims(-1)?.as_dtype(x.dtype())?)?,
        None => x.clone(),
    };
    let held = cache.states.get(slot);
    let (y, history) = causal_conv1d(&x, weight, bias, held.as_ref())?;
    cache.states.set(slot, history);
    Ok(y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::cache::KvCache;

    fn normal(shape: &[i32], seed: u64) -> Array {
        let key = mlx_rs::random::key(seed).unwrap();
        mlx_rs::random::normal::<f32>(shape, None, None, &key).unwrap()
    }

    fn max_gap(a: &Array, b: &Array) -> f32 {
        assert_eq!(a.shape(), b.shape());
        a.subtract(b)
            .unwrap()
            .abs()
            .unwrap()
            .max(None)
            .unwrap()
            .item_exact::<f32>()
    }

    /// Random SSD inputs: `[B, T, H, P]`, positive steps, negative rates, `G` groups.
    fn inputs(t: i32, seed: u64) -> [Array; 5] {
        let (bs, h, p, g, n) = (2, 4, 3, 2, 5);
        let x = normal(&[bs, t, h, p], seed);
        let dt = mlx_rs::nn::softplus(normal(&[bs, t, h], seed + 1)).unwrap();
        let a = ops::exp(normal(&[h], seed + 2))
            .unwrap()
            .negative()
            .unwrap();
        let b = normal(&[bs, t, g, n], seed + 3);
        let c = normal(&[bs, t, g, n], seed + 4);
        [x, dt, a, b, c]
    }

    #[test]
    fn chunked_and_step_forms_agree_on_lengths_the_chunk_does_not_divide() -> Result<()> {
        for (t, chunk) in [(1, 4), (7, 4), (13, 5), (16, 4), (9, 64)] {
            let [x, dt, a, b, c] = inputs(t, 10 + t as u64);
            let start = normal(&[2, 4, 3, 5], 99);
            for state in [None, Some(&start)] {
                let (y1, s1) = ssd_chunked(&x, &dt, &a, &b, &c, chunk, state)?;
                let (y2, s2) = ssd_steps(&x, &dt, &a, &b, &c, state)?;
                assert!(max_gap(&y1, &y2) < 1e-5, "y, T = {t}, chunk {chunk}");
                assert!(max_gap(&s1, &s2) < 1e-5, "state, T = {t}, chunk {chunk}");
            }
        }
        Ok(())
    }

    #[test]
    fn a_sequence_split_anywhere_continues_from_the_carried_state() -> Result<()> {
        let [x, dt, a, b, c] = inputs(11, 3);
        let (whole, end) = ssd_chunked(&x, &dt, &a, &b, &c, 4, None)?;
        let part = |v: &Array, r: std::ops::Range<i32>| v.index((.., r));
        let (y1, s1) = ssd_chunked(
            &part(&x, 0..6),
            &part(&dt, 0..6),
            &a,
            &part(&b, 0..6),
            &part(&c, 0..6),
            4,
            None,
        )?;
        let (y2, s2) = ssd_chunked(
            &part(&x, 6..11),
            &part(&dt, 6..11),
            &a,
            &part(&b, 6..11),
            &part(&c, 6..11),
            4,
            Some(&s1),
        )?;
        assert!(max_gap(&whole, &ops::concatenate(&[y1, y2], 1)?) < 1e-5);
        assert!(max_gap(&end, &s2) < 1e-5);
        // The convolution likewise: its history carries the last K - 1 inputs.
        let xs = normal(&[2, 9, 6], 4);
        let w = normal(&[6, 1, 4], 5);
        let bias = normal(&[6], 6);
        let (full, _) = causal_conv1d(&xs, &w, Some(&bias), None)?;
        let (c1, h1) = causal_conv1d(&xs.index((.., ..5)), &w, Some(&bias), None)?;
        let (c2, _) = causal_conv1d(&xs.index((.., 5..)), &w, Some(&bias), Some(&h1))?;
        assert!(max_gap(&full, &ops::concatenate(&[c1, c2], 1)?) < 1e-5);
        Ok(())
    }

    #[test]
    fn gradients_of_the_chunked_form_match_finite_differences() -> Result<()> {
        let [x, dt, a, b, c] = inputs(5, 7);
        let w = normal(&[2, 5, 4, 3], 8);
        // Loss <w, y> as a function of x, dt, a, b and c, differentiated by MLX.
        let loss = |args: &[Array]| -> Result<Array> {
            let (y, _) = ssd_chunked(&args[0], &args[1], &args[2], &args[3], &args[4], 2, None)?;
            Ok(y.multiply(&w)?.sum(None)?)
        };
        let objective =
            |args: &[Array]| -> std::result::Result<Vec<Array>, mlx_rs::error::Exception> {
                Ok(vec![loss(args).map_err(Error::into_exception)?])
            };
        let inputs = [x, dt, a, b, c];
        let (_, grads) = mlx_rs::transforms::value_and_grad_with_argnums(
            objective,
            &[0, 1, 2, 3, 4][..],
        )(&inputs)?;
        let eps = 1e-3;
        for (which, grad) in grads.iter().enumerate() {
            let flat = inputs[which].flatten(None, None)?;
            for i in [0, flat.size() as i32 / 2, flat.size() as i32 - 1] {
                let bump = |sign: f32| -> Result<f32> {
                    let delta = ops::zeros::<f32>(&[flat.size() as i32])?;
                    let mut delta = delta;
                    use mlx_rs::ops::indexing::TryIndexMutOp;
                    delta.try_index_mut(i, Array::from_f32(sign * eps))?;
                    let mut moved = inputs.clone();
                    moved[which] = flat.add(&delta)?.reshape(inputs[which].shape())?;
                    Ok(loss(&moved)?.item_exact::<f32>())
                };
                let numeric = (bump(1.0)? - bump(-1.0)?) / (2.0 * eps);
                let analytic = grad.flatten(None, None)?.index(i).item_exact::<f32>();
                assert!(
                    (numeric - analytic).abs() <= 2e-2 * (1.0 + analytic.abs()),
                    "input {which}, element {i}: {numeric} by differences, {analytic} by MLX"
                );
            }
        }
        Ok(())
    }

    #[test]
    fn a_cache_carries_the_state_and_padding_leaves_it_untouched() -> Result<()> {
        let [x, dt, a, b, c] = inputs(6, 20);
        let (whole, _) = ssd_chunked(&x, &dt, &a, &b, &c, 4, None)?;
        let mut ctx = Context::generation();
        let mut outputs = Vec::new();
        for r in [0..4, 4..5, 5..6] {
            let part = |v: &Array| v.index((.., r.clone()));
            outputs.push(ssd(
                &mut ctx,
                0,
                &part(&x),
                &part(&dt),
                &a,
                &part(&b),
                &part(&c),
                4,
            )?);
            ctx.advance(r.len() as i32);
        }
        assert!(max_gap(&whole, &ops::concatenate(&outputs, 1)?) < 1e-5);
        // Row 1 left-padded by two slots of garbage: its outputs after them are row 1's own.
        let shift = |v: &Array| -> Result<Array> {
            let junk = normal(
                &[2, 2]
                    .iter()
                    .chain(&v.shape()[2..])
                    .copied()
                    .collect::<Vec<_>>(),
                30,
            );
            Ok(ops::concatenate(&[&junk, v], 1)?)
        };
        let dt_padded = ops::abs(shift(&dt)?)?;
        let mut ctx = crate::model::Context::with_cache(KvCache::padded(vec![2, 2], 0));
        let y = ssd(
            &mut ctx,
            0,
            &shift(&x)?,
            &dt_padded,
            &a,
            &shift(&b)?,
            &shift(&c)?,
            4,
        )?;
        assert!(max_gap(&whole, &y.index((.., 2..))) < 1e-5);
        Ok(())
    }

    #[test]
    fn gated_delta_chunked_and_step_forms_agree() -> Result<()> {
        for (t, chunk) in [(1, 4), (7, 4), (13, 5), (16, 8)] {
            let (bs, h, dk, dv) = (2, 3, 4, 5);
            let unit = |x: Array| -> Array {
                let norm = x
                    .square()
                    .unwrap()
                    .sum_axis(-1, true)
                    .unwrap()
                    .sqrt()
                    .unwrap();
                x.divide(&norm).unwrap()
            };
            let q = normal(&[bs, t, h, dk], 40 + t as u64);
            let k = unit(normal(&[bs, t, h, dk], 41 + t as u64));
            let v = normal(&[bs, t, h, dv], 42);
            let g = mlx_rs::nn::log_sigmoid(normal(&[bs, t, h], 43)).unwrap();
            let beta = ops::sigmoid(normal(&[bs, t, h], 44)).unwrap();
            let start = normal(&[bs, h, dk, dv], 45);
            for state in [None, Some(&start)] {
                let (o1, s1) = gated_delta_chunked(&q, &k, &v, &g, &beta, chunk, state)?;
                let (o2, s2) = gated_delta_steps(&q, &k, &v, &g, &beta, state)?;
                assert!(
                    max_gap(&o1, &o2) < 1e-5,
                    "o, T = {t}, chunk {chunk}: {}",
                    max_gap(&o1, &o2)
                );
                assert!(max_gap(&s1, &s2) < 1e-5, "state, T = {t}, chunk {chunk}");
            }
        }
        Ok(())
    }

    #[test]
    fn unit_lower_inverse_inverts_at_every_size() -> Result<()> {
        for l in [1, 2, 5, 8, 13, 64] {
            let strict = ops::tril(Array::ones::<f32>(&[l, l])?, -1)?;
            let n = normal(&[2, 3, l, l], 60 + l as u64)
                .multiply(&strict)?
                .multiply(Array::from_f32(0.1))?;
            let system = ops::eye::<f32>(l, None, None)?.subtract(&n)?;
            let product = system.matmul(&unit_lower_inverse(&n)?)?;
            let eye = ops::broadcast_to(ops::eye::<f32>(l, None, None)?, &[2, 3, l, l])?;
            assert!(
                max_gap(&product, &eye) < 1e-3,
                "L = {l}: {}",
                max_gap(&product, &eye)
            );
        }
        Ok(())
    }

    /// Keys that all point one way with betas near 1 make the chunk's triangular system's
    /// Neumann terms `N^m` grow like binomial coefficients (about 1e17 at 64 positions), which
    /// cancel to the moderate true inverse only in exact arithmetic: the chunked form must still
    /// agree with the steps at a full chunk of 64.
    #[test]
    fn gated_delta_chunked_form_stays_exact_for_aligned_keys_over_long_chunks() -> Result<()> {
        let (bs, t, h, dk, dv) = (1, 100, 2, 8, 4);
        let k = ops::ones::<f32>(&[bs, t, h, dk])?
            .multiply(Array::from_f32(1.0 / (dk as f32).sqrt()))?;
        let q = normal(&[bs, t, h, dk], 50);
        let v = normal(&[bs, t, h, dv], 51);
        let g = ops::full::<f32>(&[bs, t, h], Array::from_f32(-0.01))?;
        let beta = ops::full::<f32>(&[bs, t, h], Array::from_f32(0.99))?;
        let (o2, s2) = gated_delta_steps(&q, &k, &v, &g, &beta, None)?;
        for chunk in [64, 48] {
            let (o1, s1) = gated_delta_chunked(&q, &k, &v, &g, &beta, chunk, None)?;
            let scale = o2.abs()?.max(None)?.item_exact::<f32>().max(1.0);
            assert!(
                max_gap(&o1, &o2) < 1e-4 * scale,
                "o, chunk {chunk}: {} (largest {scale})",
                max_gap(&o1, &o2)
            );
            assert!(max_gap(&s1, &s2) < 1e-4 * scale, "state, chunk {chunk}");
        }
        Ok(())
    }

    /// The value and gradients of `<w, f(args)>` in every argument.
    fn value_and_grads(
        f: impl Fn(&[Array]) -> Result<Array> + 'static,
        args: &[Array],
        w: &Array,
    ) -> (Array, Vec<Array>) {
        let w = w.clone();
        let objective = move |args: &[Array]| {
            let y = f(args).map_err(Error::into_exception)?;
            Ok(vec![y.multiply(&w)?.sum(None)?])
        };
        let (value, grads) =
            mlx_rs::transforms::value_and_grad_with_argnums(objective, &[0, 1, 2, 3, 4][..])(args)
                .unwrap();
        (value[0].clone(), grads)
    }

    /// The chunked form's gradients are the step form's, a different algorithm over the same
    /// recurrence, at a length the chunk does not divide (padding, and a block inverse of a size
    /// that is not a power of two).
    #[test]
    fn gated_delta_chunked_gradients_are_the_step_forms() -> Result<()> {
        let (t, h) = (13, 3);
        let q = normal(&[2, t, h, 4], 70);
        let k = normal(&[2, t, h, 4], 71).multiply(Array::from_f32(0.5))?;
        let v = normal(&[2, t, h, 5], 72);
        let g = mlx_rs::nn::log_sigmoid(normal(&[2, t, h], 73))?;
        let beta = ops::sigmoid(normal(&[2, t, h], 74))?;
        let args = [q, k, v, g, beta];
        let w = normal(&[2, t, h, 5], 75);
        let chunked =
            |a: &[Array]| Ok(gated_delta_chunked(&a[0], &a[1], &a[2], &a[3], &a[4], 6, None)?.0);
        let steps = |a: &[Array]| Ok(gated_delta_steps(&a[0], &a[1], &a[2], &a[3], &a[4], None)?.0);
        let (value, grads) = value_and_grads(chunked, &args, &w);
        let (reference, reference_grads) = value_and_grads(steps, &args, &w);
        assert!(max_gap(&value, &reference) < 1e-4);
        for (i, (ours, theirs)) in grads.iter().zip(&reference_grads).enumerate() {
            assert!(
                max_gap(ours, theirs) < 1e-4,
                "input {i}: {}",
                max_gap(ours, theirs)
            );
        }
        Ok(())
    }

    #[test]
    fn recomputed_scans_give_the_plain_forms_values_and_gradients() -> Result<()> {
        let ssd_args = inputs(11, 50).to_vec();
        let q = normal(&[2, 11, 3, 4], 51);
        let k = normal(&[2, 11, 3, 4], 52).multiply(Array::from_f32(0.4))?;
        let v = normal(&[2, 11, 3, 5], 53);
        let g = mlx_rs::nn::log_sigmoid(normal(&[2, 11, 3], 54))?;
        let beta = ops::sigmoid(normal(&[2, 11, 3], 55))?;
        let delta_args = vec![q, k, v, g, beta];
        type Plain = fn(&[Array]) -> Result<Array>;
        let cases: [(Recomputed, &[Array], Plain); 2] = [
            (Recomputed::Ssd { chunk: 4 }, &ssd_args, |a| {
                Ok(ssd_chunked(&a[0], &a[1], &a[2], &a[3], &a[4], 4, None)?.0)
            }),
            (Recomputed::GatedDelta { chunk: 4 }, &delta_args, |a| {
                Ok(gated_delta_chunked(&a[0], &a[1], &a[2], &a[3], &a[4], 4, None)?.0)
            }),
        ];
        for (function, args, plain) in cases {
            let w = normal(plain(args)?.shape(), 56);
            let (value, grads) = value_and_grads(plain, args, &w);
            let (again, regrads) = value_and_grads(
                move |a| recomputed(function, &a.iter().collect::<Vec<_>>()),
                args,
                &w,
            );
            assert!(max_gap(&value, &again) < 1e-5, "{function:?}'s value");
            for (i, (g1, g2)) in grads.iter().zip(&regrads).enumerate() {
                assert!(
                    max_gap(g1, g2) < 1e-5,
                    "{function:?}'s gradient in input {i}"
                );
            }
        }
        Ok(())
    }
}
