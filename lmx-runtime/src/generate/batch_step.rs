//! The compiled decode step of a batch ([`super::BatchGenerator`]): every row's next token's
//! logits from its last token, as one traced MLX function, as [`super::step`] does for one
//! sequence.
//!
//! - inputs: the parameters' leaves, the tokens `[B, 1]`, the position of the step's slot (an
//!   int32 scalar: the rows share their slots), every row's first slot `[B]` (int32: the padding
//!   mask reads it), every attention layer's key and value buffers `[B, heads, capacity,
//!   head_dim]` and every recurrent slot's state;
//! - outputs: the logits `[B, vocab]`, the buffers with this step's keys and values written at
//!   its slot and the recurrent states after it.
//!
//! A trace holds for its shapes: the number of rows and the buffers' capacity. Rows join and
//! leave a running batch at any step, so the generator rounds its rows up to a bucket (a power
//! of two, at most its batch limit), filling the rest with copies of its first row, whose
//! results it drops: the traces are then at most one per (bucket, capacity block).
//!
//! Sampling stays outside: each row has its own settings, which a trace would fix, and a batch
//! whose rows all decode greedily samples with one `argmax`.

use super::cache::KvCache;
use super::state::RecurrentStates;
use super::step::{traced_forward, with_leaves};
use crate::error::{Error, Result};
use crate::model::LanguageModel;
use crate::tree::{flatten, Tree};
use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::transforms::compile::compile;
use mlx_rs::Array;
use std::cell::Cell;
use std::rc::Rc;

type Traced = Box<dyn FnMut(&[Array]) -> std::result::Result<Vec<Array>, Exception>>;

/// A batch's compiled decode step for a model and its configuration.
pub(crate) struct BatchStep {
    function: Traced,
    /// The parameters' leaves: the first inputs of every call.
    params: Vec<Array>,
    /// How many recurrent slots the model's forward pass runs (their states are the last inputs).
    recurrent: usize,
    /// Times the step was traced.
    traces: Rc<Cell<usize>>,
}

impl BatchStep {
    /// The step of `M` with `params` and `config`, whose forward pass runs `recurrent`
    /// recurrent slots (a prefilled cache's count).
    pub(crate) fn new<M: LanguageModel>(
        params: &M::Params,
        config: &M::Config,
        recurrent: usize,
    ) -> BatchStep {
        let leaves = flatten(params);
        let leaf_count = leaves.len();
        // The tree's shape alone: the trace reads every leaf from its inputs, and a template of
        // the weights themselves would keep them alive after `set_params`.
        let template = params.map_same(&mut |_| Array::from_f32(0.0));
        let config = config.clone();
        let traces = Rc::new(Cell::new(0));
        let counter = Rc::clone(&traces);
        // MLX calls the body only to trace it.
        let body = move |inputs: &[Array]| -> Result<Vec<Array>> {
            counter.set(counter.get() + 1);
            let (leaves, rest) = inputs.split_at(leaf_count);
            let params = with_leaves(&template, leaves);
            let (tokens, position, starts) = (&rest[0], &rest[1], &rest[2]);
            let (buffers, states) = rest[3..].split_at(rest.len() - 3 - recurrent);
            let cache = KvCache::traced_rows(buffers.to_vec(), position, starts)?;
            let (logits, cached) = traced_forward::<M>(&params, &config, tokens, cache, states)?;
            let mut outputs = vec![logits.index((.., -1))];
            outputs.extend(cached);
            Ok(outputs)
        };
        let pure = move |inputs: &[Array]| body(inputs).map_err(Error::into_exception);
        BatchStep {
            function: Box::new(compile(pure, false)),
            params: leaves,
            recurrent,
            traces,
        }
    }

    /// Feeds `tokens` (`[B]`, a row of `cache` each) at the cache's next slot and returns every
    /// row's logits after it (`[B, vocab]`, queued): the keys, values and states go into
    /// `cache`, whose buffers are grown first if full. `cache` is a batch's, filled by its
    /// prompts' prefill.
    pub(crate) fn step(&mut self, cache: &mut KvCache, tokens: &Array) -> Result<Array> {
        cache.reserve(cache.len + 1)?;
        let rows = tokens.dim(0);
        let starts = match cache.starts() {
            Some(starts) => starts,
            None => Array::from_slice(&vec![0; rows as usize], &[rows]),
        };
        let mut inputs = self.params.clone();
        inputs.push(tokens.reshape(&[rows, 1])?);
        inputs.push(Array::from_int(cache.len));
        inputs.push(starts);
        let fixed = inputs.len();
        inputs.extend(cache.take_buffers());
        inputs.extend(cache.states.take_all());
        let called = (self.function)(&inputs);
        let mut outputs = match called {
            Ok(outputs) => outputs,
            Err(err) => {
                let mut buffers = inputs.split_off(fixed);
                let states = buffers.split_off(buffers.len() - self.recurrent);
                cache.states = RecurrentStates::from_arrays(states);
                cache.put_buffers(buffers, 0);
                return Err(err.into());
            }
        };
        // The cache's old buffers are now held by the step's graph alone, which may then write
        // this step's keys and values into them in place.
        drop(inputs);
        let states = outputs.split_off(outputs.len() - self.recurrent);
        cache.states = RecurrentStates::from_arrays(states);
        cache.put_buffers(outputs.split_off(1), 1);
        Ok(outputs.swap_remove(0))
    }

    /// Takes up `params` (the tree it was made for, same shapes): its traces hold, since the
    /// parameters are inputs.
    pub(crate) fn set_params<P: Tree<Array>>(&mut self, params: &P) {
        self.params = flatten(params);
    }

    /// Times the step was traced: once per (rows, capacity) it met.
    pub(crate) fn traces(&self) -> usize {
        self.traces.get()
    }
}
