//! The checker: names, static-versus-tensor kinds, shapes, branches, steps.
//!
//! [`check`] turns a syntax tree into a [`CheckedModel`] or a list of
//! diagnostics. It never stops at the first error: each function reports what
//! it finds and gives the expression [`Ty::Unknown`], which silences errors
//! that would only repeat the first.

mod bind;
mod buffers;
mod calls;
mod config;
pub(crate) mod expert_rules;
mod exprs;
mod frozen;
mod params;
mod scope;
pub(crate) mod shape_rules;
mod stmts;
mod suggest;

use std::collections::{HashMap, HashSet};

use crate::ast;
use crate::diag::Diagnostic;
use crate::ir::{BlockIr, CheckedModel, FnFacts, ParamTree, Typed};
use crate::span::Span;
use crate::types::{StaticTy, TensorTy, Ty};

pub(crate) use bind::RuleCx;
pub use scope::{Binding, Scope};

/// The signature of a block's forward pass.
#[derive(Debug, Clone)]
pub(crate) struct Signature {
    /// Input names and types.
    pub inputs: Vec<(String, TensorTy)>,
    /// The symbols the inputs introduce (`B`, `T`), bound at each call.
    pub free: Vec<String>,
    /// The declared output.
    pub output: Option<TensorTy>,
}

/// What a block declares: its forward signature and its parameters.
#[derive(Debug, Clone)]
pub(crate) struct BlockInfo {
    /// The forward signature.
    pub sig: Signature,
    /// The type of its parameter group (names reachable in its forward pass).
    pub params: Ty,
    /// Its parameter tree.
    pub tree: ParamTree,
}

/// Where an expression is checked: steps may use `forward`, `grad`; blocks may not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Context {
    /// A block's or the model's forward pass.
    Forward,
    /// A training step.
    Step,
}

/// Checks a parsed model.
pub fn check(model: &ast::Model) -> Result<CheckedModel, Vec<Diagnostic>> {
    let mut c = Checker::new(model);
    let config = c.check_config();
    let presets = c.evaluate_presets(&config);
    c.collect_blocks();
    c.model_sig = model.forward.as_ref().map(|f| c.signature(f));
    let mut blocks = Vec::new();
    for block in &model.blocks {
        blocks.push(c.check_block(block));
    }
    let params = match &model.params {
        Some(group) => c.check_root_params(group),
        None => {
            c.error(Diagnostic::new(
                "lmx::params::missing",
                format!("model `{}` declares no parameters", model.name.name),
                model.header,
                "this model has no `params { }` section",
            ));
            (ParamTree::default(), Ty::Unknown)
        }
    };
    let forward = match &model.forward {
        Some(f) => c.check_forward(f, &params.1, None),
        None => {
            c.error(Diagnostic::new(
                "lmx::forward::missing",
                format!("model `{}` has no forward pass", model.name.name),
                model.header,
                "this model has no `forward(...)`",
            ));
            FnFacts::default()
        }
    };
    c.rng_used = forward.uses_rng || blocks.iter().any(|b| b.forward.uses_rng);
    let steps = model.steps.iter().map(|s| c.check_step(s)).collect();
    if c.diagnostics.is_empty() {
        let checked = CheckedModel {
            ast: model.clone(),
            name: model.name.name.clone(),
            config,
            presets,
            blocks,
            params: params.0,
            forward,
            steps,
            typed: std::mem::take(&mut c.typed),
        };
        let broken = preset_rules(&checked);
        if broken.is_empty() {
            Ok(checked)
        } else {
            Err(broken)
        }
    } else {
        c.diagnostics.sort_by_key(|d| (d.span().start, d.code));
        Err(c.diagnostics)
    }
}

/// Every preset checked against the rules of [`crate::rules`] that need the whole checked model
/// (sizes, dropout probabilities, totals), one diagnostic per broken preset at its name.
fn preset_rules(model: &CheckedModel) -> Vec<Diagnostic> {
    let spans: HashMap<&str, Span> = model
        .ast
        .presets
        .iter()
        .map(|p| (p.name.name.as_str(), p.name.span))
        .collect();
    let mut broken = Vec::new();
    for preset in &model.presets {
        let (span, config) = match spans.get(preset.name.as_str()) {
            Some(span) => (*span, format!("preset `{}`", preset.name)),
            None => (model.ast.header, "the default values".to_string()),
        };
        if let Err(message) = crate::rules::check_values(model, &config, &preset.values) {
            let label = format!("with {config}");
            broken.push(Diagnostic::new("lmx::config::rule", message, span, label));
        }
    }
    broken
}

/// The checker's state while it walks one model.
pub(crate) struct Checker<'m> {
    model: &'m ast::Model,
    diagnostics: Vec<Diagnostic>,
    /// The diagnostics recorded, to record each once in constant time.
    reported: HashSet<Diagnostic>,
    /// Config names (and enum variants) visible everywhere.
    globals: Scope,
    /// What each block declares, by name.
    blocks: HashMap<String, BlockInfo>,
    /// Facts about the forward pass being checked.
    facts: FnFacts,
    /// Static conditions of the `if`s enclosing the current statement.
    guards: Vec<String>,
    /// The model's forward signature, called as `forward(..)` in steps.
    model_sig: Option<Signature>,
    /// What the step being checked has declared so far.
    step_state: Option<stmts::StepState>,
    /// Whether any forward pass draws random numbers.
    rng_used: bool,
    /// Whether any forward pass gives a buffer its next value (`next`).
    writes_buffers: bool,
    /// The block whose forward pass is being checked (`None`: the model's own).
    current_block: Option<String>,
    /// What is learned about expressions, for the code generator.
    typed: Typed,
    /// Blocks whose forward pass does not give a tensor (reported), whose calls are not typed.
    broken_blocks: HashSet<String>,
    /// Config entries whose declaration was reported, so that evaluating them is not.
    config_errors: HashSet<String>,
    /// Config entries that fail to evaluate with the default values (reported there once).
    default_failures: HashSet<String>,
}

impl<'m> Checker<'m> {
    fn new(model: &'m ast::Model) -> Self {
        Checker {
            model,
            diagnostics: Vec::new(),
            reported: HashSet::new(),
            globals: Scope::default(),
            blocks: HashMap::new(),
            facts: FnFacts::default(),
            guards: Vec::new(),
            model_sig: None,
            step_state: None,
            rng_used: false,
            writes_buffers: false,
            current_block: None,
            typed: Typed::default(),
            broken_blocks: HashSet::new(),
            config_errors: HashSet::new(),
            default_failures: HashSet::new(),
        }
    }

    /// Records a diagnostic, once.
    fn error(&mut self, d: Diagnostic) {
        if self.reported.insert(d.clone()) {
            self.diagnostics.push(d);
        }
    }

    /// Reports `expr` when it is not static of the wanted type; returns its type.
    fn expect_static(&mut self, ty: &Ty, want: &StaticTy, span: Span, what: &str) -> bool {
        match ty {
            Ty::Static(s) if want.accepts(s) => true,
            Ty::Unknown => false,
            Ty::Tensor(t) => {
                self.error(
                    Diagnostic::new(
                        "lmx::kind::expected_static",
                        format!("{what} must be a static {}, found a tensor", want.name()),
                        span,
                        format!("this is a tensor of shape {}", t.shape_text()),
                    )
                    .with_help(
                        "sizes and settings are fixed when the model is built; use a config value",
                    ),
                );
                false
            }
            other => {
                self.error(Diagnostic::new(
                    "lmx::type::mismatch",
                    format!("{what} must be a static {}, found {other}", want.name()),
                    span,
                    format!("expected {}", want.name()),
                ));
                false
            }
        }
    }

    fn signature(&mut self, f: &ast::Forward) -> Signature {
        let mut scope = self.globals.clone();
        scope.push();
        let mut diagnostics = std::mem::take(&mut self.diagnostics);
        let mut reported = self.reported.clone();
        let (inputs, free) = self.resolve_inputs(&f.inputs, &mut scope);
        let output = f
            .output
            .as_ref()
            .and_then(|o| self.resolve_type(o, &mut scope, &mut Vec::new()));
        // The forward pass itself reports problems with its signature.
        std::mem::swap(&mut diagnostics, &mut self.diagnostics);
        std::mem::swap(&mut reported, &mut self.reported);
        Signature {
            inputs,
            free,
            output,
        }
    }

    fn check_block(&mut self, block: &ast::Block) -> BlockIr {
        let (group_ty, tree) = match self.blocks.get(&block.name.name) {
            Some(info) => (info.params.clone(), info.tree.clone()),
            None => (Ty::Unknown, ParamTree::default()),
        };
        let facts = self.check_forward(&block.forward, &group_ty, Some(block));
        BlockIr {
            name: block.name.name.clone(),
            args: block
                .args
                .iter()
                .map(|a| {
                    (
                        a.name.name.clone(),
                        config::static_ty(&a.ty),
                        a.default.clone(),
                    )
                })
                .collect(),
            params: tree,
            forward: facts,
        }
    }
}
