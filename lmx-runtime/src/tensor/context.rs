//! The forward pass's context over tensors: attention through the KV cache, positions, dropout.

use super::Tensor;
use crate::error::Result;
use crate::model;

/// How [`Context::attend_with`] masks and scales its scores: `causal: true` with the rest
/// unset is what [`Context::attend`] does; the default masks nothing.
#[derive(Clone, Copy, Default)]
pub struct AttentionOptions<'a> {
    /// Each query sees only itself and earlier keys.
    pub causal: bool,
    /// The factor applied to `q k^T` (`1/sqrt(head_dim)` when `None`).
    pub scale: Option<f32>,
    /// A query sees only keys fewer than `window` positions away.
    pub window: Option<i32>,
    /// An additive bias broadcast against the scores `[B, heads, T_q, T_k]`.
    pub bias: Option<&'a Tensor>,
    /// The scaled scores are soft-capped to `(-cap, cap)` before the mask and softmax.
    pub softcap: Option<f32>,
}

/// What a forward pass over tensors threads through its layers: the runtime's
/// [`model::Context`] (the key-value cache during generation, the dropout key in a training
/// step) and the number of attention and recurrent calls so far, which decide each call's cache
/// slot.
pub struct Context<'a> {
    inner: &'a mut model::Context,
    attention: usize,
    recurrent: usize,
}

impl<'a> Context<'a> {
    /// The context of one forward pass (or one step's loss) over `inner`.
    pub(crate) fn new(inner: &'a mut model::Context) -> Context<'a> {
        Context {
            inner,
            attention: 0,
            recurrent: 0,
        }
    }

    /// `f` over a context of its own, without dropout or cache: how a step runs a frozen model
    /// it declares (`#[lmx::step(frozen(reference = policy))]`), which is evaluated, never
    /// trained.
    pub fn frozen<R>(f: impl FnOnce(&mut Context<'_>) -> R) -> R {
        let mut inner = model::Context::evaluation();
        f(&mut Context::new(&mut inner))
    }

    /// The position of this call's first token, an int32 scalar: `0` in training, the number of
    /// tokens already in the cache during generation (where RoPE and learned positions start).
    /// A tensor, not a host integer: a compiled decode step is traced once for many tokens, and
    /// reads the offset as one of its inputs.
    pub fn offset(&self) -> Tensor {
        Tensor(self.inner.position())
    }

    /// Causal attention over `[B, heads, T, head_dim]` queries, keys and values (keys and
    /// values may have fewer heads: grouped-query attention). During generation `k` and `v` go
    /// into the cache first and the queries attend to every position it holds.
    ///
    /// Each call takes the next cache slot, so a forward pass makes one call per attention
    /// layer, in the same order on every call (as a loop over the layers does).
    pub fn attend(&mut self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        let layer = self.next_layer();
        Ok(Tensor(self.inner.attend(layer, &q.0, &k.0, &v.0)?))
    }

    /// Attention as [`attend`](Self::attend) does it, masked and scaled as `options` say: a
    /// sliding window, an additive bias (ALiBi) over every key the queries see, a scale other than
    /// `1/sqrt(head_dim)`, or no causal mask.
    pub fn attend_with(
        &mut self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        options: AttentionOptions<'_>,
    ) -> Result<Tensor> {
        let layer = self.next_layer();
        let options = crate::nn::AttentionOptions {
            causal: options.causal,
            scale: options.scale,
            window: options.window,
            bias: options.bias.map(|bias| &bias.0),
            softcap: options.softcap,
        };
        Ok(Tensor(crate::nn::attend(
            self.inner, layer, &q.0, &k.0, &v.0, options,
        )?))
    }

    /// The cache slot of the next attention call.
    fn next_layer(&mut self) -> usize {
        self.attention += 1;
        self.attention - 1
    }

    /// Mamba-2's selective state space recurrence (see [`crate::nn::ssd_chunked`]): `x [B, T, H,
    /// P]`, positive steps `dt [B, T, H]`, negative rates `a [H]`, `b` and `c [B, T, G, N]`.
    /// Chunked over a sequence; during generation its state lives in the cache's next recurrent
    /// slot and one new position runs the step form.
    pub fn ssd(
        &mut self,
        x: &Tensor,
        dt: &Tensor,
        a: &Tensor,
        b: &Tensor,
        c: &Tensor,
        chunk: i32,
    ) -> Result<Tensor> {
        let slot = self.next_recurrent();
        Ok(Tensor(crate::nn::ssd(
            self.inner, slot, &x.0, &dt.0, &a.0, &b.0, &c.0, chunk,
        )?))
    }

    /// The gated delta rule (see [`crate::nn::gated_delta_steps`]): `q` and `k [B, T, H, Dk]`,
    /// `v [B, T, H, Dv]`, log decays `g` and write strengths `beta [B, T, H]`; chunked over a
    /// sequence, its state `[B, H, Dk, Dv]` in the cache's next recurrent slot in generation.
    #[allow(clippy::too_many_arguments)]
    pub fn gated_delta(
        &mut self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        g: &Tensor,
        beta: &Tensor,
        chunk: i32,
    ) -> Result<Tensor> {
        let slot = self.next_recurrent();
        Ok(Tensor(crate::nn::gated_delta(
            self.inner, slot, &q.0, &k.0, &v.0, &g.0, &beta.0, chunk,
        )?))
    }

    /// A depthwise causal convolution of `x [B, T, C]` (`weight [C, 1, K]`, `bias [C]`), whose last
    /// `K - 1` inputs the cache's next recurrent slot keeps during generation.
    pub fn causal_conv1d(
        &mut self,
        x: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
    ) -> Result<Tensor> {
        let slot = self.next_recurrent();
        Ok(Tensor(crate::nn::conv_causal(
            self.inner,
            slot,
            &x.0,
            &weight.0,
            bias.map(|b| &b.0),
        )?))
    }

    /// The cache slot of the next recurrent call.
    fn next_recurrent(&mut self) -> usize {
        self.recurrent += 1;
        self.recurrent - 1
    }

    /// A linear layer (`tensor::nn::linear`) whose adapter's dropout (mlx-lm's
    /// `lora_parameters.dropout`) is on in a training step, its mask drawn from the step's key;
    /// elsewhere the same as `tensor::nn::linear`.
    pub fn linear(
        &mut self,
        params: &crate::nn::LinearParams<Tensor>,
        x: &Tensor,
    ) -> Result<Tensor> {
        Ok(Tensor(crate::nn::linear_in(
            &super::arrays(params),
            &x.0,
            self.inner,
        )?))
    }

    /// Linear layers applied to one input, as [`linear`](Self::linear) applies each: attention's
    /// query, key and value projections. Where that pays (plain layers, one of them narrow, over
    /// many rows on a GPU) they are one product over the concatenated weights, split back, as a
    /// `.lmx` model's calls of linear layers on one input are (`nn::linears_in`).
    pub fn linears<const N: usize>(
        &mut self,
        params: [&crate::nn::LinearParams<Tensor>; N],
        x: &Tensor,
    ) -> Result<[Tensor; N]> {
        let layers = params.map(super::arrays);
        let outputs = crate::nn::linears_in(layers.each_ref(), &x.0, self.inner)?;
        Ok(outputs.map(Tensor))
    }

    /// `residual + layer(x)`, as [`linear`](Self::linear) then the sum compute it; in decoding
    /// one launch that adds the residual as it writes the layer's output, as a `.lmx` model's
    /// `x + block(..)` over a block whose last call is a linear layer is (`nn::linear_plus_in`).
    pub fn linear_plus(
        &mut self,
        params: &crate::nn::LinearParams<Tensor>,
        x: &Tensor,
        residual: &Tensor,
    ) -> Result<Tensor> {
        let input = crate::nn::LayerInput::Plain(&x.0);
        self.layer_plus(params, input, Some(residual))
    }

    /// A linear layer of a gated MLP's product, `layer(activation(gate) * up)`, plus `residual`
    /// where given, as [`linear`](Self::linear) over the product computes it
    /// (`tensor::nn::swiglu` for SiLU), then the sum; in decoding one launch that activates the
    /// layer's input as it reads it (and adds the residual as it writes), as a `.lmx` model's
    /// `down_proj(silu(gate) * up)` is (`nn::linear_plus_in`).
    pub fn gated_linear(
        &mut self,
        params: &crate::nn::LinearParams<Tensor>,
        activation: crate::nn::Activation,
        (gate, up): (&Tensor, &Tensor),
        residual: Option<&Tensor>,
    ) -> Result<Tensor> {
        let input = crate::nn::LayerInput::Gated(activation, &gate.0, &up.0);
        self.layer_plus(params, input, residual)
    }

    /// A linear layer of an activated input, `layer(activation(x))`, plus `residual` where
    /// given, as [`linear`](Self::linear) over the activation computes it, then the sum; in
    /// decoding one launch, as a `.lmx` model's `c_proj(gelu_approx(h))` is
    /// (`nn::linear_plus_in`).
    pub fn activated_linear(
        &mut self,
        params: &crate::nn::LinearParams<Tensor>,
        activation: crate::nn::Activation,
        x: &Tensor,
        residual: Option<&Tensor>,
    ) -> Result<Tensor> {
        let input = crate::nn::LayerInput::Activated(activation, &x.0);
        self.layer_plus(params, input, residual)
    }

    /// `nn::linear_plus_in` of `input`, with `residual` added (no dropout) where given.
    fn layer_plus(
        &mut self,
        params: &crate::nn::LinearParams<Tensor>,
        input: crate::nn::LayerInput<'_>,
        residual: Option<&Tensor>,
    ) -> Result<Tensor> {
        let residual = residual.map(|r| crate::nn::Residual::new(&r.0, 0.0));
        Ok(Tensor(crate::nn::linear_plus_in(
            &super::arrays(params),
            input,
            residual,
            self.inner,
        )?))
    }

    /// Stacked experts (`tensor::nn::experts`) whose adapters' dropout is on in a training step,
    /// its masks drawn from the step's key; elsewhere the same as `tensor::nn::experts`.
    pub fn experts(
        &mut self,
        params: &crate::nn::SwitchGluParams<Tensor>,
        x: &Tensor,
        indices: &Tensor,
    ) -> Result<Tensor> {
        Ok(Tensor(crate::nn::experts_in(
            &super::arrays(params),
            &x.0,
            &indices.0,
            self.inner,
        )?))
    }

    /// Dropout with probability `p` in `[0, 1)`: in a training step each call draws a fresh mask
    /// from the step's random key; in evaluation, validation and generation it is the identity.
    pub fn dropout(&mut self, x: &Tensor, p: f32) -> Result<Tensor> {
        Ok(Tensor(crate::nn::dropout(&x.0, p, self.inner)?))
    }

    /// Gives `buffer`, a leaf of the parameters this pass reads whose field is a buffer
    /// (`#[lmx(role = buffer)]`), its next value: a step declared with
    /// `#[lmx::step(buffers)]` writes it into its state after the update; this pass goes on
    /// reading `buffer`. Dropped outside a step (evaluation, generation, a frozen model's pass).
    pub fn write_buffer(&mut self, buffer: &Tensor, value: &Tensor) -> Result<()> {
        self.inner.write_buffer(buffer, &value.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(shape: &[i32], seed: u64) -> Tensor {
        let key = mlx_rs::random::key(seed).unwrap();
        Tensor(mlx_rs::random::normal::<f32>(shape, None, None, &key).unwrap())
    }

    fn max_gap(a: &Tensor, b: &Tensor) -> f32 {
        a.0.subtract(&b.0)
            .unwrap()
            .abs()
            .unwrap()
            .max(None)
            .unwrap()
            .item_exact::<f32>()
    }

    #[test]
    fn attention_options_mask_and_each_call_takes_the_next_slot() -> Result<()> {
        let (q, k, v) = (
            random(&[1, 2, 5, 4], 1),
            random(&[1, 2, 5, 4], 2),
            random(&[1, 2, 5, 4], 3),
        );
        let mut inner = model::Context::evaluation();
        let mut ctx = Context::new(&mut inner);
        let plain = ctx.attend(&q, &k, &v)?;
        let causal = AttentionOptions {
            causal: true,
            ..AttentionOptions::default()
        };
        assert!(max_gap(&plain, &ctx.attend_with(&q, &k, &v, causal)?) < 1e-6);
        // A window of one: each query sees only its own key, so it returns its own value.
        let own = AttentionOptions {
            window: Some(1),
            ..causal
        };
        assert!(max_gap(&v, &ctx.attend_with(&q, &k, &v, own)?) < 1e-5);
        assert_eq!(ctx.attention, 3);
        // Generation: the slots keep each layer's keys apart.
        let mut inner = model::Context::generation();
        {
            let mut ctx = Context::new(&mut inner);
            ctx.attend(&q, &k, &v)?;
            ctx.attend(&q, &v, &k)?;
        }
        inner.advance(5);
        let mut ctx = Context::new(&mut inner);
        let (q1, k1, v1) = (
            random(&[1, 2, 1, 4], 4),
            random(&[1, 2, 1, 4], 5),
            random(&[1, 2, 1, 4], 6),
        );
        let first = ctx.attend(&q1, &k1, &v1)?;
        let keys = Tensor(mlx_rs::ops::concatenate(&[&k.0, &k1.0], 2)?);
        let values = Tensor(mlx_rs::ops::concatenate(&[&v.0, &v1.0], 2)?);
        let full = crate::nn::attention(&q1.0, &keys.0, &values.0, crate::nn::AttentionMask::None)?;
        assert!(max_gap(&first, &Tensor(full)) < 1e-5);
        Ok(())
    }
}
