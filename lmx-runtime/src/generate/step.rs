//! The compiled decode step: one token through the model and the sampler as one traced MLX
//! function over a declared state, as the training step is compiled over its state.
//!
//! Built op by op, every token re-records the whole graph of the forward pass on the host, which
//! bounds small models and fast devices by the host (GPT-2 124M at about 0.55 ms of host work a
//! token on an H100). The step is instead traced once per shape bucket and replayed:
//!
//! - inputs: the parameters' leaves, the token `[1, 1]`, its position (an int32 scalar), the
//!   sampler's state (its random key, then the recent tokens its penalties look at), every
//!   attention layer's key and value buffers `[1, heads, capacity, head_dim]` and every recurrent
//!   slot's state ([`super::state`]);
//! - outputs: the next token, the sampler's next state, the buffers with this token's keys and
//!   values written at its position and the recurrent states after it.
//!
//! Nothing in the trace depends on the position's value: RoPE reads it as an array, learned
//! positions are gathered at it, the keys and values are written with a dynamic-offset update (on
//! CUDA by decode attention itself) and attention reads the buffers' whole capacity, the slots past the token masked ([`KvCache`]'s
//! traced form). A trace holds for its input shapes, the bucket: the buffers' capacity, grown in
//! blocks of [`KvCache::STEP`] before the step that needs room (MLX traces again for the new
//! shape and keeps the old trace), and, while a penalty's look-back window is still filling, its
//! length. The parameters are inputs, not captured constants, and the configuration and sampling
//! settings are fixed for the step's life: a new generation makes a new step.
//!
//! Prefill (many tokens at once, chunked), batched generation and speculative verification run
//! eagerly: their token counts change from call to call, each a new shape that a trace would not
//! be reused for.

use super::cache::KvCache;
use super::ring::Ring;
use super::sampler::Sampler;
use super::state::RecurrentStates;
use crate::error::{Error, Result};
use crate::model::{Context, LanguageModel};
use crate::nn;
use crate::tree::{flatten, Tree};
use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::transforms::{async_eval, compile::compile};
use mlx_rs::Array;
use std::cell::Cell;
use std::rc::Rc;

type Traced = Box<dyn FnMut(&[Array]) -> std::result::Result<Vec<Array>, Exception>>;

/// One sequence's compiled decode step for a model, its configuration and sampling settings.
pub(crate) struct DecodeStep {
    function: Traced,
    /// The parameters' leaves: the first inputs of every call.
    params: Vec<Array>,
    /// How many arrays the sampler's state holds.
    state_len: usize,
    /// How many recurrent slots the model's forward pass runs (their states are the last inputs).
    recurrent: usize,
    /// Times the step was traced.
    traces: Rc<Cell<usize>>,
}

impl DecodeStep {
    /// The step of `M` with `params` and `config`, sampling as `sampler` does (its settings; its
    /// state is an input of every call).
    /// The layers whose buffers are rings are those of `rings`, `bound` the ring of every causal
    /// layer of a bounded cache, and `recurrent` is the number of recurrent slots (all the
    /// prefilled cache's).
    pub(crate) fn new<M: LanguageModel>(
        params: &M::Params,
        config: &M::Config,
        sampler: &Sampler,
        rings: Vec<Option<Ring>>,
        bound: Option<Ring>,
        recurrent: usize,
    ) -> DecodeStep {
        let leaves = flatten(params);
        let leaf_count = leaves.len();
        let state_len = sampler.state().len();
        let template = params.clone();
        let config = config.clone();
        let sampler = sampler.clone();
        let traces = Rc::new(Cell::new(0));
        let counter = Rc::clone(&traces);
        // MLX calls the body only to trace it.
        let body = move |inputs: &[Array]| -> Result<Vec<Array>> {
            counter.set(counter.get() + 1);
            let (leaves, rest) = inputs.split_at(leaf_count);
            let params = with_leaves(&template, leaves);
            let (token, position) = (&rest[0], &rest[1]);
            let (state, rest) = rest[2..].split_at(state_len);
            let (buffers, states) = rest.split_at(rest.len() - recurrent);
            let cache = KvCache::traced(buffers.to_vec(), position, rings.clone(), bound)?;
            let (logits, cached) = traced_forward::<M>(&params, &config, token, cache, states)?;
            let mut sampler = sampler.clone();
            sampler.set_state(state);
            let mut outputs = vec![sampler.next(&logits.index((0, -1)))?];
            outputs.extend(sampler.state());
            outputs.extend(cached);
            Ok(outputs)
        };
        let pure = move |inputs: &[Array]| body(inputs).map_err(Error::into_exception);
        DecodeStep {
            function: Box::new(compile(pure, false)),
            params: leaves,
            state_len,
            recurrent,
            traces,
        }
    }

    /// Queues the token after `token` (a scalar) at `ctx`'s position: its keys and values go into
    /// `ctx`'s cache (grown first if full) and `sampler` takes up its next state. `ctx` is a
    /// generation context whose cache the prompt's prefill filled.
    pub(crate) fn step(
        &mut self,
        ctx: &mut Context,
        sampler: &mut Sampler,
        token: &Array,
    ) -> Result<Array> {
        let cache = ctx.cache_mut().ok_or_else(|| {
            Error::Layout("a decode step needs a generation context's cache".into())
        })?;
        cache.reserve(cache.len + 1)?;
        let mut inputs = self.params.clone();
        inputs.push(token.reshape(&[1, 1])?);
        inputs.push(Array::from_int(cache.len));
        inputs.extend(sampler.state());
        inputs.extend(cache.take_buffers());
        inputs.extend(cache.states.take_all());
        let called = (self.function)(&inputs);
        let mut outputs = match called {
            Ok(outputs) => outputs,
            Err(err) => {
                let mut buffers = inputs.split_off(self.params.len() + 2 + self.state_len);
                let states = buffers.split_off(buffers.len() - self.recurrent);
                cache.states = RecurrentStates::from_arrays(states);
                cache.put_buffers(buffers, 0);
                return Err(err.into());
            }
        };
        // The cache's old buffers are now held by the step's graph alone, which may then write
        // this token's keys and values into them in place.
        drop(inputs);
        let states = outputs.split_off(outputs.len() - self.recurrent);
        cache.states = RecurrentStates::from_arrays(states);
        cache.put_buffers(outputs.split_off(1 + self.state_len), 1);
        sampler.set_state(&outputs[1..]);
        async_eval(&outputs)?;
        Ok(outputs.swap_remove(0))
    }

    /// Times the step was traced: once per shape bucket it met.
    pub(crate) fn traces(&self) -> usize {
        self.traces.get()
    }
}

/// The forward pass of a compiled decode step's body over `tokens`, without gradients, at
/// `cache` (a traced one) carrying the recurrent `states`: the logits, and the cache's buffers
/// and states after it, the step's outputs that feed the next call.
pub(crate) fn traced_forward<M: LanguageModel>(
    params: &M::Params,
    config: &M::Config,
    tokens: &Array,
    mut cache: KvCache,
    states: &[Array],
) -> Result<(Array, Vec<Array>)> {
    cache.states = RecurrentStates::from_arrays(states.to_vec());
    let mut ctx = Context::with_cache(cache);
    let logits = nn::without_gradients(|| M::forward(params, config, tokens, &mut ctx))?;
    let mut cached = Vec::new();
    if let Some(cache) = ctx.cache_mut() {
        cached.extend(cache.take_buffers());
        cached.extend(cache.states.take_all());
    }
    Ok((logits, cached))
}

/// `template` (parameters) with its leaves replaced by `leaves`, in [`flatten`]'s order: the
/// traced inputs a compiled step's body computes with.
pub(crate) fn with_leaves<P: Tree<Array> + Clone>(template: &P, leaves: &[Array]) -> P {
    let mut params = template.clone();
    let mut leaves = leaves.iter();
    params.for_each_mut(&mut |leaf| {
        if let Some(input) = leaves.next() {
            *leaf = input.clone();
        }
    });
    params
}
