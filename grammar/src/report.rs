//! Parameter count, per-parameter shapes, FLOPs per token and memory, for one preset.
//!
//! Computed from the checked model: the parameter tree is walked with the
//! preset's values (block arguments, list indices and guards included), and
//! the attention calls and produced tensors the checker recorded are
//! evaluated with the batch and sequence sizes bound.

use std::collections::HashMap;
use std::fmt;

use crate::eval::{eval, Env, Value};
use crate::ir::{
    CheckedModel, FnFacts, FrozenSourceIr, LayerKind, OptimizerKind, ParamNode, ParamTree,
};

/// One parameter tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamShape {
    /// Its dotted name, e.g. `h.0.attn.c_attn.weight`.
    pub name: String,
    /// Its shape.
    pub shape: Vec<u64>,
}

impl ParamShape {
    /// Its number of elements, `None` if that does not fit 64 bits.
    pub fn numel(&self) -> Option<u64> {
        self.shape.iter().try_fold(1u64, |a, b| a.checked_mul(*b))
    }
}

/// Bytes needed to train at a batch size, in f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    /// Parameters.
    pub parameters: u64,
    /// Gradients (one per parameter).
    pub gradients: u64,
    /// Optimizer moments (per the first step's optimizer; AdamW when there is no step).
    pub optimizer: u64,
    /// Every tensor the forward pass produces (an upper bound on what backward keeps).
    pub activations: u64,
    /// The parameters of the first step's frozen models (inputs of the step, nothing more).
    pub frozen: u64,
}

impl Memory {
    /// The sum (checked when the report is made: it fits 64 bits).
    pub fn total(&self) -> u64 {
        self.parameters + self.gradients + self.optimizer + self.activations + self.frozen
    }
}

/// The report for one preset.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The preset's name.
    pub preset: String,
    /// Every parameter tensor in traversal order (tied weights appear once).
    pub params: Vec<ParamShape>,
    /// Total number of parameters.
    pub param_count: u64,
    /// The parameters that train: the adapters where the model has any (the rest is frozen),
    /// else all of them but the buffers.
    pub trainable_count: u64,
    /// The elements of the buffers (`buffer[..]`, counted in `param_count` too): state with no
    /// gradients and no optimizer state.
    pub buffer_count: u64,
    /// The steps whose compiled state writes the buffers (their forward passes' `next`).
    pub buffer_writers: Vec<String>,
    /// Training FLOPs per token: 3 x (2 x weights used in matrix products + attention scores and mixing
    /// + the recurrences' chunked forms).
    pub flops_per_token: u64,
    /// The conventional estimate `6 N + 12 L d T` (as the benchmark anchors compute MFU).
    pub flops_per_token_6n: u64,
    /// Batch size the memory is computed for.
    pub batch: u64,
    /// Sequence length the memory and attention FLOPs are computed for.
    pub seq: u64,
    /// Memory to train at that batch size.
    pub memory: Memory,
    /// Every step's frozen models, in the order of the steps and of their compiled state.
    pub frozen: Vec<FrozenShape>,
}

/// A frozen model a step declares, as its compiled state holds it: parameters with no
/// gradients and no optimizer state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrozenShape {
    /// The step that declares it.
    pub step: String,
    /// Its name in the step.
    pub name: String,
    /// The model it is an instance of.
    pub architecture: String,
    /// Its number of parameters.
    pub param_count: u64,
    /// Its parameters' bytes, in f32.
    pub bytes: u64,
}

/// Why a report cannot be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReportError {
    /// No preset of that name.
    UnknownPreset(String),
    /// A size could not be evaluated (the message says which).
    Eval(String),
    /// A value breaks a rule of every configuration: a size below 1, a dropout probability
    /// outside `[0, 1)` (the message names the value and where it is used).
    Invalid(String),
    /// A quantity of the configuration does not fit 64 bits.
    Overflow {
        /// Which configuration: "preset `huge`", "these settings".
        config: String,
        /// What overflows: `parameter count`, `FLOPs per token`, ...
        quantity: String,
    },
}

impl fmt::Display for ReportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReportError::UnknownPreset(p) => write!(f, "no preset named `{p}`"),
            ReportError::Eval(m) => write!(f, "cannot evaluate a size: {m}"),
            ReportError::Invalid(m) => f.write_str(m),
            ReportError::Overflow { config, quantity } => write!(
                f,
                "with {config}, the {quantity} does not fit in 64 bits (more than {})",
                u64::MAX
            ),
        }
    }
}

impl std::error::Error for ReportError {}

/// The longest block list a report expands.
const MAX_INSTANCES: u64 = 100_000;

/// Config names taken as the sequence length when none is given.
const SEQ_NAMES: [&str; 4] = ["ctx", "max_seq_len", "seq_len", "context"];

/// Computes the report of a preset (`default` for the declared defaults).
/// `seq` defaults to the config's context length (`ctx`, `max_seq_len`, ...).
///
/// Fails on a size below 1 or a dropout probability outside `[0, 1)`
/// ([`ReportError::Invalid`]), and on a quantity that does not fit 64 bits
/// ([`ReportError::Overflow`]) rather than report a saturated number.
pub fn report(
    model: &CheckedModel,
    preset: &str,
    batch: u64,
    seq: Option<u64>,
) -> Result<Report, ReportError> {
    let values = &model
        .preset(preset)
        .ok_or_else(|| ReportError::UnknownPreset(preset.to_string()))?
        .values;
    let mut report = report_values(model, &format!("preset `{preset}`"), values, batch, seq)?;
    report.preset = preset.to_string();
    Ok(report)
}

/// [`report`] for a complete set of config `values` (settings and derived values), which
/// `config` describes in errors ("preset `tiny`", "these settings").
pub fn report_values(
    model: &CheckedModel,
    config: &str,
    values: &Env,
    batch: u64,
    seq: Option<u64>,
) -> Result<Report, ReportError> {
    let overflow = |quantity: &str| ReportError::Overflow {
        config: config.to_string(),
        quantity: quantity.to_string(),
    };
    let seq = seq
        .or_else(|| {
            SEQ_NAMES.iter().find_map(|n| match values.get(*n) {
                Some(Value::Int(i)) => u64::try_from(*i).ok(),
                _ => None,
            })
        })
        .unwrap_or(1);
    let mut walk = Walk {
        model,
        params: Vec::new(),
        matmul_weights: Some(0),
        instances: Vec::new(),
        buffers: Vec::new(),
        frozen: Vec::new(),
    };
    walk.tree(&model.params, values, "")?;
    walk.instances.push((
        String::new(),
        values.clone(),
        absent(&model.params, values)?,
    ));
    let mut sizes = Sizes::new(model, batch, seq);
    let mut attention = Some(0u64);
    let mut activations = Some(0u64);
    let mut layers = 0u64;
    for (block, env, absent) in &walk.instances {
        let facts = if block.is_empty() {
            &model.forward
        } else {
            match model.block(block) {
                Some(b) => &b.forward,
                None => continue,
            }
        };
        let (a, act, gathered) = sizes.facts(facts, env, block, absent)?;
        walk.matmul_weights = walk
            .matmul_weights
            .zip(gathered)
            .and_then(|(w, g)| w.checked_add(g));
        layers += facts.attention.len() as u64;
        attention = attention.zip(a).and_then(|(x, y)| x.checked_add(y));
        activations = activations.zip(act).and_then(|(x, y)| x.checked_add(y));
    }
    let param_count = total_elements(&walk.params).ok_or_else(|| overflow("parameter count"))?;
    let adapter = |p: &&ParamShape| p.name.ends_with(".lora_a") || p.name.ends_with(".lora_b");
    // Buffers and frozen leaves never train: no gradients, no optimizer state.
    let buffer = |p: &&ParamShape| walk.buffers.contains(&p.name);
    let frozen = |p: &&ParamShape| walk.frozen.contains(&p.name);
    let buffers: Vec<ParamShape> = walk.params.iter().filter(buffer).cloned().collect();
    let buffer_count = total_elements(&buffers).ok_or_else(|| overflow("buffer count"))?;
    let trainable: Vec<ParamShape> = if walk.params.iter().any(|p| adapter(&p)) {
        walk.params.iter().filter(adapter).cloned().collect()
    } else {
        walk.params
            .iter()
            .filter(|p| !buffer(p) && !frozen(p))
            .cloned()
            .collect()
    };
    let trainable_count =
        total_elements(&trainable).ok_or_else(|| overflow("trainable parameter count"))?;
    let d_model = values.get("d_model").and_then(Value::as_f64).unwrap_or(0.0) as u64;
    let optimizer = model.steps.first().map(|s| &s.optimizer);
    let optimizer_elements = optimizer_elements(
        optimizer.map_or(OptimizerKind::AdamW, |o| o.kind),
        optimizer.is_some_and(|o| o.args.iter().any(|(name, _)| name == "beta1")),
        &trainable,
    );
    let bytes = 4u64;
    let flops_per_token = walk
        .matmul_weights
        .and_then(|w| w.checked_mul(2)?.checked_add(attention?)?.checked_mul(3))
        .ok_or_else(|| overflow("FLOPs per token"))?;
    let flops_per_token_6n = param_count
        .checked_mul(6)
        .and_then(|n| {
            n.checked_add(
                layers
                    .checked_mul(12)?
                    .checked_mul(d_model)?
                    .checked_mul(seq)?,
            )
        })
        .ok_or_else(|| overflow("6N + 12LdT FLOPs per token"))?;
    let in_bytes = |elements: Option<u64>, quantity: &str| {
        elements
            .and_then(|n| n.checked_mul(bytes))
            .ok_or_else(|| overflow(quantity))
    };
    // A frozen copy of the policy holds every parameter of this preset.
    let frozen: Vec<FrozenShape> = model
        .steps
        .iter()
        .flat_map(|step| {
            step.frozen.iter().map(|f| match f.source {
                FrozenSourceIr::Policy => (step.name.clone(), f.name.clone()),
            })
        })
        .map(|(step, name)| {
            Ok(FrozenShape {
                step,
                name,
                architecture: model.name.clone(),
                param_count,
                bytes: in_bytes(Some(param_count), "frozen model memory")?,
            })
        })
        .collect::<Result<_, ReportError>>()?;
    let first_step = model.steps.first().map(|s| s.name.as_str());
    let frozen_bytes = frozen
        .iter()
        .filter(|f| Some(f.step.as_str()) == first_step)
        .try_fold(0u64, |acc, f| acc.checked_add(f.bytes))
        .ok_or_else(|| overflow("frozen model memory"))?;
    let memory = Memory {
        frozen: frozen_bytes,
        parameters: in_bytes(Some(param_count), "parameter memory")?,
        gradients: in_bytes(Some(trainable_count), "gradient memory")?,
        optimizer: in_bytes(optimizer_elements, "optimizer memory")?,
        activations: in_bytes(activations, "activation memory")?,
    };
    memory
        .parameters
        .checked_add(memory.gradients)
        .and_then(|m| m.checked_add(memory.optimizer))
        .and_then(|m| m.checked_add(memory.activations))
        .and_then(|m| m.checked_add(memory.frozen))
        .ok_or_else(|| overflow("training memory"))?;
    Ok(Report {
        preset: config.to_string(),
        param_count,
        trainable_count,
        buffer_count,
        buffer_writers: model
            .steps
            .iter()
            .filter(|step| step.state.contains(&crate::ir::StateSlot::Buffers))
            .map(|step| step.name.clone())
            .collect(),
        flops_per_token,
        flops_per_token_6n,
        batch,
        seq,
        memory,
        frozen,
        params: walk.params,
    })
}

/// The elements of `params` together, `None` if they do not fit 64 bits.
fn total_elements(params: &[ParamShape]) -> Option<u64> {
    params
        .iter()
        .try_fold(0u64, |acc, p| acc.checked_add(p.numel()?))
}

/// The elements of an optimizer's state for `params`: a moment the shape of every parameter per
/// moment, except Adafactor's second moment, a row and a column vector for each parameter of two
/// or more axes (its first moment exists when `beta1` is given).
/// `None` if the count does not fit 64 bits.
fn optimizer_elements(
    kind: OptimizerKind,
    first_moment: bool,
    params: &[ParamShape],
) -> Option<u64> {
    let count = total_elements(params)?;
    if kind != OptimizerKind::Adafactor {
        return count.checked_mul(kind.moments().len() as u64);
    }
    let second = params.iter().try_fold(0u64, |acc, p| {
        let factored = match p.shape.as_slice() {
            [lead @ .., rows, cols] => {
                let lead = lead.iter().try_fold(1u64, |a, b| a.checked_mul(*b))?;
                lead.checked_mul(rows.checked_add(*cols)?)?
            }
            _ => p.numel()?,
        };
        acc.checked_add(factored)
    })?;
    second.checked_add(if first_moment { count } else { 0 })
}

struct Walk<'a> {
    model: &'a CheckedModel,
    params: Vec<ParamShape>,
    /// `None` once the count no longer fits 64 bits.
    matmul_weights: Option<u64>,
    /// Every block instance with its environment and its entries whose guard does not hold,
    /// for evaluating its forward facts.
    instances: Vec<(String, Env, Vec<String>)>,
    /// The dotted names of the buffers (`buffer[..]`) among `params`.
    buffers: Vec<String>,
    /// The dotted names of the leaves under a `frozen` mark among `params`.
    frozen: Vec<String>,
}

/// The entries of `tree` whose guard does not hold in `env`.
fn absent(tree: &ParamTree, env: &Env) -> Result<Vec<String>, ReportError> {
    let mut out = Vec::new();
    for entry in &tree.entries {
        if let Some(g) = &entry.guard {
            if !flag(g, env)? {
                out.push(entry.name.clone());
            }
        }
    }
    Ok(out)
}

fn int(expr: &crate::ast::Expr, env: &Env) -> Result<u64, ReportError> {
    match eval(expr, env) {
        Ok(Value::Int(i)) => u64::try_from(i).map_err(|_| {
            ReportError::Eval(format!("{} is negative", crate::text::expr_text(expr)))
        }),
        Ok(v) => Err(ReportError::Eval(format!(
            "{} is {v}, not an int",
            crate::text::expr_text(expr)
        ))),
        Err(d) => Err(ReportError::Eval(d.message)),
    }
}

/// A size: an int of at least 1, else an error naming the expression (with the definition of a
/// derived config value) and `what` it sizes.
fn size(
    model: &CheckedModel,
    expr: &crate::ast::Expr,
    env: &Env,
    what: &str,
) -> Result<u64, ReportError> {
    let value = match eval(expr, env) {
        Ok(Value::Int(i)) => i,
        Ok(v) => {
            return Err(ReportError::Eval(format!(
                "{} is {v}, not an int",
                crate::text::expr_text(expr)
            )))
        }
        Err(d) => return Err(ReportError::Eval(d.message)),
    };
    match u64::try_from(value) {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(ReportError::Invalid(format!(
            "`{}` is {value}, a size of `{what}`; sizes must be at least 1",
            described(model, expr)
        ))),
    }
}

/// An expression as text; a derived config value with its definition (`kv_dim = n_kv_heads *
/// head_dim`), so that a message about it names the settings it comes from.
fn described(model: &CheckedModel, expr: &crate::ast::Expr) -> String {
    let text = crate::text::expr_text(expr);
    match &expr.kind {
        crate::ast::ExprKind::Name(name) => model
            .config
            .iter()
            .find(|item| item.derived && &item.name == name)
            .map_or(text, |item| {
                format!("{name} = {}", crate::text::expr_text(&item.value))
            }),
        _ => text,
    }
}

/// The rank of the adapter of the linear layer `layer`: an int of at least 0 (0: no adapter).
fn adapter_rank(expr: &crate::ast::Expr, env: &Env, layer: &str) -> Result<u64, ReportError> {
    match eval(expr, env) {
        Ok(Value::Int(i)) => u64::try_from(i).map_err(|_| {
            ReportError::Invalid(format!(
                "`{}` is {i}, the rank of `{layer}`'s adapter; it must be at least 0",
                crate::text::expr_text(expr)
            ))
        }),
        Ok(v) => Err(ReportError::Eval(format!(
            "{} is {v}, not an int",
            crate::text::expr_text(expr)
        ))),
        Err(d) => Err(ReportError::Eval(d.message)),
    }
}

fn flag(expr: &crate::ast::Expr, env: &Env) -> Result<bool, ReportError> {
    match eval(expr, env) {
        Ok(Value::Bool(b)) => Ok(b),
        Ok(v) => Err(ReportError::Eval(format!("{v} is not a bool"))),
        Err(d) => Err(ReportError::Eval(d.message)),
    }
}

impl Walk<'_> {
    fn tree(&mut self, tree: &ParamTree, env: &Env, prefix: &str) -> Result<(), ReportError> {
        for entry in &tree.entries {
            if let Some(g) = &entry.guard {
                if !flag(g, env)? {
                    continue;
                }
            }
            let name = format!("{prefix}{}", entry.name);
            let first = self.params.len();
            match &entry.node {
                ParamNode::Layer { kind, args } => self.layer(*kind, args, env, &name)?,
                ParamNode::Tensor { shape, buffer, .. } => {
                    let shape = shape
                        .iter()
                        .map(|d| size(self.model, d, env, &name))
                        .collect::<Result<_, _>>()?;
                    if *buffer {
                        self.buffers.push(name.clone());
                    }
                    self.params.push(ParamShape { name, shape });
                }
                ParamNode::Block { block, args } => self.block(block, args, env, &name)?,
                ParamNode::List {
                    block,
                    args,
                    var,
                    start,
                    end,
                } => {
                    let (start, end) = (int(start, env)?, int(end, env)?);
                    if end.saturating_sub(start) > MAX_INSTANCES {
                        return Err(ReportError::Eval(format!(
                            "`{name}` has more than {MAX_INSTANCES} elements"
                        )));
                    }
                    for i in start..end {
                        let mut inner = env.clone();
                        if let Some(v) = var {
                            inner.insert(v.clone(), Value::Int(i as i64));
                        }
                        self.block(block, args, &inner, &format!("{name}.{i}"))?;
                    }
                }
                ParamNode::Group(g) => self.tree(g, env, &format!("{name}."))?,
                ParamNode::Tied { target } => {
                    let target = format!("{}{}.weight", prefix, target.join("."));
                    if let Some(p) = self.params.iter().find(|p| p.name == target) {
                        self.matmul_weights = self
                            .matmul_weights
                            .zip(p.numel())
                            .and_then(|(w, n)| w.checked_add(n));
                    }
                }
            }
            if entry.marks.frozen {
                let marked = self.params[first..].iter().map(|p| p.name.clone());
                self.frozen.extend(marked);
            }
        }
        Ok(())
    }

    fn layer(
        &mut self,
        kind: LayerKind,
        args: &[(String, crate::ast::Expr)],
        env: &Env,
        name: &str,
    ) -> Result<(), ReportError> {
        let arg = |n: &str| args.iter().find(|(k, _)| k == n).map(|(_, e)| e);
        let model = self.model;
        let size = |n: &str| arg(n).map_or(Ok(0), |e| size(model, e, env, name));
        let bias = |n: &str| arg(n).map_or(Ok(false), |e| flag(e, env));
        let mut push = |suffix: &str, shape: Vec<u64>| {
            self.params.push(ParamShape {
                name: format!("{name}.{suffix}"),
                shape,
            });
        };
        match kind {
            LayerKind::Embedding => push("weight", vec![size("count")?, size("dim")?]),
            LayerKind::Linear => {
                let (i, o) = (size("input")?, size("output")?);
                push("weight", vec![o, i]);
                if bias("bias")? {
                    push("bias", vec![o]);
                }
                let rank = arg("lora_rank").map_or(Ok(0), |e| adapter_rank(e, env, name))?;
                if rank > 0 {
                    push("lora_a", vec![i, rank]);
                    push("lora_b", vec![rank, o]);
                }
                self.matmul_weights = self
                    .matmul_weights
                    .and_then(|w| w.checked_add(i.checked_mul(o)?));
            }
            LayerKind::LayerNorm => {
                let d = size("dim")?;
                push("weight", vec![d]);
                if bias("bias")? {
                    push("bias", vec![d]);
                }
            }
            LayerKind::RmsNorm => push("weight", vec![size("dim")?]),
            LayerKind::Experts => {
                let (d, h, n) = (size("dim")?, size("hidden")?, size("count")?);
                push("gate_proj.weight", vec![n, h, d]);
                push("up_proj.weight", vec![n, h, d]);
                push("down_proj.weight", vec![n, d, h]);
            }
        }
        Ok(())
    }

    fn block(
        &mut self,
        block: &str,
        args: &[(String, crate::ast::Expr)],
        env: &Env,
        name: &str,
    ) -> Result<(), ReportError> {
        let model = self.model;
        let Some(b) = model.block(block) else {
            return Err(ReportError::Eval(format!("no block `{block}`")));
        };
        let mut inner: Env = model
            .presets
            .first()
            .map(|_| env.clone())
            .unwrap_or_default();
        for (k, e) in args {
            let v = eval(e, env).map_err(|d| ReportError::Eval(d.message))?;
            inner.insert(k.clone(), v);
        }
        let absent = absent(&b.params, &inner)?;
        self.instances
            .push((block.to_string(), inner.clone(), absent));
        self.tree(&b.params, &inner, &format!("{name}."))
    }
}

/// One forward pass's attention FLOPs per token, activation elements and gathered expert weights
/// per token (`None` where one does not fit 64 bits).
type FnCosts = (Option<u64>, Option<u64>, Option<u64>);

/// Evaluates symbolic sizes with the batch and sequence bound.
struct Sizes {
    bound: HashMap<String, i64>,
}

impl Sizes {
    fn new(model: &CheckedModel, batch: u64, seq: u64) -> Self {
        let mut bound = HashMap::from([
            ("B".to_string(), batch as i64),
            ("T".to_string(), seq as i64),
        ]);
        if let Some(first) = model.forward.inputs.first().and_then(|t| t.shape.clone()) {
            for (d, v) in first.iter().zip([batch, seq]) {
                if let [s] = d.symbols().as_slice() {
                    bound.insert(s.clone(), v as i64);
                }
            }
        }
        Sizes { bound }
    }

    /// Attention FLOPs per token, activation elements and gathered expert weights per token of
    /// one forward pass (`None` where they do not fit 64 bits); fails on a dropout probability
    /// outside `[0, 1)`.
    fn facts(
        &mut self,
        facts: &FnFacts,
        env: &Env,
        block: &str,
        absent: &[String],
    ) -> Result<FnCosts, ReportError> {
        for p in &facts.dropout {
            let value = eval(p, env).map_err(|d| ReportError::Eval(d.message))?;
            if !value.as_f64().is_some_and(|p| (0.0..1.0).contains(&p)) {
                return Err(ReportError::Invalid(format!(
                    "`{}` is {value}: a dropout probability must be in [0, 1)",
                    crate::text::expr_text(p)
                )));
            }
        }
        let lookup = |k: &str| -> Option<i64> {
            if let Some(v) = self.bound.get(k) {
                return Some(*v);
            }
            let key = k
                .strip_prefix(block)
                .and_then(|r| r.strip_prefix('.'))
                .unwrap_or(k);
            match env.get(key) {
                Some(Value::Int(i)) => Some(*i),
                _ => None,
            }
        };
        let size = |d: &crate::dim::Dim| {
            d.eval(&lookup)
                .and_then(|v| u64::try_from(v).ok())
                .ok_or_else(|| {
                    ReportError::Eval(format!(
                        "`{d}` in `{}`",
                        if block.is_empty() { "forward" } else { block }
                    ))
                })
        };
        let mut attention = Some(0u64);
        for site in &facts.attention {
            let (heads, head_dim, kv_len) = (
                size(&site.heads)?,
                size(&site.head_dim)?,
                size(&site.kv_len)?,
            );
            // Grouped-query attention shares each key/value head among a whole number of query
            // heads; MLX fails on any other count.
            let kv_heads = size(&site.kv_heads)?;
            if kv_heads == 0 || heads % kv_heads != 0 {
                return Err(ReportError::Invalid(format!(
                    "`{}` is {heads}, not a multiple of `{}` ({kv_heads}): attention in `{}` \
                     shares each key/value head among a whole number of query heads",
                    site.heads,
                    site.kv_heads,
                    if block.is_empty() { "forward" } else { block }
                )));
            }
            attention = attention.and_then(|a| {
                a.checked_add(
                    heads
                        .checked_mul(head_dim)?
                        .checked_mul(kv_len)?
                        .checked_mul(4)?,
                )
            });
        }
        // A recurrence's chunked form, per token.
        for site in &facts.scans {
            let flops = size(&site.flops)?;
            attention = attention.and_then(|a| a.checked_add(flops));
        }
        let mut activations = Some(0u64);
        for shape in &facts.activations {
            // A size whose every symbol has a value must be a whole number (`d_model / 3` with
            // `d_model = 64` is not: `split` and `reshape` would fail when the model runs).
            for d in shape {
                let known = !d.is_opaque() && d.symbols().iter().all(|s| lookup(s).is_some());
                if known && size(d).is_err() {
                    return Err(ReportError::Invalid(format!(
                        "a tensor in `{}` has a size `{d}` that is not a whole number",
                        if block.is_empty() { "forward" } else { block }
                    )));
                }
            }
            let n = shape
                .iter()
                .try_fold(1u64, |n, d| n.checked_mul(size(d).unwrap_or(1)));
            activations = activations.zip(n).and_then(|(a, n)| a.checked_add(n));
        }
        let mut gathered = Some(0u64);
        for weights in &facts.gathered_weights {
            let w = size(weights)?;
            gathered = gathered.and_then(|g| g.checked_add(w));
        }
        for (layer, weights) in &facts.experts_calls {
            if !absent.contains(layer) {
                let w = size(weights)?;
                gathered = gathered.and_then(|g| g.checked_add(w));
            }
        }
        Ok((attention, activations, gathered))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shapes(shapes: &[&[u64]]) -> Vec<ParamShape> {
        shapes
            .iter()
            .map(|shape| ParamShape {
                name: String::new(),
                shape: shape.to_vec(),
            })
            .collect()
    }

    #[test]
    fn optimizer_state_counts_adafactor_factored_and_the_others_per_moment() {
        // A [2, 16, 8] stack of matrices, a [16, 8] matrix and an [8] vector: 392 elements.
        let params = shapes(&[&[2, 16, 8], &[16, 8], &[8]]);
        let factored = 2 * (16 + 8) + (16 + 8) + 8;
        assert_eq!(
            optimizer_elements(OptimizerKind::Adafactor, false, &params),
            Some(factored)
        );
        assert_eq!(
            optimizer_elements(OptimizerKind::Adafactor, true, &params),
            Some(factored + 392)
        );
        assert_eq!(
            optimizer_elements(OptimizerKind::AdamW, false, &params),
            Some(2 * 392)
        );
        assert_eq!(
            optimizer_elements(OptimizerKind::Sgd, false, &params),
            Some(392)
        );
        let huge = shapes(&[&[1 << 40, 1 << 30]]);
        assert_eq!(optimizer_elements(OptimizerKind::AdamW, false, &huge), None);
    }
}
