//! The host boundary: arrays in, a forward pass or a loss over tensors, an array out.
//!
//! These are the only conversions from [`Tensor`] back to [`Array`]. Each takes host arrays,
//! runs the given function over them as tensors and returns its result as an array, outside any
//! tensor code: the code `#[lmx::model]` and `#[lmx::step]` generate calls them to implement
//! [`LanguageModel::forward`](crate::model::LanguageModel::forward) and
//! [`TrainingStep::loss`](crate::model::TrainingStep::loss), and a program may call them to run a
//! forward pass eagerly.

use super::{graph, Context, Tensor};
use crate::error::{Error, Result};
use crate::model;
use crate::tree::Tree;
use crate::Array;

/// The logits of `forward` over `params` and `tokens` (`[B, T]`): attention reads and extends
/// `ctx`'s cache, and `ctx` advances past the tokens (as generated `.lmx` code does).
pub fn forward<P: Tree<Array>>(
    params: &P,
    tokens: &Array,
    ctx: &mut model::Context,
    forward: impl FnOnce(&P::Of<Tensor>, &Tensor, &mut Context<'_>) -> Result<Tensor>,
) -> Result<Array> {
    let tokens = Tensor(tokens.clone());
    let logits = forward(&graph(params), &tokens, &mut Context::new(ctx))?;
    ctx.advance(tokens.dim(-1));
    Ok(logits.0)
}

/// The loss `loss` computes over `params` and the `N` arrays of `batch`, with dropout drawing
/// from `key` (off when `None`); `step` names the step in the error for a batch of another size.
pub fn loss<P: Tree<Array>, const N: usize>(
    step: &str,
    params: &P,
    batch: &[Array],
    key: Option<&Array>,
    loss: impl FnOnce(&P::Of<Tensor>, [Tensor; N], &mut Context<'_>) -> Result<Tensor>,
) -> Result<Array> {
    let batch = tensors::<N>(step, batch)?;
    let mut ctx = model::Context::for_step(key);
    Ok(loss(&graph(params), batch, &mut Context::new(&mut ctx))?.0)
}

/// [`loss`] for a step that reports metrics of its own: `loss` returns the loss and then the
/// metrics, in the order the step declares them.
pub fn loss_and_metrics<P: Tree<Array>, const N: usize>(
    step: &str,
    params: &P,
    batch: &[Array],
    key: Option<&Array>,
    loss: impl FnOnce(&P::Of<Tensor>, [Tensor; N], &mut Context<'_>) -> Result<Vec<Tensor>>,
) -> Result<Vec<Array>> {
    let batch = tensors::<N>(step, batch)?;
    let mut ctx = model::Context::for_step(key);
    let values = loss(&graph(params), batch, &mut Context::new(&mut ctx))?;
    Ok(values.into_iter().map(|value| value.0).collect())
}

/// [`loss_and_metrics`] for a step that writes buffers (`#[lmx::step(buffers)]`): after the
/// loss and the metrics, the next value of every buffer leaf of `params` in traversal order
/// (the value `loss`'s forward passes wrote, else the buffer as it is).
pub fn loss_metrics_and_buffers<P: Tree<Array>, const N: usize>(
    step: &str,
    params: &P,
    batch: &[Array],
    key: Option<&Array>,
    loss: impl FnOnce(&P::Of<Tensor>, [Tensor; N], &mut Context<'_>) -> Result<Vec<Tensor>>,
) -> Result<Vec<Array>> {
    let batch = tensors::<N>(step, batch)?;
    let mut ctx = model::Context::for_step(key);
    // The writes are keyed by the leaves of this very tree, which outlives the loss.
    let tree = graph(params);
    let values = loss(&tree, batch, &mut Context::new(&mut ctx))?;
    let mut values: Vec<Array> = values.into_iter().map(|value| value.0).collect();
    values.extend(ctx.buffer_values(&tree, |leaf: &Tensor| leaf.0.clone())?);
    Ok(values)
}

/// The `N` arrays of a step's batch as tensors.
fn tensors<const N: usize>(step: &str, batch: &[Array]) -> Result<[Tensor; N]> {
    batch
        .iter()
        .cloned()
        .map(Tensor)
        .collect::<Vec<_>>()
        .try_into()
        .map_err(|batch: Vec<Tensor>| {
            Error::Layout(format!(
                "step `{step}` takes {N} inputs, got {}",
                batch.len()
            ))
        })
}
