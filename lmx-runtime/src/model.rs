//! What a language model offers the trainer, the generator and the CLI.
//!
//! Models written in `.lmx` files and under `#[lmx::model]` implement [`LanguageModel`] in their
//! generated code; the runtime is written once against it.

use crate::error::Result;
use crate::tree::Tree;
use mlx_rs::Array;
use serde::{de::DeserializeOwned, Serialize};

/// A causal language model: configuration, typed parameters, initialisation and forward pass.
pub trait LanguageModel: 'static {
    /// The model's static configuration (serde, so that checkpoints record it).
    type Config: Clone + std::fmt::Debug + Serialize + DeserializeOwned + 'static;
    /// The typed parameter tree, with `Array` leaves.
    type Params: Tree<Array> + Clone + 'static;

    /// The model's name, as the CLI lists it.
    const NAME: &'static str;

    /// The names of the presets, in declaration order.
    fn presets() -> &'static [&'static str];

    /// The configuration of preset `name`.
    fn preset(name: &str) -> Option<Self::Config>;

    /// Fresh parameters for `config`, drawn from `seed`.
    fn init(config: &Self::Config, seed: u64) -> Result<Self::Params>;

    /// Logits `[B, T, vocab]` for tokens `[B, T]`; attention reads and extends `ctx`'s cache.
    fn forward(
        params: &Self::Params,
        config: &Self::Config,
        tokens: &Array,
        ctx: &mut Context,
    ) -> Result<Array>;

    /// The vocabulary size of `config`.
    fn vocab_size(config: &Self::Config) -> usize;

    /// The longest context `config` supports.
    fn context_len(config: &Self::Config) -> usize;

    /// Training FLOPs per token at sequence length `seq_len` (forward and backward), for MFU:
    /// by default `6 N` for `N` parameters; models add their attention term.
    fn flops_per_token(params: &Self::Params, _config: &Self::Config, _seq_len: usize) -> f64 {
        let mut count = 0usize;
        params.for_each(&mut |leaf| count += leaf.size());
        6.0 * count as f64
    }
}

/// Per-call state of a forward pass: the key-value cache during generation, none in training.
#[derive(Default)]
pub struct Context {
    cache: Option<KvCache>,
}

impl Context {
    /// A forward pass over whole sequences, as in training.
    pub fn training() -> Context {
        Context { cache: None }
    }

    /// A forward pass that keeps the keys and values of every attention layer across calls.
    pub fn generation() -> Context {
        Context {
            cache: Some(KvCache {
                layers: Vec::new(),
                len: 0,
            }),
        }
    }

    /// The position of the first token of this call: how many tokens the cache already holds.
    pub fn offset(&self) -> i32 {
        self.cache.as_ref().map_or(0, |cache| cache.len)
    }

    /// Attention of layer `layer` with causal masking: `q`, `k`, `v` are `[B, heads, T, head_dim]`
    /// (keys and values may have fewer heads); `k` and `v` are appended to the cache first.
    pub fn attend(&mut self, layer: usize, q: &Array, k: &Array, v: &Array) -> Result<Array> {
        let Some(cache) = self.cache.as_mut() else {
            return crate::nn::attention(q, k, v, crate::nn::AttentionMask::Causal);
        };
        let (k, v) = cache.extend(layer, k, v)?;
        // A single new query sees every cached key; several see a causal window over the new ones.
        let mask = if q.shape()[2] > 1 {
            crate::nn::AttentionMask::Causal
        } else {
            crate::nn::AttentionMask::None
        };
        crate::nn::attention(q, &k, &v, mask)
    }

    /// The keys and values that layer `layer`'s queries see, `[B, heads, T_k, head_dim]`: during
    /// generation `k` and `v` are appended to the cache first and the whole cache is returned;
    /// in training they are returned as they are. (For attention masked otherwise than causally.)
    pub fn keys_values(&mut self, layer: usize, k: &Array, v: &Array) -> Result<(Array, Array)> {
        match self.cache.as_mut() {
            Some(cache) => cache.extend(layer, k, v),
            None => Ok((k.clone(), v.clone())),
        }
    }

    /// Marks `tokens` new tokens as consumed (called once per forward pass by generated code).
    pub fn advance(&mut self, tokens: i32) {
        if let Some(cache) = self.cache.as_mut() {
            cache.len += tokens;
        }
    }
}

/// Keys and values of every attention layer so far.
#[derive(Clone)]
struct KvCache {
    layers: Vec<Option<(Array, Array)>>,
    len: i32,
}

impl KvCache {
    fn extend(&mut self, layer: usize, k: &Array, v: &Array) -> Result<(Array, Array)> {
        if self.layers.len() <= layer {
            self.layers.resize(layer + 1, None);
        }
        let slot = &mut self.layers[layer];
        let next = match slot.take() {
            Some((k0, v0)) => (
                mlx_rs::ops::concatenate(&[k0, k.clone()], 2)?,
                mlx_rs::ops::concatenate(&[v0, v.clone()], 2)?,
            ),
            None => (k.clone(), v.clone()),
        };
        *slot = Some(next.clone());
        Ok(next)
    }
}

/// A training step declared with a model (in a `.lmx` file's `step` or by `#[lmx::step]`): its
/// optimizer, how the step runs, and its loss. The compiled state it reads and writes is
/// `TrainState<<Self::Model as LanguageModel>::Params, Self::Optimizer>`, fixed by these types.
pub trait TrainingStep: 'static {
    /// The model the step trains.
    type Model: LanguageModel;
    /// The optimizer the declaration names, with its hyperparameters.
    type Optimizer: crate::optim::Optimizer;

    /// The step's name (`train` for `step train { ... }`).
    const NAME: &'static str;

    /// The optimizer with the declared hyperparameters (the learning rate comes from the schedule).
    fn optimizer() -> Self::Optimizer;

    /// Clipping and accumulation as declared; `compile` is on.
    fn options() -> crate::step::StepOptions;

    /// The loss of one (micro-)batch: `batch` holds the declared inputs in order.
    fn loss(
        params: &<Self::Model as LanguageModel>::Params,
        config: &<Self::Model as LanguageModel>::Config,
        batch: &[Array],
        key: &Array,
    ) -> Result<Array>;
}
