//! Gathered sparse experts and router balancing.
//!
//! [`switch_glu`] runs each token through only the experts its router chose, as mlx-lm's
//! `SwitchGLU` does: the experts' weights are stacked (`[experts, out, in]`, each expert a linear
//! layer's weight) and MLX's `gather_mm` multiplies every (token, choice) row by its expert's
//! matrix. With many rows they are first sorted by expert (mlx-lm's `_gather_sort`), so the
//! product walks each expert's rows together, and put back in order afterwards (`expert_rows`,
//! whose gradients gather rather than scatter). MLX differentiates `gather_mm` with respect to
//! both operands, so the experts train.
//!
//! [`balance`] adds the gradient of the Switch Transformer's auxiliary load-balancing loss (as
//! transformers' `load_balancing_loss_func` computes it for Mixtral) without adding the loss
//! itself to the model's output: it is the identity on the layer's output, and its gradient with
//! respect to the router's probabilities is the loss's, times its coefficient (Megatron-LM's
//! `MoEAuxLossAutoScaler` does the same). So a forward pass that returns logits trains its router
//! towards balance, and the reported loss stays the language model's.
//!
//! [`route_groups`] is DeepSeek-V3's choice of experts: by the router's scores plus a per-expert
//! bias (the auxiliary-loss-free balancing's `e_score_correction_bias`, which decides the choice
//! only and never weighs an expert's output), first among groups of experts (the `topk_groups`
//! groups whose two best experts score highest), then the `k` best experts of those groups.

use super::custom_vjp::{self, WithGradient};
use super::expert_rows::reorder;
use super::{dropout, literal, scalar, silu, Packed};
use crate::error::{Error, Result};
use crate::model::Context;
use mlx_rs::{ops, Array, Dtype};

/// From this many (token, choice) rows on, [`switch_glu`] sorts the rows by expert (mlx-lm's
/// threshold).
pub const SORT_FROM: usize = 64;

/// The experts' SwiGLU, `down(silu(gate(x)) * up(x))`, of each token through each expert that
/// `indices` chose for it: `x [..., d]`, `indices [..., k]` (ints below the number of experts),
/// `gate` and `up` `[experts, hidden, d]`, `down` `[experts, d_out, hidden]`; the result is
/// `[..., k, d_out]`, one row per choice, as mlx-lm's `SwitchGLU` returns it.
pub fn switch_glu(
    x: &Array,
    indices: &Array,
    gate: &Array,
    up: &Array,
    down: &Array,
) -> Result<Array> {
    gathered_glu(
        x,
        indices,
        [gate, up, down].map(|w| Projection {
            stacked: Stacked::Dense(w),
            adapter: None,
        }),
        None,
    )
}

/// One stacked projection `[experts, out, in]` as [`gathered_glu`] multiplies it: floating
/// point (MLX's `gather_mm`) or quantized (MLX's `gather_qmm`, mlx-lm's
/// `QuantizedSwitchLinear`).
pub(crate) enum Stacked<'a> {
    Dense(&'a Array),
    Packed(Packed<'a, Array>),
}

impl Stacked<'_> {
    /// `rows [.., 1, in]` times the experts `idx` chose: `[.., 1, out]`.
    fn gather(&self, rows: &Array, idx: &Array, sorted: bool) -> Result<Array> {
        Ok(match self {
            Stacked::Dense(w) => ops::gather_mm(rows, w.swap_axes(-1, -2)?, None, idx, sorted)?,
            Stacked::Packed(p) => ops::gather_qmm(
                rows,
                p.weight,
                p.scales,
                p.biases,
                None,
                idx,
                true,
                p.quantization.group_size,
                p.quantization.bits,
                sorted,
            )?,
        })
    }
}

/// Each expert's low-rank adapter of a stacked projection, as mlx-lm's `LoRASwitchLinear`
/// holds it: `a [experts, rank, in]`, `b [experts, out, rank]`, the term added
/// `scale * (dropout(rows) a_e^T) b_e^T` for the chosen expert `e`.
pub(crate) struct StackedAdapter<'a> {
    pub a: &'a Array,
    pub b: &'a Array,
    pub scale: f32,
    /// The probability of dropping an input of the adapter, in a training step.
    pub dropout: f32,
}

/// A stacked projection and its adapter, if it has one.
pub(crate) struct Projection<'a> {
    pub stacked: Stacked<'a>,
    pub adapter: Option<StackedAdapter<'a>>,
}

impl Projection<'_> {
    /// `rows [.., 1, in]` times the experts `idx` chose, adapters included: `[.., 1, out]`. An
    /// adapter with a dropout probability sees `rows` through [`dropout`], its mask drawn from
    /// `ctx`'s key (so only in a training step), as mlx-lm's `LoRASwitchLinear` in training mode.
    fn gather(
        &self,
        rows: &Array,
        idx: &Array,
        sorted: bool,
        ctx: Option<&mut Context>,
    ) -> Result<Array> {
        let y = self.stacked.gather(rows, idx, sorted)?;
        let Some(adapter) = &self.adapter else {
            return Ok(y);
        };
        let dropped;
        let rows = match ctx {
            Some(ctx) if adapter.dropout > 0.0 => {
                dropped = dropout(rows, adapter.dropout, ctx)?;
                &dropped
            }
            _ => rows,
        };
        let low = ops::gather_mm(rows, adapter.a.swap_axes(-1, -2)?, None, idx, sorted)?;
        let low = ops::gather_mm(&low, adapter.b.swap_axes(-1, -2)?, None, idx, sorted)?;
        let low = low.multiply(literal(f64::from(adapter.scale), &low)?)?;
        Ok(y.add(low.as_dtype(y.dtype())?)?)
    }
}

/// [`switch_glu`] over `[gate, up, down]`, whichever form each is stored in.
///
/// Adapters' dropout draws from `ctx` where one is given (a forward pass's); without one, as in
/// evaluation, it is off.
pub(crate) fn gathered_glu(
    x: &Array,
    indices: &Array,
    [gate, up, down]: [Projection<'_>; 3],
    mut ctx: Option<&mut Context>,
) -> Result<Array> {
    let width = *x
        .shape()
        .last()
        .ok_or_else(|| Error::Layout("switch_glu takes x of rank 1 or more".into()))?;
    let indices = indices.as_dtype(Dtype::Uint32)?;
    let idx_shape = indices.shape().to_vec();
    let k = *idx_shape
        .last()
        .ok_or_else(|| Error::Layout("switch_glu takes indices of rank 1 or more".into()))?;
    // Each token a [1, d] matrix, broadcast over its k choices: [..., 1, 1, d].
    let rows = x.expand_dims(-2)?.expand_dims(-2)?;
    let sort = indices.size() >= SORT_FROM;
    let (rows, idx, inverse) = if sort {
        let flat = indices.flatten(None, None)?;
        let order = ops::argsort_axis(&flat, 0)?;
        let inverse = ops::argsort_axis(&order, 0)?;
        let rows = reorder(&rows.reshape(&[-1, 1, width])?, &order, &inverse, k)?;
        (rows, flat.take_axis(&order, 0)?, Some((order, inverse)))
    } else {
        (rows, indices, None)
    };
    let gated = gate.gather(&rows, &idx, sort, ctx.as_deref_mut())?;
    let hidden = silu(&gated)?.multiply(up.gather(&rows, &idx, sort, ctx.as_deref_mut())?)?;
    let y = down.gather(&hidden, &idx, sort, ctx)?;
    let y = match inverse {
        Some((order, inverse)) => {
            let out = *y.shape().last().unwrap_or(&1);
            let mut shape = idx_shape.clone();
            shape.extend([1, out]);
            reorder(&y, &inverse, &order, 1)?.reshape(&shape)?
        }
        None => y,
    };
    Ok(y.squeeze_axes(&[-2])?)
}

/// DeepSeek-V3's routing (transformers' `DeepseekV3TopkRouter`): the indices `[..., k]` of the
/// experts each token goes to, for its scores `[..., experts]` and the selection bias `bias
/// [experts]`. With `groups` above 1 the experts form `groups` equal groups of consecutive
/// experts, each scored by the sum of its two best biased scores; only the `topk_groups` best
/// groups' experts may be chosen. The choice carries no gradient: the weights are the caller's
/// (the unbiased scores of the chosen experts).
pub fn route_groups(
    scores: &Array,
    bias: &Array,
    k: i32,
    groups: i32,
    topk_groups: i32,
) -> Result<Array> {
    let shape = scores.shape().to_vec();
    let experts = *shape
        .last()
        .ok_or_else(|| Error::Layout("route_groups takes scores of rank 1 or more".into()))?;
    let fits = groups >= 1
        && experts % groups == 0
        && (1..=groups).contains(&topk_groups)
        && (1..=experts).contains(&k)
        && bias.shape() == [experts];
    if !fits {
        return Err(Error::Layout(format!(
            "route_groups needs scores [.., experts], bias [experts], experts in equal groups, \
             1 <= topk_groups <= groups and 1 <= k <= experts; got scores {shape:?}, bias {:?}, \
             k {k}, groups {groups}, topk_groups {topk_groups}",
            bias.shape()
        )));
    }
    let last = scores.ndim() as i32 - 1;
    let choice = mlx_rs::stop_gradient(&scores.add(bias)?)?;
    let choice = if groups > 1 && topk_groups < groups {
        let per_group = experts / groups;
        let mut grouped = shape[..shape.len() - 1].to_vec();
        grouped.extend([groups, per_group]);
        let by_group = choice.reshape(&grouped)?;
        let best = per_group.min(2);
        let (top, _) = super::top_k(&by_group, best)?;
        let group_scores = top.sum_axis(-1, None)?; // [..., groups]
        let (_, kept) = super::top_k(&group_scores, topk_groups)?; // [..., topk_groups]
        let ids = Array::arange::<_, i32>(None, groups, None)?;
        let open = kept
            .expand_dims(-1)?
            .eq(&ids)?
            .any_axis(-2, None)? // [..., groups]
            .expand_dims(-1)?;
        let masked = ops::select(&open, &by_group, Array::from_f32(f32::NEG_INFINITY))?;
        masked.reshape(&shape)?
    } else {
        choice
    };
    let order = ops::argpartition_axis(choice.negative()?, k - 1, last)?;
    Ok(order.take_axis(Array::arange::<_, i32>(None, k, None)?, last)?)
}

/// The Switch Transformer's load-balancing loss over `probs [..., experts]` (the router's
/// softmax) and `indices [..., k]` (its choices), as transformers' `load_balancing_loss_func`:
/// `experts * sum_e f_e P_e`, where `f_e` is the fraction of choices that picked expert `e` per
/// choice slot and `P_e` the mean probability of `e`. `f` comes from the choices and carries no
/// gradient.
pub fn balance_loss(probs: &Array, indices: &Array) -> Result<Array> {
    let (loads, tokens, experts) = loads(probs, indices)?;
    let mean_prob = probs.reshape(&[-1, experts])?.mean_axis(0, false)?;
    let scale = scalar(experts as f32 / tokens as f32, Dtype::Float32)?;
    Ok(loads
        .multiply(&mean_prob.as_dtype(Dtype::Float32)?)?
        .sum(false)?
        .multiply(&scale)?)
}

/// How many choices picked each expert (float32 `[experts]`), the token count and the expert
/// count.
fn loads(probs: &Array, indices: &Array) -> Result<(Array, usize, i32)> {
    let experts = *probs
        .shape()
        .last()
        .ok_or_else(|| Error::Layout("the router's probabilities have no expert axis".into()))?;
    let tokens = probs.size() / experts.max(1) as usize;
    let classes = Array::arange::<_, i32>(None, experts, None)?;
    let picks = indices
        .as_dtype(Dtype::Int32)?
        .reshape(&[-1, 1])?
        .eq(&classes)?
        .as_dtype(Dtype::Float32)?;
    Ok((picks.sum_axis(0, false)?, tokens.max(1), experts))
}

/// `y` unchanged; in the backward pass the router's probabilities also receive `coef` times the
/// gradient of [`balance_loss`]`(probs, indices)`.
pub fn balance(y: &Array, probs: &Array, indices: &Array, coef: f32) -> Result<Array> {
    let inputs = [y.clone(), probs.clone(), indices.clone()];
    custom_vjp::apply(&Balance { coef }, &inputs)?
        .pop()
        .ok_or_else(|| Error::Layout("the balancing loss returned nothing".into()))
}

/// [`balance`]'s custom function over `[y, probs, indices]`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Balance {
    coef: f32,
}

impl WithGradient for Balance {
    const NAME: &'static str = "the router's balancing loss";

    fn forward(&self, inputs: &[Array]) -> Result<Vec<Array>> {
        let y = inputs.first().ok_or_else(|| arity(inputs.len()))?;
        Ok(vec![y.clone()])
    }

    /// `dy` passes through; `d loss / d probs[t, e] = experts * load_e / tokens^2`, where
    /// `load_e` counts the choices of `e` (the loss is linear in the mean probabilities).
    fn vjp(&self, primals: &[Array], cotangents: &[Array]) -> Result<Vec<Array>> {
        let [_, probs, indices] = primals else {
            return Err(arity(primals.len()));
        };
        let dy = cotangents
            .first()
            .ok_or_else(|| Error::Layout("the balancing loss got no cotangent".into()))?;
        let (loads, tokens, experts) = loads(probs, indices)?;
        let scale = self.coef * experts as f32 / (tokens as f32 * tokens as f32);
        let dprobs = loads
            .multiply(scalar(scale, Dtype::Float32)?)?
            .as_dtype(probs.dtype())?;
        let dprobs = ops::broadcast_to(&dprobs, probs.shape())?;
        Ok(vec![dy.clone(), dprobs, ops::zeros_like(indices)?])
    }
}

fn arity(count: usize) -> Error {
    Error::Layout(format!(
        "the balancing loss takes [y, probs, indices], got {count} arrays"
    ))
}
