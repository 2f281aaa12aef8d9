//! What a language model offers the trainer, the generator and the CLI.
//!
//! Models written in `.lmx` files implement [`LanguageModel`] and their steps [`TrainingStep`] in
//! their generated code; a Rust model does through `#[lmx::model(config = .., init = ..,
//! forward = .., vocab_size = ..)]` on its struct and `#[lmx::step(optimizer = ..)]` on its loss,
//! whose generated impls run the user's tensor code through [`crate::tensor::host`]. The
//! runtime (trainer, checkpoints, generation, the CLI) is written once against these traits.

use crate::buffers::BufferWrites;
use crate::error::Result;
use crate::generate::cache::KvCache;
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

    /// Fails with [`Error::Config`](crate::Error::Config), naming the setting at fault, if
    /// `config` breaks a rule of the model (the rules `lmx check` applies to presets: sizes of at
    /// least 1, exact divisions, probabilities in `[0, 1)`, finite numbers). The other methods
    /// may panic or fail inside MLX on such a configuration; [`init`](Self::init), the trainer
    /// and generation call this first.
    fn validate(_config: &Self::Config) -> Result<()> {
        Ok(())
    }

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

    /// Hands every training step the model declares to `visitor`, in declaration order (the
    /// first is its default): a `.lmx` model's `step`s, which a program registers by name this
    /// way (`lmx train --step NAME`) without naming their types. A model written in Rust declares
    /// none here: its program registers its `#[lmx::step]` functions itself.
    fn declared_steps<V: StepVisitor<Self>>(_visitor: &mut V)
    where
        Self: Sized,
    {
    }
}

/// What a model's declared steps are handed to ([`LanguageModel::declared_steps`]), one step
/// type at a time.
pub trait StepVisitor<M: LanguageModel> {
    /// Takes step `S` of model `M`.
    fn visit<S: TrainingStep<Model = M>>(&mut self)
    where
        <M::Params as Tree<Array>>::Of<Option<<S::Optimizer as crate::optim::Optimizer>::Leaf>>:
            Clone + 'static;
}

/// Per-call state of a forward pass: the key-value cache during generation, and in a training
/// step the random key that dropout draws its masks from.
#[derive(Default)]
pub struct Context {
    cache: Option<KvCache>,
    key: Option<Array>,
    /// A training step's buffer writes; `None` where writes are dropped.
    buffers: Option<BufferWrites>,
}

impl Context {
    /// A forward pass over whole sequences with dropout off: validation, evaluation, checks
    /// against a reference.
    pub fn evaluation() -> Context {
        Context::default()
    }

    /// A training step's forward pass over whole sequences: dropout on, its masks drawn from
    /// `key` (a new one for every draw).
    pub fn training(key: &Array) -> Context {
        Context {
            cache: None,
            key: Some(key.clone()),
            buffers: None,
        }
    }

    /// The forward pass of a step's loss: [`Context::training`] with the step's key, or
    /// [`Context::evaluation`] where the loss is evaluated without one (validation). It records
    /// the buffers' writes ([`write_buffer`](Self::write_buffer)), which the step's
    /// [`buffer_values`](Self::buffer_values) returns.
    pub fn for_step(key: Option<&Array>) -> Context {
        let mut context = key.map_or_else(Context::evaluation, Context::training);
        context.buffers = Some(BufferWrites::default());
        context
    }

    /// Gives buffer `leaf` (a leaf of the parameters this pass reads, of role
    /// [`LeafRole::Buffer`](crate::tree::LeafRole::Buffer)) the next value `value`, which a
    /// training step writes into its state after the update; the pass itself goes on reading
    /// `leaf`. Dropped outside a step's loss (evaluation, generation, a frozen model's pass).
    pub fn write_buffer<T>(&mut self, leaf: &T, value: &Array) -> Result<()> {
        match self.buffers.as_mut() {
            Some(buffers) => buffers.record(leaf, value),
            None => Ok(()),
        }
    }

    /// The next value of every buffer leaf of `params` (the tree this context's passes read),
    /// in traversal order: what a pass wrote, else the leaf as it is. What a step that writes
    /// buffers ([`TrainingStep::WRITES_BUFFERS`]) returns after its metrics.
    pub fn buffer_values<T, R: Tree<T>>(
        &self,
        params: &R,
        array: impl Fn(&T) -> Array,
    ) -> Result<Vec<Array>> {
        match &self.buffers {
            Some(buffers) => buffers.values(params, array),
            None => BufferWrites::default().values(params, array),
        }
    }

    /// A forward pass that keeps the keys and values of every attention layer across calls.
    pub fn generation() -> Context {
        Context {
            cache: Some(KvCache::default()),
            key: None,
            buffers: None,
        }
    }

    /// [`generation`](Self::generation) for one sequence that only grows: a sliding-window
    /// layer keeps only its window (a ring of that many slots, as mlx-lm's `RotatingKVCache`), so
    /// its memory is bounded by the window however long the sequence.
    pub fn rotating_generation() -> Context {
        Context {
            cache: Some(KvCache::rotating()),
            key: None,
            buffers: None,
        }
    }

    /// Slots each attention layer's cached keys take (a rotating cache's windowed layers: their
    /// window), in layer order; empty outside generation.
    pub fn cached_slots(&self) -> Vec<i32> {
        self.cache.as_ref().map_or_else(Vec::new, KvCache::slots)
    }

    /// Whether dropout is on: the pass has a key to draw masks from (a training step's).
    pub(crate) fn draws(&self) -> bool {
        self.key.is_some()
    }

    /// A fresh key for the next random draw of this pass, `None` when dropout is off.
    pub(crate) fn next_key(&mut self) -> Result<Option<Array>> {
        let Some(key) = self.key.take() else {
            return Ok(None);
        };
        let (carry, draw) = mlx_rs::random::split(&key, 2)?;
        self.key = Some(carry);
        Ok(Some(draw))
    }

    /// The position of the first token of this call: how many tokens the cache already holds
    /// (on the host; inside a traced decode step this is not the step's position: read
    /// [`position`](Self::position) there).
    pub fn offset(&self) -> i32 {
        self.cache.as_ref().map_or(0, |cache| cache.len)
    }

    /// The position of the first token of this call as an int32 scalar: 0 without a cache, the
    /// cache's filled slots during generation, and in a traced decode step the step's position
    /// input (so that its trace holds for every position).
    pub fn position(&self) -> Array {
        self.cache
            .as_ref()
            .map_or_else(|| Array::from_int(0), KvCache::position)
    }

    /// Where a call of `q_len` tokens' positions start and how many keys its attention sees
    /// (what generated forward passes hand to RoPE, position tables and ALiBi).
    pub fn positions(&self, q_len: i32) -> crate::nn::Positions {
        crate::nn::Positions {
            offset: self.position(),
            keys: self
                .cache
                .as_ref()
                .map_or(q_len, |cache| cache.key_len(q_len)),
            rows: self.cache.as_ref().and_then(KvCache::row_starts),
        }
    }

    /// The position of the first of `q_len` queries that see `k_len` keys (for masks built
    /// over the keys): the cache's position during generation (the step's position input in a
    /// traced step), else the last `q_len` of the keys.
    pub(crate) fn query_start(&self, q_len: i32, k_len: i32) -> Array {
        match &self.cache {
            Some(cache) => cache.position(),
            None => Array::from_int(k_len - q_len),
        }
    }

    /// Attention of layer `layer` with causal masking: `q`, `k`, `v` are `[B, heads, T, head_dim]`
    /// (keys and values may have fewer heads); during generation `k` and `v` are written into the
    /// cache first and the queries attend to every position it holds.
    pub fn attend(&mut self, layer: usize, q: &Array, k: &Array, v: &Array) -> Result<Array> {
        let Some(cache) = self.cache.as_mut() else {
            return crate::nn::causal_attention(q, k, v);
        };
        if let Some(ring) = cache.bound() {
            // A bounded cache's ring: the keys come with their positions, which the mask goes by.
            let (k, v, positions) = cache.extend_ring(layer, k, v, ring)?;
            let queries = crate::nn::positions_after(&cache.position(), q.dim(2))?;
            let mask = crate::generate::ring::visible(&queries, &positions, ring)?;
            return crate::nn::attention(q, &k, &v, crate::nn::AttentionMask::Array(&mask));
        }
        if let Some(slots) = cache.decode_slots(q.dim(2)) {
            return cache.attend_decoding(layer, q, (k, v), &slots);
        }
        let (k, v) = cache.extend(layer, k, v)?;
        if let Some(mask) = cache.mask(q.dim(2), k.dim(2))? {
            return crate::nn::attention(q, &k, &v, crate::nn::AttentionMask::Array(&mask));
        }
        // A single new query sees every cached key; several see a causal window over the new ones.
        let mask = if q.shape()[2] > 1 {
            crate::nn::AttentionMask::Causal
        } else {
            crate::nn::AttentionMask::None
        };
        crate::nn::attention(q, &k, &v, mask)
    }

    /// The keys and values that layer `layer`'s queries see, `[B, heads, T_k, head_dim]`: during
    /// generation `k` and `v` are written into the cache first and its filled part is returned;
    /// in training they are returned as they are. (For attention masked otherwise than causally.)
    pub fn keys_values(&mut self, layer: usize, k: &Array, v: &Array) -> Result<(Array, Array)> {
        match self.cache.as_mut() {
            Some(cache) => cache.extend(layer, k, v),
            None => Ok((k.clone(), v.clone())),
        }
    }

    /// [`keys_values`](Self::keys_values) for a layer whose queries see only the keys fewer than
    /// `window` positions back, with the keys' positions (`[T_k]` int32, -1 for none) where they
    /// are not `0 .. T_k` (a rotating cache's ring, which then also holds every key the queries
    /// may see, so that no padding mask applies).
    pub(crate) fn windowed_keys_values(
        &mut self,
        layer: usize,
        k: &Array,
        v: &Array,
        window: i32,
    ) -> Result<(Array, Array, Option<Array>)> {
        match self.cache.as_mut() {
            Some(cache) => cache.extend_windowed(layer, k, v, window),
            None => Ok((k.clone(), v.clone(), None)),
        }
    }

    /// Which of the keys `[.., T_k, ..]` that [`keys_values`](Self::keys_values) returned the last
    /// `q_len` queries may see, as a boolean `[B, 1, T_q, T_k]`, where rows of a batch start at
    /// different slots ([`KvCache`]'s left padding, causal within each row); `None` otherwise.
    pub fn padding_mask(&mut self, q_len: i32, k_len: i32) -> Result<Option<Array>> {
        match self.cache.as_mut() {
            Some(cache) => cache.mask(q_len, k_len),
            None => Ok(None),
        }
    }

    /// A generation context over `cache` (a batch's rows, or a prompt cache's).
    pub(crate) fn with_cache(cache: KvCache) -> Context {
        Context {
            cache: Some(cache),
            key: None,
            buffers: None,
        }
    }

    /// The generation cache, if this is a generation context.
    pub(crate) fn cache_mut(&mut self) -> Option<&mut KvCache> {
        self.cache.as_mut()
    }

    /// Takes the generation cache out (an empty one stays).
    pub(crate) fn take_cache(&mut self) -> Option<KvCache> {
        self.cache.as_mut().map(std::mem::take)
    }

    /// Marks `tokens` new tokens as consumed (called once per forward pass by generated code).
    pub fn advance(&mut self, tokens: i32) {
        if let Some(cache) = self.cache.as_mut() {
            cache.len += tokens;
        }
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

    /// The loss of one (micro-)batch: `batch` holds the declared inputs in order; `key` is the
    /// step's random key, which dropout draws its masks from, and `None` where the loss is only
    /// evaluated (validation), with dropout off. A step that declares frozen models computes its
    /// loss with them, in [`frozen_loss`](Self::frozen_loss), and refuses to compute it here.
    fn loss(
        params: &<Self::Model as LanguageModel>::Params,
        config: &<Self::Model as LanguageModel>::Config,
        batch: &[Array],
        key: Option<&Array>,
    ) -> Result<Array>;

    /// The frozen models the step declares (`frozen reference = policy` in a `.lmx` step,
    /// `frozen(reference = policy)` under `#[lmx::step]`), in the order of its compiled state:
    /// inputs of the compiled step with no gradients and no optimizer state. Most steps have none.
    const FROZEN: &'static [Frozen] = &[];

    /// The loss of one (micro-)batch over the frozen models: `frozen` holds one parameter tree
    /// per entry of [`FROZEN`](Self::FROZEN), in order
    /// ([`Objective::declared`](crate::train::Objective::declared) passes them). A step without
    /// frozen models computes its [`loss`](Self::loss).
    fn frozen_loss(
        params: &<Self::Model as LanguageModel>::Params,
        config: &<Self::Model as LanguageModel>::Config,
        frozen: &[<Self::Model as LanguageModel>::Params],
        batch: &[Array],
        key: Option<&Array>,
    ) -> Result<Array> {
        debug_assert!(frozen.is_empty(), "a step without frozen models got some");
        Self::loss(params, config, batch, key)
    }

    /// The names of the metrics the step reports beside its loss and gradient norm
    /// (`metrics loss, kl, grad_norm` in a `.lmx` step reports `kl`; `metrics(kl)` under
    /// `#[lmx::step]`), in the order [`loss_and_metrics`](Self::loss_and_metrics) returns them.
    /// Most steps have none.
    const METRICS: &'static [&'static str] = &[];

    /// Whether the step's forward passes write the model's buffers (a `.lmx` forward pass's
    /// `next buffer = value`; `#[lmx::step(buffers)]`): then
    /// [`loss_and_metrics`](Self::loss_and_metrics) returns, after the metrics, the next value of
    /// every buffer leaf of the parameters in traversal order
    /// ([`Context::buffer_values`]), and the compiled step writes them into its state.
    const WRITES_BUFFERS: bool = false;

    /// The loss of one (micro-)batch followed by the [`METRICS`](Self::METRICS), every value a
    /// scalar computed in the same compiled step, then (for a step that
    /// [writes buffers](Self::WRITES_BUFFERS)) the buffers' next values; only the loss is
    /// differentiated. `frozen` is
    /// as for [`frozen_loss`](Self::frozen_loss), which a step without metrics computes here.
    fn loss_and_metrics(
        params: &<Self::Model as LanguageModel>::Params,
        config: &<Self::Model as LanguageModel>::Config,
        frozen: &[<Self::Model as LanguageModel>::Params],
        batch: &[Array],
        key: Option<&Array>,
    ) -> Result<Vec<Array>> {
        Ok(vec![Self::frozen_loss(params, config, frozen, batch, key)?])
    }
}

/// A frozen model a training step declares: a model its loss runs without gradients, whose
/// parameters are inputs of the compiled step and have no optimizer state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frozen {
    /// The name the step calls it by (`reference`).
    pub name: &'static str,
    /// Where its parameters come from.
    pub source: FrozenSource,
}

/// Where a frozen model's parameters come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrozenSource {
    /// A copy of the policy as the run starts (its initialisation or the weights it starts
    /// from, also when it resumes): DPO's and GRPO's reference.
    Policy,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::{attention, AttentionMask};
    use mlx_rs::ops::indexing::IndexOp;
    use mlx_rs::{ops, random};

    /// `x[:, :, start..end]`.
    fn positions(x: &Array, start: i32, end: i32) -> Array {
        x.index((.., .., start..end, ..))
    }

    /// Cached attention over the calls `bounds` cuts the sequence into, against causal attention
    /// over the whole sequence: the cache must hold the same keys and values after each growth.
    fn cached_matches_full(bounds: &[i32]) -> Result<()> {
        let len = *bounds.last().expect("bounds");
        let key = random::key(7)?;
        let (kq, kkv) = random::split(&key, 2)?;
        let q = random::normal::<f32>(&[1, 4, len, 8][..], None, None, &kq)?;
        let kv = random::normal::<f32>(&[2, 1, 2, len, 8][..], None, None, &kkv)?;
        let (k, v) = (kv.index(0), kv.index(1));
        let full = attention(&q, &k, &v, AttentionMask::Causal)?;
        let mut ctx = Context::generation();
        let mut outputs = Vec::new();
        for pair in bounds.windows(2) {
            let (start, end) = (pair[0], pair[1]);
            assert_eq!(ctx.offset(), start);
            outputs.push(ctx.attend(
                0,
                &positions(&q, start, end),
                &positions(&k, start, end),
                &positions(&v, start, end),
            )?);
            ctx.advance(end - start);
        }
        let cached = ops::concatenate(&outputs, 2)?;
        let error = cached
            .subtract(&full)?
            .abs()?
            .max(None)?
            .item_exact::<f32>();
        assert!(error < 1e-5, "bounds {bounds:?}: max error {error:e}");
        Ok(())
    }

    /// Single tokens and short calls that cross the first growth step (256 positions), a call
    /// that straddles it, and a first call longer than one step followed by tokens that cross
    /// the next one (512).
    #[test]
    fn cached_attention_crosses_growth_steps() -> Result<()> {
        let mut singles = vec![0, 1, 6, 250];
        singles.extend(251..=300);
        cached_matches_full(&singles)?;
        cached_matches_full(&[0, 200, 262, 270])?;
        let mut long_first = vec![0, 300, 500];
        long_first.extend(501..=520);
        cached_matches_full(&long_first)
    }
}
