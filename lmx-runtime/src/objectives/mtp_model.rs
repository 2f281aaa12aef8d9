//! A base model with multi-token heads as one model of the runtime: [`Mtp<M>`] is a
//! [`LanguageModel`] whose parameters are `M`'s and the heads' ([`MtpParams`]) and whose forward
//! pass is `M`'s, and [`MtpStep<S>`] trains it with lmxlab's total loss under step `S`'s
//! optimizer and options. The heads are then trained parameters of the compiled step like any
//! other, with optimizer state, checkpointed and resumed by the trainer as a plain run's are.
//!
//! The base model's leaves keep their own names (the heads' are under `mtp_heads.`), the
//! configuration is the base's with `n_predict` and `mtp_weight` beside its fields, and `M`'s
//! initialisation draws from the same seed: a checkpoint's base weights are exactly a plain
//! model's, and the heads never take part in generation.

use super::mtp::{mtp_losses, Backbone, MtpHead, MtpLosses};
use crate::error::{Error, Result};
use crate::model::{Context, LanguageModel, TrainingStep};
use crate::nn::init::Keys;
use crate::train::Objective;
use crate::tree::{FieldAttrs, Layer, LayerMut, LeafSpec, Scope, Tree};
use mlx_rs::Array;
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::marker::PhantomData;
use std::rc::Rc;

/// The name under which the heads' leaves are (`mtp_heads.0.proj.weight`).
pub const HEADS_FIELD: &str = "mtp_heads";

/// Whether a checkpoint's tensor `name` belongs to the heads rather than to the base model.
pub fn is_head_tensor(name: &str) -> bool {
    name.strip_prefix(HEADS_FIELD)
        .is_some_and(|rest| rest.starts_with('.'))
}

/// The most heads a run may declare (each names a metric, `mtp_loss_K`).
pub const MAX_N_PREDICT: usize = 8;

/// The heads' initialisation draws from the run's seed mixed with this, so that the base
/// model's draws are the plain model's (`M::init(seed)`) and the heads' differ from them.
const HEADS_SEED: u64 = 0x6d74_705f_6865_6164;

/// The configuration of a base model with heads: the base's own fields, and lmxlab's two.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(bound(serialize = "C: Serialize", deserialize = "C: DeserializeOwned"))]
pub struct MtpConfig<C> {
    /// The base model's configuration (its fields at the top level, so that the recorded
    /// configuration reads as the base model's).
    #[serde(flatten)]
    pub base: C,
    /// How many heads: head `k` predicts the token `k` places after the next one.
    pub n_predict: usize,
    /// The weight of the heads' mean loss in the total.
    pub mtp_weight: f32,
}

impl<C> MtpConfig<C> {
    /// `base` with lmxlab's defaults (two heads, weight 0.3).
    pub fn new(base: C) -> MtpConfig<C> {
        MtpConfig {
            base,
            n_predict: super::mtp::DEFAULT_N_PREDICT,
            mtp_weight: super::mtp::DEFAULT_MTP_WEIGHT,
        }
    }
}

/// A base model's parameters `P` and the heads'.
#[derive(Clone, Debug, PartialEq)]
pub struct MtpParams<P, T = Array> {
    /// The base model's parameters, named as the base model names them.
    pub base: P,
    /// The heads, `mtp_heads.0`, `mtp_heads.1`, ...
    pub mtp_heads: Vec<MtpHead<T>>,
}

impl<T, P: Tree<T>> Tree<T> for MtpParams<P, T> {
    type Of<U> = MtpParams<P::Of<U>, U>;

    fn for_each<'a>(&'a self, f: &mut dyn FnMut(&'a T)) {
        self.base.for_each(f);
        self.mtp_heads.for_each(f);
    }

    fn for_each_mut(&mut self, f: &mut dyn FnMut(&mut T)) {
        self.base.for_each_mut(f);
        self.mtp_heads.for_each_mut(f);
    }

    fn map<U>(&self, f: &mut dyn FnMut(&T) -> U) -> MtpParams<P::Of<U>, U> {
        MtpParams {
            base: self.base.map(f),
            mtp_heads: self.mtp_heads.map(f),
        }
    }

    fn map_same(&self, f: &mut dyn FnMut(&T) -> T) -> Self {
        MtpParams {
            base: self.base.map_same(f),
            mtp_heads: self.mtp_heads.map_same(f),
        }
    }

    fn describe(&self, scope: &Scope, out: &mut Vec<LeafSpec>) {
        self.base.describe(scope, out);
        let heads = scope.child(HEADS_FIELD, FieldAttrs::default());
        self.mtp_heads.describe(&heads, out);
    }

    fn for_each_layer<'a>(&'a self, scope: &Scope, f: &mut dyn FnMut(&Scope, Layer<'a, T>)) {
        self.base.for_each_layer(scope, f);
        let heads = scope.child(HEADS_FIELD, FieldAttrs::default());
        self.mtp_heads.for_each_layer(&heads, f);
    }

    fn for_each_layer_mut(&mut self, scope: &Scope, f: &mut dyn FnMut(&Scope, LayerMut<'_, T>)) {
        self.base.for_each_layer_mut(scope, f);
        let heads = scope.child(HEADS_FIELD, FieldAttrs::default());
        self.mtp_heads.for_each_layer_mut(&heads, f);
    }
}

/// Base model `M` with multi-token heads (lmxlab's `MultiTokenPrediction(model, n_predict,
/// mtp_weight)`), as a model of the runtime. Its forward pass is the base model's alone.
pub struct Mtp<M>(PhantomData<M>);

impl<M: Backbone> LanguageModel for Mtp<M> {
    type Config = MtpConfig<M::Config>;
    type Params = MtpParams<M::Params>;
    const NAME: &'static str = M::NAME;

    fn presets() -> &'static [&'static str] {
        M::presets()
    }

    fn preset(name: &str) -> Option<Self::Config> {
        M::preset(name).map(MtpConfig::new)
    }

    fn validate(config: &Self::Config) -> Result<()> {
        M::validate(&config.base)?;
        if !(1..=MAX_N_PREDICT).contains(&config.n_predict) {
            return Err(Error::Config(format!(
                "n_predict = {}: multi-token prediction takes 1 to {MAX_N_PREDICT} heads",
                config.n_predict
            )));
        }
        if !(config.mtp_weight.is_finite() && config.mtp_weight >= 0.0) {
            return Err(Error::Config(format!(
                "mtp_weight = {}: the heads' weight is a finite number of at least 0",
                config.mtp_weight
            )));
        }
        let (width, heads) = (
            M::hidden_size(&config.base),
            super::mtp::mtp_attention_heads::<M>(&config.base),
        );
        if width % heads != 0 {
            return Err(Error::Config(format!(
                "a multi-token head's block splits the hidden size {width} into {heads} \
                 attention heads (half the model's), which does not divide it"
            )));
        }
        Ok(())
    }

    fn init(config: &Self::Config, seed: u64) -> Result<Self::Params> {
        Self::validate(config)?;
        let base = M::init(&config.base, seed)?;
        let mut keys = Keys::from_seed(seed ^ HEADS_SEED)?;
        let width = M::hidden_size(&config.base);
        let mtp_heads = (0..config.n_predict)
            .map(|_| MtpHead::init(width, &mut keys))
            .collect::<Result<_>>()?;
        Ok(MtpParams { base, mtp_heads })
    }

    fn forward(
        params: &Self::Params,
        config: &Self::Config,
        tokens: &Array,
        ctx: &mut Context,
    ) -> Result<Array> {
        M::forward(&params.base, &config.base, tokens, ctx)
    }

    fn vocab_size(config: &Self::Config) -> usize {
        M::vocab_size(&config.base)
    }

    fn context_len(config: &Self::Config) -> usize {
        M::context_len(&config.base)
    }
}

/// The losses of a batch `[tokens, targets]` for a model with heads.
pub fn batch_losses<M: Backbone>(
    params: &MtpParams<M::Params>,
    config: &MtpConfig<M::Config>,
    batch: &[Array],
    key: Option<&Array>,
) -> Result<MtpLosses> {
    let [tokens, targets] = batch else {
        return Err(Error::Layout(format!(
            "multi-token prediction takes tokens and targets, got {} inputs",
            batch.len()
        )));
    };
    mtp_losses::<M>(
        &params.base,
        &config.base,
        &params.mtp_heads,
        config.mtp_weight,
        tokens,
        targets,
        key,
    )
}

/// Step `S`'s model trained with multi-token heads: `S`'s optimizer, clipping and accumulation,
/// lmxlab's total loss.
pub struct MtpStep<S>(PhantomData<S>);

impl<S: TrainingStep> TrainingStep for MtpStep<S>
where
    S::Model: Backbone,
{
    type Model = Mtp<S::Model>;
    type Optimizer = S::Optimizer;
    const NAME: &'static str = "mtp";

    fn optimizer() -> S::Optimizer {
        S::optimizer()
    }

    fn options() -> crate::step::StepOptions {
        S::options()
    }

    fn loss(
        params: &MtpParams<<S::Model as LanguageModel>::Params>,
        config: &MtpConfig<<S::Model as LanguageModel>::Config>,
        batch: &[Array],
        key: Option<&Array>,
    ) -> Result<Array> {
        Ok(batch_losses::<S::Model>(params, config, batch, key)?.total)
    }
}

/// The metrics a run with heads reports beside its total loss.
static METRICS: [&str; 2 + MAX_N_PREDICT] = [
    "main_loss",
    "mtp_loss",
    "mtp_loss_1",
    "mtp_loss_2",
    "mtp_loss_3",
    "mtp_loss_4",
    "mtp_loss_5",
    "mtp_loss_6",
    "mtp_loss_7",
    "mtp_loss_8",
];

/// Multi-token prediction as a run's [`Objective`]: [`MtpStep`]'s loss, with the main loss,
/// the heads' mean and each head's loss as metrics (`main_loss`, `mtp_loss`, `mtp_loss_K`)
/// computed in the same compiled step. No frozen models.
pub fn mtp<M: Backbone>(config: &MtpConfig<M::Config>) -> Objective<Mtp<M>> {
    let loss = move |params: &MtpParams<M::Params>,
                     config: &MtpConfig<M::Config>,
                     _frozen: &[Array],
                     batch: &[Array],
                     key: Option<&Array>|
          -> Result<Vec<Array>> {
        let losses = batch_losses::<M>(params, config, batch, key)?;
        let mut out = vec![losses.total, losses.main, losses.mtp];
        out.extend(losses.heads);
        Ok(out)
    };
    Objective {
        name: "mtp",
        frozen: Vec::new(),
        loss: Rc::new(loss),
        metrics: &METRICS[..2 + config.n_predict.min(MAX_N_PREDICT)],
        mean_over_targets: true,
    }
}
