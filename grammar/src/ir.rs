//! The checked model: what the checker proved, in the form the report and code generator use.
//!
//! Sizes stay as static expressions (evaluated per preset with [`crate::eval`]);
//! forward bodies stay as syntax (every name and call in them has been resolved
//! and typed by the checker, so the code generator may rely on that).

use crate::ast::{self, Expr};
use crate::dim::Dim;
use crate::eval::{Env, Value};
use crate::types::{StaticTy, TensorTy};

/// A model that passed every check.
#[derive(Debug, Clone)]
pub struct CheckedModel {
    /// The source tree.
    pub ast: ast::Model,
    /// The model's name.
    pub name: String,
    /// Configuration entries in order.
    pub config: Vec<ConfigItem>,
    /// Every preset's full configuration; the first is `default` (the declared defaults).
    pub presets: Vec<PresetValues>,
    /// Blocks, in declaration order.
    pub blocks: Vec<BlockIr>,
    /// The model's parameter tree.
    pub params: ParamTree,
    /// Facts about the model's own forward pass.
    pub forward: FnFacts,
    /// Training steps.
    pub steps: Vec<StepIr>,
    /// What the checker learned about each expression.
    pub typed: Typed,
}

impl CheckedModel {
    /// The configuration of a preset by name (`default` for the declared defaults).
    pub fn preset(&self, name: &str) -> Option<&PresetValues> {
        self.presets.iter().find(|p| p.name == name)
    }

    /// A block by name.
    pub fn block(&self, name: &str) -> Option<&BlockIr> {
        self.blocks.iter().find(|b| b.name == name)
    }
}

/// One configuration entry.
#[derive(Debug, Clone)]
pub struct ConfigItem {
    /// Its name.
    pub name: String,
    /// Its type.
    pub ty: StaticTy,
    /// Whether it is computed from other entries (and so not settable).
    pub derived: bool,
    /// The default or the defining expression.
    pub value: Expr,
}

/// A preset's complete configuration.
#[derive(Debug, Clone)]
pub struct PresetValues {
    /// The preset's name.
    pub name: String,
    /// Every config value (settings and derived) and enum variant.
    pub values: Env,
}

impl PresetValues {
    /// An integer config value.
    pub fn int(&self, name: &str) -> Option<i64> {
        match self.values.get(name) {
            Some(Value::Int(i)) => Some(*i),
            _ => None,
        }
    }
}

/// A checked block.
#[derive(Debug, Clone)]
pub struct BlockIr {
    /// Its name.
    pub name: String,
    /// Static arguments: name, type and default.
    pub args: Vec<(String, StaticTy, Option<Expr>)>,
    /// Its parameters.
    pub params: ParamTree,
    /// Facts about its forward pass.
    pub forward: FnFacts,
}

/// An ordered tree of named parameters.
#[derive(Debug, Clone, Default)]
pub struct ParamTree {
    /// Entries in declaration order.
    pub entries: Vec<ParamEntry>,
}

/// One named entry of a parameter tree.
#[derive(Debug, Clone)]
pub struct ParamEntry {
    /// The entry's name (one segment of the dotted name).
    pub name: String,
    /// A static condition for the entry to exist.
    pub guard: Option<Expr>,
    /// What it holds.
    pub node: ParamNode,
    /// The training masks its marks set for every leaf below it.
    pub marks: Marks,
}

/// What an entry's marks (`frozen`, `no_decay`) say, as the runtime's `FieldAttrs` does for a
/// `#[lmx::model]` field.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Marks {
    /// No gradient, no optimizer state, no update.
    pub frozen: bool,
    /// No weight decay.
    pub no_decay: bool,
}

/// A library layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// `embedding(count, dim)`: `weight [count, dim]`.
    Embedding,
    /// `linear(input, output, bias = true, std = 0.0, lora_rank = 0, lora_scale = 20.0)`:
    /// `weight [output, input]`, `bias [output]`; a `lora_rank` above 0 adds a low-rank adapter,
    /// `lora_a [input, lora_rank]`, `lora_b [lora_rank, output]`, and then only adapters train.
    Linear,
    /// `layer_norm(dim, eps = 1e-5, bias = true)`: `weight [dim]`, `bias [dim]`.
    LayerNorm,
    /// `rms_norm(dim, eps = 1e-6, offset = 0.0)`: `weight [dim]`, scaling by `offset + weight`.
    RmsNorm,
    /// `experts(dim, hidden, count)`: sparse SwiGLU experts (mlx-lm's `SwitchGLU`),
    /// `gate_proj.weight`, `up_proj.weight [count, hidden, dim]`, `down_proj.weight [count, dim,
    /// hidden]`; called with `(x, indices)`.
    Experts,
}

impl LayerKind {
    /// The layer's name in `.lmx`.
    pub fn name(self) -> &'static str {
        match self {
            LayerKind::Embedding => "embedding",
            LayerKind::Linear => "linear",
            LayerKind::LayerNorm => "layer_norm",
            LayerKind::RmsNorm => "rms_norm",
            LayerKind::Experts => "experts",
        }
    }

    /// The layer for a `.lmx` name.
    pub fn from_name(name: &str) -> Option<LayerKind> {
        [
            LayerKind::Embedding,
            LayerKind::Linear,
            LayerKind::LayerNorm,
            LayerKind::RmsNorm,
            LayerKind::Experts,
        ]
        .into_iter()
        .find(|k| k.name() == name)
    }

    /// Argument names in positional order, each with its type and default.
    pub fn signature(self) -> &'static [(&'static str, ArgTy, Option<&'static str>)] {
        match self {
            LayerKind::Embedding => &[
                ("count", ArgTy::Int, None),
                ("dim", ArgTy::Int, None),
                ("std", ArgTy::Float, Some("0.0")),
            ],
            LayerKind::Linear => &[
                ("input", ArgTy::Int, None),
                ("output", ArgTy::Int, None),
                ("bias", ArgTy::Bool, Some("true")),
                ("std", ArgTy::Float, Some("0.0")),
                ("lora_rank", ArgTy::Int, Some("0")),
                ("lora_scale", ArgTy::Float, Some("20.0")),
            ],
            LayerKind::LayerNorm => &[
                ("dim", ArgTy::Int, None),
                ("eps", ArgTy::Float, Some("1e-5")),
                ("bias", ArgTy::Bool, Some("true")),
            ],
            LayerKind::RmsNorm => &[
                ("dim", ArgTy::Int, None),
                ("eps", ArgTy::Float, Some("1e-6")),
                ("offset", ArgTy::Float, Some("0.0")),
            ],
            LayerKind::Experts => &[
                ("dim", ArgTy::Int, None),
                ("hidden", ArgTy::Int, None),
                ("count", ArgTy::Int, None),
            ],
        }
    }
}

/// The type of a layer argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgTy {
    /// A size.
    Int,
    /// A float such as `eps`.
    Float,
    /// A flag such as `bias`.
    Bool,
}

/// What a parameter entry holds.
#[derive(Debug, Clone)]
pub enum ParamNode {
    /// A library layer with its arguments resolved to names (every argument present).
    Layer {
        /// Which layer.
        kind: LayerKind,
        /// `(argument name, value)` in signature order.
        args: Vec<(String, Expr)>,
    },
    /// A raw tensor.
    Tensor {
        /// Its shape.
        shape: Vec<Expr>,
        /// Initialiser name and arguments (`normal`, `zeros`, `ones`, `uniform`).
        init: Init,
        /// A `buffer[..]`: state, not a parameter (no gradient, optimizer state or decay),
        /// whose next value a training step's forward pass may give.
        buffer: bool,
    },
    /// One block instance.
    Block {
        /// The block.
        block: String,
        /// Its arguments by name.
        args: Vec<(String, Expr)>,
    },
    /// A list of block instances.
    List {
        /// The block.
        block: String,
        /// Its arguments by name (may use `var`).
        args: Vec<(String, Expr)>,
        /// The element variable of `[B(..) for i in a..b]`.
        var: Option<String>,
        /// First index (0 for `[B; n]`).
        start: Box<Expr>,
        /// One past the last index.
        end: Box<Expr>,
    },
    /// A nested group.
    Group(ParamTree),
    /// A weight shared with another entry (no parameters of its own).
    Tied {
        /// Dotted path of the shared entry, relative to the model root.
        target: Vec<String>,
    },
}

/// A raw tensor's initialiser.
#[derive(Debug, Clone)]
pub struct Init {
    /// `normal`, `uniform`, `zeros` or `ones`.
    pub name: String,
    /// Its arguments by name.
    pub args: Vec<(String, Expr)>,
}

/// Facts gathered while checking a forward pass, for the cost report.
#[derive(Debug, Clone, Default)]
pub struct FnFacts {
    /// Every `attention(...)` call.
    pub attention: Vec<AttentionSite>,
    /// Every recurrent call (`ssd`, `causal_conv1d`): each holds a state in the generation cache.
    pub scans: Vec<ScanSite>,
    /// The shape of every tensor the forward pass produces (an upper bound on saved activations).
    pub activations: Vec<Vec<Dim>>,
    /// Whether it draws random numbers (dropout).
    pub uses_rng: bool,
    /// The probability of every `dropout(...)` call, a static expression.
    pub dropout: Vec<Expr>,
    /// The declared input shapes.
    pub inputs: Vec<TensorTy>,
    /// The weights each token multiplies by in gathered expert products (`switch_glu`: only
    /// the chosen experts' matrices, unlike a linear layer's whole weight).
    pub gathered_weights: Vec<Dim>,
    /// The buffers it gives a next value (`next gate.bias = ..`), as written.
    pub buffer_writes: Vec<String>,
    /// The same for each call of an `experts` layer, by the layer's name: counted only where the
    /// layer exists (a guarded one may not, where the call sits in a branch not taken).
    pub experts_calls: Vec<(String, Dim)>,
}

/// One attention call: `q [.., heads, q_len, head_dim]`, `k [.., kv_heads, kv_len, head_dim]`.
#[derive(Debug, Clone)]
pub struct AttentionSite {
    /// Query heads.
    pub heads: Dim,
    /// Key and value heads (fewer than `heads` in grouped-query attention).
    pub kv_heads: Dim,
    /// Query length.
    pub q_len: Dim,
    /// Key length.
    pub kv_len: Dim,
    /// Head width.
    pub head_dim: Dim,
    /// Whether it is causal (halves the work).
    pub causal: bool,
}

/// A recurrent call, whose state a generation cache carries from one call to the next (one
/// recurrent slot per call, in order).
#[derive(Debug, Clone)]
pub struct ScanSite {
    /// What it computes.
    pub kind: ScanKind,
    /// The state's shape after the batch axis: `[H, P, N]` for `ssd`, `[K - 1, C]` for
    /// `causal_conv1d`, `[H, Dk, Dv]` for `gated_delta`.
    pub state: Vec<Dim>,
    /// The state's dtype: float32 for `ssd` whatever its inputs', the input's for a convolution.
    pub dtype: crate::ast::Dtype,
    /// Forward FLOPs per token of the chunked (training) form.
    pub flops: Dim,
}

/// The recurrences of the built-in table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanKind {
    /// `ssd(x, dt, a, b, c, chunk)`: Mamba-2's state space recurrence.
    Ssd,
    /// `causal_conv1d(x, weight, bias)`: the last `K - 1` inputs.
    Conv,
    /// `gated_delta(q, k, v, g, beta, chunk)`: Gated DeltaNet's delta rule.
    GatedDelta,
}

/// A checked training step.
#[derive(Debug, Clone)]
pub struct StepIr {
    /// The step's name.
    pub name: String,
    /// Batch inputs.
    pub inputs: Vec<(String, TensorTy)>,
    /// The optimizer.
    pub optimizer: OptimizerIr,
    /// Micro-batches accumulated per update.
    pub accumulate: Expr,
    /// The clip threshold, when gradients are clipped.
    pub clip: Option<Expr>,
    /// Names of the scalar metrics the step returns.
    pub metrics: Vec<String>,
    /// The `grad(..)` call's span and its argument: the loss the step differentiates.
    pub loss: Option<(crate::span::Span, Expr)>,
    /// The metric naming the loss, if any.
    pub loss_metric: Option<String>,
    /// The metric naming the gradient norm, if any.
    pub norm_metric: Option<String>,
    /// The step's own metrics (neither the loss nor the gradient norm), in the order listed:
    /// scalars the loss's computation returns after the loss.
    pub reported: Vec<String>,
    /// The frozen models the step declares, in the order of its compiled state.
    pub frozen: Vec<FrozenIr>,
    /// The compiled state, in its fixed order.
    pub state: Vec<StateSlot>,
}

/// A frozen model a step declares: an input of the compiled step with no gradients and no
/// optimizer state.
#[derive(Debug, Clone, PartialEq)]
pub struct FrozenIr {
    /// The name the step calls it by.
    pub name: String,
    /// Where its parameters come from.
    pub source: FrozenSourceIr,
    /// The name where it is declared.
    pub span: crate::span::Span,
}

/// Where a frozen model's parameters come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrozenSourceIr {
    /// `policy`: a copy of the model's parameters as the run starts.
    Policy,
}

/// An optimizer.
#[derive(Debug, Clone)]
pub struct OptimizerIr {
    /// Which one.
    pub kind: OptimizerKind,
    /// Its hyper-parameters by name.
    pub args: Vec<(String, Expr)>,
}

/// The optimizers lmx-runtime provides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptimizerKind {
    /// Stochastic gradient descent with optional momentum.
    Sgd,
    /// Adam.
    Adam,
    /// AdamW (decoupled weight decay).
    AdamW,
    /// Lion.
    Lion,
    /// Adafactor: second moments factored into row and column statistics.
    Adafactor,
}

/// The default of an optimizer setting, which also gives its type.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SettingDefault {
    /// A float setting.
    Float(f64),
    /// A flag.
    Bool(bool),
    /// A float setting that is off unless given (Adafactor's `beta1`).
    Unset,
}

impl OptimizerKind {
    /// The optimizer's `.lmx` name.
    pub fn name(self) -> &'static str {
        match self {
            OptimizerKind::Sgd => "sgd",
            OptimizerKind::Adam => "adam",
            OptimizerKind::AdamW => "adamw",
            OptimizerKind::Lion => "lion",
            OptimizerKind::Adafactor => "adafactor",
        }
    }

    /// All optimizers.
    pub const ALL: [OptimizerKind; 5] = [
        OptimizerKind::Sgd,
        OptimizerKind::Adam,
        OptimizerKind::AdamW,
        OptimizerKind::Lion,
        OptimizerKind::Adafactor,
    ];

    /// Hyper-parameters and their defaults.
    pub fn hyper_parameters(self) -> &'static [(&'static str, SettingDefault)] {
        use SettingDefault::{Bool, Float, Unset};
        match self {
            OptimizerKind::Sgd => &[("momentum", Float(0.0)), ("weight_decay", Float(0.0))],
            OptimizerKind::Adam => &[
                ("beta1", Float(0.9)),
                ("beta2", Float(0.999)),
                ("eps", Float(1e-8)),
            ],
            OptimizerKind::AdamW => &[
                ("beta1", Float(0.9)),
                ("beta2", Float(0.999)),
                ("eps", Float(1e-8)),
                ("weight_decay", Float(0.01)),
            ],
            OptimizerKind::Lion => &[
                ("beta1", Float(0.9)),
                ("beta2", Float(0.99)),
                ("weight_decay", Float(0.0)),
            ],
            // MLX's Adafactor defaults; `eps_square` and `eps_scale` are MLX's `eps` pair.
            OptimizerKind::Adafactor => &[
                ("eps_square", Float(1e-30)),
                ("eps_scale", Float(1e-3)),
                ("clip_threshold", Float(1.0)),
                ("decay_rate", Float(-0.8)),
                ("beta1", Unset),
                ("weight_decay", Float(0.0)),
                ("scale_parameter", Bool(true)),
                ("relative_step", Bool(true)),
                ("warmup_init", Bool(false)),
            ],
        }
    }

    /// Per-parameter moments the optimizer keeps (each the shape of the parameter, except
    /// Adafactor's second moment: a row and a column vector for a matrix).
    pub fn moments(self) -> &'static [&'static str] {
        match self {
            OptimizerKind::Sgd => &["momentum"],
            OptimizerKind::Adam | OptimizerKind::AdamW => &["m", "v"],
            OptimizerKind::Lion => &["m"],
            OptimizerKind::Adafactor => &["second"],
        }
    }
}

/// One part of a step's compiled state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateSlot {
    /// The parameter tree.
    Params,
    /// A per-parameter optimizer moment tree (`m`, `v`, `momentum`, Adafactor's `second`).
    Moment(&'static str),
    /// Accumulated gradients, when `accumulate` is more than one micro-batch.
    GradAccum,
    /// The step counter (a scalar).
    Step,
    /// The learning rate for this step (a scalar input set by the schedule).
    LearningRate,
    /// The random key (when the forward pass draws random numbers).
    Rng,
    /// A frozen model's parameters (inputs only: no gradients, no optimizer state).
    Frozen(String),
    /// The buffers the forward passes write (`next`): read, and written after the update with
    /// the values the loss's forward passes gave them, without gradients.
    Buffers,
}

/// What the checker learned about expressions, read by the code generator (the role of rustc's
/// `TypeckResults`): keyed by the expression's span, which is unique per expression of a model.
#[derive(Debug, Clone, Default)]
pub struct Typed {
    /// Every call of a built-in: the entry, the form and the bound arguments.
    pub calls: std::collections::HashMap<crate::span::Span, CallIr>,
}

impl Typed {
    /// The checked call at `span`.
    pub fn call(&self, span: crate::span::Span) -> Option<&CallIr> {
        self.calls.get(&span)
    }
}

/// A checked call of a built-in.
#[derive(Debug, Clone)]
pub struct CallIr {
    /// The table entry.
    pub builtin: &'static crate::builtins::Builtin,
    /// Which of its forms applies.
    pub form: Form,
    /// For each parameter (the tensor form's, in order; the static form's positions), the index
    /// of the call's argument bound to it, `None` where the default applies.
    pub args: Vec<Option<usize>>,
}

/// The form of a built-in a call uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// Over tensors: lowered to MLX operations.
    Tensor,
    /// Over static values: lowered to plain Rust arithmetic on the configuration.
    Static,
}
