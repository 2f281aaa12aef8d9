//! Parameter count, per-parameter shapes, FLOPs per token and memory, for one preset.
//!
//! Computed from the checked model: the parameter tree is walked with the
//! preset's values (block arguments, list indices and guards included), and
//! the attention calls and produced tensors the checker recorded are
//! evaluated with the batch and sequence sizes bound.

use std::collections::HashMap;
use std::fmt;

use crate::eval::{eval, Env, Value};
use crate::ir::{CheckedModel, FnFacts, LayerKind, OptimizerKind, ParamNode, ParamTree};

/// One parameter tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamShape {
    /// Its dotted name, e.g. `h.0.attn.c_attn.weight`.
    pub name: String,
    /// Its shape.
    pub shape: Vec<u64>,
}

impl ParamShape {
    /// Its number of elements.
    pub fn numel(&self) -> u64 {
        self.shape.iter().fold(1, |a, b| a.saturating_mul(*b))
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
}

impl Memory {
    /// The sum.
    pub fn total(&self) -> u64 {
        self.parameters
            .saturating_add(self.gradients)
            .saturating_add(self.optimizer)
            .saturating_add(self.activations)
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
    /// Training FLOPs per token: 3 x (2 x weights used in matrix products + attention scores and mixing).
    pub flops_per_token: u64,
    /// The conventional estimate `6 N + 12 L d T` (as the benchmark anchors compute MFU).
    pub flops_per_token_6n: u64,
    /// Batch size the memory is computed for.
    pub batch: u64,
    /// Sequence length the memory and attention FLOPs are computed for.
    pub seq: u64,
    /// Memory to train at that batch size.
    pub memory: Memory,
}

/// Why a report cannot be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReportError {
    /// No preset of that name.
    UnknownPreset(String),
    /// A size could not be evaluated (the message says which).
    Eval(String),
}

impl fmt::Display for ReportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReportError::UnknownPreset(p) => write!(f, "no preset named `{p}`"),
            ReportError::Eval(m) => write!(f, "cannot evaluate a size: {m}"),
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
        matmul_weights: 0,
        instances: Vec::new(),
    };
    walk.tree(&model.params, values, "")?;
    walk.instances.push((String::new(), values.clone()));
    let mut sizes = Sizes::new(model, batch, seq);
    let mut attention = 0u64;
    let mut activations = 0u64;
    let mut layers = 0u64;
    for (block, env) in &walk.instances {
        let facts = if block.is_empty() {
            &model.forward
        } else {
            match model.block(block) {
                Some(b) => &b.forward,
                None => continue,
            }
        };
        let (a, act) = sizes.facts(facts, env, block)?;
        if !facts.attention.is_empty() {
            layers += facts.attention.len() as u64;
        }
        attention = attention.saturating_add(a);
        activations = activations.saturating_add(act);
    }
    let param_count = walk
        .params
        .iter()
        .fold(0u64, |acc, p| acc.saturating_add(p.numel()));
    let d_model = values.get("d_model").and_then(Value::as_f64).unwrap_or(0.0) as u64;
    let optimizer = model.steps.first().map(|s| &s.optimizer);
    let optimizer_elements = optimizer_elements(
        optimizer.map_or(OptimizerKind::AdamW, |o| o.kind),
        optimizer.is_some_and(|o| o.args.iter().any(|(name, _)| name == "beta1")),
        &walk.params,
    );
    let bytes = 4u64;
    Ok(Report {
        preset: preset.to_string(),
        param_count,
        flops_per_token: walk
            .matmul_weights
            .saturating_mul(2)
            .saturating_add(attention)
            .saturating_mul(3),
        flops_per_token_6n: param_count
            .saturating_mul(6)
            .saturating_add((12 * layers).saturating_mul(d_model).saturating_mul(seq)),
        batch,
        seq,
        memory: Memory {
            parameters: param_count.saturating_mul(bytes),
            gradients: param_count.saturating_mul(bytes),
            optimizer: optimizer_elements.saturating_mul(bytes),
            activations: activations.saturating_mul(bytes),
        },
        params: walk.params,
    })
}

/// The elements of an optimizer's state for `params`: a moment the shape of every parameter per
/// moment, except Adafactor's second moment, a row and a column vector for each parameter of two
/// or more axes (its first moment exists when `beta1` is given).
fn optimizer_elements(kind: OptimizerKind, first_moment: bool, params: &[ParamShape]) -> u64 {
    let count: u64 = params
        .iter()
        .fold(0u64, |acc, p| acc.saturating_add(p.numel()));
    if kind != OptimizerKind::Adafactor {
        return count.saturating_mul(kind.moments().len() as u64);
    }
    let second = params.iter().fold(0u64, |acc, p| {
        let factored = match p.shape.as_slice() {
            [lead @ .., rows, cols] => {
                let lead = lead.iter().fold(1u64, |a, b| a.saturating_mul(*b));
                lead.saturating_mul(rows.saturating_add(*cols))
            }
            _ => p.numel(),
        };
        acc.saturating_add(factored)
    });
    second.saturating_add(if first_moment { count } else { 0 })
}

struct Walk<'a> {
    model: &'a CheckedModel,
    params: Vec<ParamShape>,
    matmul_weights: u64,
    /// Every block instance with its environment, for evaluating its forward facts.
    instances: Vec<(String, Env)>,
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
            match &entry.node {
                ParamNode::Layer { kind, args } => self.layer(*kind, args, env, &name)?,
                ParamNode::Tensor { shape, .. } => {
                    let shape = shape
                        .iter()
                        .map(|d| int(d, env))
                        .collect::<Result<_, _>>()?;
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
                        self.matmul_weights = self.matmul_weights.saturating_add(p.numel());
                    }
                }
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
        let size = |n: &str| arg(n).map_or(Ok(0), |e| int(e, env));
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
                self.matmul_weights = self.matmul_weights.saturating_add(i.saturating_mul(o));
            }
            LayerKind::LayerNorm => {
                let d = size("dim")?;
                push("weight", vec![d]);
                if bias("bias")? {
                    push("bias", vec![d]);
                }
            }
            LayerKind::RmsNorm => push("weight", vec![size("dim")?]),
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
        self.instances.push((block.to_string(), inner.clone()));
        self.tree(&b.params, &inner, &format!("{name}."))
    }
}

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

    /// Attention FLOPs per token and activation elements of one forward pass.
    fn facts(
        &mut self,
        facts: &FnFacts,
        env: &Env,
        block: &str,
    ) -> Result<(u64, u64), ReportError> {
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
        let mut attention = 0u64;
        for site in &facts.attention {
            let flops = size(&site.heads)?
                .saturating_mul(size(&site.head_dim)?)
                .saturating_mul(size(&site.kv_len)?)
                .saturating_mul(4);
            attention = attention.saturating_add(flops);
        }
        let mut activations = 0u64;
        for shape in &facts.activations {
            let mut n = 1u64;
            for d in shape {
                n = n.saturating_mul(size(d).unwrap_or(1));
            }
            activations = activations.saturating_add(n);
        }
        Ok((attention, activations))
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
            factored
        );
        assert_eq!(
            optimizer_elements(OptimizerKind::Adafactor, true, &params),
            factored + 392
        );
        assert_eq!(
            optimizer_elements(OptimizerKind::AdamW, false, &params),
            2 * 392
        );
        assert_eq!(optimizer_elements(OptimizerKind::Sgd, false, &params), 392);
    }
}
