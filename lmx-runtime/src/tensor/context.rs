//! The forward pass's context over tensors: attention through the KV cache, positions, dropout.

use super::Tensor;
use crate::error::Result;
use crate::model;

/// What a forward pass over tensors threads through its layers: the runtime's
/// [`model::Context`] (the key-value cache during generation, the dropout key in a training
/// step) and the number of attention calls so far, which decides each call's cache slot.
pub struct Context<'a> {
    inner: &'a mut model::Context,
    attention: usize,
}

impl<'a> Context<'a> {
    /// The context of one forward pass (or one step's loss) over `inner`.
    pub(crate) fn new(inner: &'a mut model::Context) -> Context<'a> {
        Context {
            inner,
            attention: 0,
        }
    }

    /// The position of this call's first token: `0` in training, the number of tokens already
    /// in the cache during generation (where RoPE and learned positions start).
    pub fn offset(&self) -> i32 {
        self.inner.offset()
    }

    /// Causal attention over `[B, heads, T, head_dim]` queries, keys and values (keys and
    /// values may have fewer heads: grouped-query attention). During generation `k` and `v` go
    /// into the cache first and the queries attend to every position it holds.
    ///
    /// Each call takes the next cache slot, so a forward pass makes one call per attention
    /// layer, in the same order on every call (as a loop over the layers does).
    pub fn attend(&mut self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        let layer = self.attention;
        self.attention += 1;
        Ok(Tensor(self.inner.attend(layer, &q.0, &k.0, &v.0)?))
    }

    /// Dropout with probability `p` in `[0, 1)`: in a training step each call draws a fresh mask
    /// from the step's random key; in evaluation, validation and generation it is the identity.
    pub fn dropout(&mut self, x: &Tensor, p: f32) -> Result<Tensor> {
        Ok(Tensor(crate::nn::dropout(&x.0, p, self.inner)?))
    }
}
