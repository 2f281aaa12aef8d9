//! Bodies: forward passes, statements, loops, and training steps.

use super::calls::Args;
use super::exprs::article;
use super::scope::Scope;
use super::{Checker, Context};
use std::collections::HashMap;

use crate::ast::{self, Body, Expr, ExprKind, Forward, StmtKind};
use crate::diag::Diagnostic;
use crate::dim::shape_text;
use crate::ir::{FnFacts, OptimizerIr, OptimizerKind, SettingDefault, StateSlot, StepIr};
use crate::span::Span;
use crate::types::{ModuleTy, StaticTy, TensorTy, Ty};

/// Wraps text in parentheses when it holds a space.
pub(crate) fn paren(text: &str) -> String {
    if text.contains(' ') {
        format!("({text})")
    } else {
        text.to_string()
    }
}

/// A dtype as `.lmx` writes it.
fn dtype_name(d: ast::Dtype) -> &'static str {
    match d {
        ast::Dtype::Float => "float",
        ast::Dtype::Int => "int",
        ast::Dtype::Bool => "bool",
    }
}

/// Binds the inputs (every declared one, in order) to their types.
fn bind_inputs(declared: &[ast::Input], resolved: &[(String, TensorTy)], scope: &mut Scope) {
    for (input, (name, t)) in declared.iter().zip(resolved) {
        scope.bind(name, Ty::Tensor(t.clone()), input.name.span);
    }
}

/// A type with its article, without its shape: "a tensor", "a static int".
fn article_ty(t: &Ty) -> String {
    match t {
        Ty::Tensor(_) => "a tensor".to_string(),
        Ty::Static(s) => format!("a static {}", s.name()),
        Ty::Grads => "gradients".to_string(),
        other => article(&other.to_string()),
    }
}

/// What a step declares as it is checked.
#[derive(Default)]
pub(crate) struct StepState {
    optimizer: Option<OptimizerIr>,
    accumulate: Option<Expr>,
    clip: Option<Expr>,
    /// Where `grad` and `clip_grad_norm` were first called: a step differentiates one loss and
    /// clips once (the compiled step is that loss, optionally clipped, then applied).
    grad_at: Option<Span>,
    clip_at: Option<Span>,
    /// The name `let` gives the clipped gradients, and what `update` applies.
    clipped: Option<String>,
    update: Option<Expr>,
    updated: bool,
    /// Whether an `optimizer` was written but not taken (nested, or unknown: an error already),
    /// so that none is asked for again.
    optimizer_written: bool,
    metrics: Vec<String>,
    /// The first `grad(..)` call and its argument, the loss.
    grad: Option<(Span, Expr)>,
    /// Where each step statement was first written, to refuse a second one.
    first: HashMap<&'static str, Span>,
    /// Where each metric was first listed.
    metric_spans: HashMap<String, Span>,
}

impl StepState {
    /// Where the step calls `grad(..)`, once checked that far.
    pub(crate) fn grad_at(&self) -> Option<Span> {
        self.grad_at
    }
}

impl Checker<'_> {
    /// Checks a forward pass (a block's when `block` is given, else the model's).
    pub(crate) fn check_forward(
        &mut self,
        f: &Forward,
        params: &Ty,
        block: Option<&ast::Block>,
    ) -> FnFacts {
        self.facts = FnFacts::default();
        self.current_block = block.map(|b| b.name.name.clone());
        let mut scope = match block {
            Some(b) => self.block_scope(b),
            None => {
                let mut s = self.globals.clone();
                s.push();
                s
            }
        };
        let group = match block {
            Some(b) => b.params.as_ref(),
            None => self.model.params.as_ref(),
        };
        if let Some(g) = group {
            self.bind_params(g, params, &mut scope);
        }
        scope.push();
        let (inputs, _) = self.resolve_inputs(&f.inputs, &mut scope);
        bind_inputs(&f.inputs, &inputs, &mut scope);
        if block.is_none() {
            self.model_signature(f, &inputs);
        }
        let output = f
            .output
            .as_ref()
            .and_then(|o| self.resolve_type(o, &mut scope, &mut Vec::new()));
        let value = self.body(&f.body, &mut scope, Context::Forward);
        match (value, f.body.tail()) {
            (None, _) => self.error(
                Diagnostic::new(
                    "lmx::forward::no_value",
                    "this forward pass does not end with a value",
                    Span::new(f.body.span.end.saturating_sub(1), f.body.span.end),
                    "expected the output expression before `}`",
                )
                .with_help("end the body with the output, e.g. `x + mlp(ln_2(x))`"),
            ),
            (Some(Ty::Tensor(got)), Some(tail)) => {
                if let (Some(want), Some(gs)) = (&output, &got.shape) {
                    if want.shape.as_ref() != Some(gs) {
                        let ws = want.shape.as_deref().map(shape_text).unwrap_or_default();
                        self.error(
                            Diagnostic::new(
                                "lmx::shape::output",
                                format!("forward returns {}, but declares {ws}", got.shape_text()),
                                tail.span,
                                format!("this has shape {}", got.shape_text()),
                            )
                            .with_label(want.origin, "declared here")
                            .with_label(
                                got.origin,
                                format!("the shape {} comes from here", got.shape_text()),
                            ),
                        );
                    }
                }
            }
            (Some(Ty::Unknown), _) => {}
            (Some(other), Some(tail)) => {
                self.error(Diagnostic::new(
                    "lmx::type::mismatch",
                    format!("forward must return a tensor, found a {other}"),
                    tail.span,
                    "not a tensor",
                ));
                // Its calls then have no type to report against: one mistake, one diagnostic.
                if let Some(b) = block {
                    self.broken_blocks.insert(b.name.name.clone());
                }
            }
            (Some(_), None) => {}
        }
        let mut facts = std::mem::take(&mut self.facts);
        facts.inputs = inputs.into_iter().map(|(_, t)| t).collect();
        facts
    }

    /// The model's own forward pass is what training, generation and the KV cache call with
    /// token ids: one input, `[B, T] int`.
    fn model_signature(&mut self, f: &Forward, inputs: &[(String, TensorTy)]) {
        let fits = matches!(
            inputs,
            [(_, TensorTy { dtype: ast::Dtype::Int, shape: Some(s), .. })] if s.len() == 2
        );
        if fits || inputs.len() != f.inputs.len() {
            return;
        }
        let at = match f.inputs.as_slice() {
            [_, second, ..] => second.name.span,
            [only] => only.ty.span,
            [] => f.span,
        };
        self.error(
            Diagnostic::new(
                "lmx::forward::signature",
                "the model's forward pass takes token ids alone: one input of type `[B, T] int`",
                at,
                "the trainer, generation and the KV cache call it with token ids only",
            )
            .with_help(
                "compute other inputs inside the model, or pass them to a block's forward pass",
            ),
        );
    }

    /// Checks a body in a new scope; returns the type of its value, if it ends with one.
    pub(crate) fn body(&mut self, body: &Body, scope: &mut Scope, ctx: Context) -> Option<Ty> {
        scope.push();
        let mut value = None;
        let last = body.stmts.len().saturating_sub(1);
        for (i, s) in body.stmts.iter().enumerate() {
            let ty = self.stmt(s, scope, ctx);
            if i == last {
                value = ty;
            }
        }
        scope.pop();
        value
    }

    fn stmt(&mut self, s: &ast::Stmt, scope: &mut Scope, ctx: Context) -> Option<Ty> {
        match &s.kind {
            StmtKind::Let(names, value) => {
                let ty = self.infer(value, scope, ctx);
                self.bind_let(names, ty, value.span, scope);
                None
            }
            StmtKind::Assign(name, value) => {
                let ty = self.infer(value, scope, ctx);
                match scope.get(&name.name).map(|b| (b.ty.clone(), b.span)) {
                    None => {
                        self.error(
                            Diagnostic::new(
                                "lmx::name::unknown",
                                format!("cannot assign to `{}`, which is not declared", name.name),
                                name.span,
                                "not declared",
                            )
                            .with_help(format!("declare it first with `let {} = ...`", name.name)),
                        );
                        // Declared from here on, as the help suggests, so that its uses below
                        // are checked rather than each reported again.
                        scope.bind(&name.name, ty, name.span);
                    }
                    Some((old, decl)) => self.check_assign(name, &old, decl, ty, value.span, scope),
                }
                None
            }
            StmtKind::For(names, range, body) => {
                self.for_loop(names, range, body, scope, ctx);
                None
            }
            StmtKind::While(cond, _) => {
                let t = self.infer(cond, scope, ctx);
                let d = match &t {
                    Ty::Tensor(t) => Diagnostic::new(
                        "lmx::branch::tensor_while",
                        "data-dependent loop: the condition of this `while` is a tensor",
                        cond.span,
                        format!(
                            "this is a tensor of shape {}, known only when the graph runs",
                            t.shape_text()
                        ),
                    )
                    .with_label(
                        Span::new(s.span.start, s.span.start + 5),
                        "loops on it here",
                    )
                    .with_help(super::exprs::WHERE_HELP),
                    _ => Diagnostic::new(
                        "lmx::loop::while",
                        "`while` loops are not supported",
                        Span::new(s.span.start, s.span.start + 5),
                        "a loop must have a length known when the graph is built",
                    )
                    .with_help("loop over a static range with `for i in 0..n { }`"),
                };
                self.error(d);
                None
            }
            StmtKind::Optimizer(_)
            | StmtKind::Accumulate(_)
            | StmtKind::Update(_)
            | StmtKind::Metrics(_)
            | StmtKind::Frozen(..) => {
                match ctx {
                    Context::Forward => self.error(Diagnostic::new(
                        "lmx::step::outside_step",
                        "this statement belongs in a `step`",
                        s.span,
                        "not allowed in a forward pass",
                    )),
                    // A step's own statements are read in `check_step`; one met here sits
                    // inside a loop or a branch, which would make it run zero or many times.
                    Context::Step => self.nested_step_statement(s),
                }
                None
            }
            StmtKind::Next(target, value) => {
                self.next_buffer(target, value, s.span, scope, ctx);
                None
            }
            StmtKind::Expr(e) => Some(self.infer(e, scope, ctx)),
        }
    }

    fn bind_let(&mut self, names: &[ast::Ident], ty: Ty, span: Span, scope: &mut Scope) {
        match (names, ty) {
            // A size known only as itself (a static `if` choosing between two) is named by
            // its variable in messages.
            ([one], Ty::Static(StaticTy::Int(Some(d)))) if d.is_opaque() => scope.bind(
                &one.name,
                Ty::Static(StaticTy::Int(Some(d.named(&one.name)))),
                one.span,
            ),
            ([one], ty) => scope.bind(&one.name, ty, one.span),
            (many, Ty::Tuple(parts)) if parts.len() == many.len() => {
                for (n, t) in many.iter().zip(parts) {
                    scope.bind(&n.name, t, n.span);
                }
            }
            (many, ty) => {
                if !matches!(ty, Ty::Unknown) {
                    let count = match &ty {
                        Ty::Tuple(p) => p.len(),
                        _ => 1,
                    };
                    self.error(Diagnostic::new(
                        "lmx::type::unpack",
                        format!("cannot unpack {count} value(s) into {} names", many.len()),
                        span,
                        format!("this gives {count} value(s)"),
                    ));
                }
                for n in many {
                    scope.bind(&n.name, Ty::Unknown, n.span);
                }
            }
        }
    }

    fn check_assign(
        &mut self,
        name: &ast::Ident,
        old: &Ty,
        decl: Span,
        new: Ty,
        span: Span,
        scope: &mut Scope,
    ) {
        let same = match (old, &new) {
            (Ty::Tensor(a), Ty::Tensor(b)) if a.dtype != b.dtype => {
                self.error(
                    Diagnostic::new(
                        "lmx::type::assign",
                        format!(
                            "assigning {} tensor to `{}`, which holds {} tensor",
                            article(dtype_name(b.dtype)),
                            name.name,
                            article(dtype_name(a.dtype))
                        ),
                        span,
                        format!("this is {} tensor", article(dtype_name(b.dtype))),
                    )
                    .with_label(decl, format!("`{}` was declared as {} tensor", name.name, article(dtype_name(a.dtype))))
                    .with_help(format!("assignment keeps a variable's type (it may run in a loop); use `let {} = ...` for a new value", name.name)),
                );
                scope.rebind(&name.name, Ty::Unknown);
                return;
            }
            (Ty::Tensor(a), Ty::Tensor(b)) => {
                a.shape.is_none() || b.shape.is_none() || a.shape == b.shape
            }
            (Ty::Unknown, _) | (_, Ty::Unknown) => true,
            (a, b) if a.kind() == b.kind() => true,
            (a, b) => {
                self.error(
                    Diagnostic::new(
                        "lmx::type::assign",
                        format!("assigning {} to `{}`, which holds {}", article_ty(b), name.name, article_ty(a)),
                        span,
                        format!("this is {}", article_ty(b)),
                    )
                    .with_label(decl, format!("`{}` was declared as {}", name.name, article_ty(a)))
                    .with_help(format!("assignment keeps a variable's type (it may run in a loop); use `let {} = ...` for a new value", name.name)),
                );
                scope.rebind(&name.name, Ty::Unknown);
                return;
            }
        };
        if same {
            if !matches!(new, Ty::Unknown) {
                scope.rebind(&name.name, new);
            }
            return;
        }
        // Only two tensors of different shapes are left.
        let (Ty::Tensor(a), Ty::Tensor(b)) = (old, &new) else {
            return;
        };
        let (was, now) = (a.shape_text(), b.shape_text());
        self.error(
            Diagnostic::new(
                "lmx::shape::assign",
                format!("assigning {now} to `{}`, which holds {was}", name.name),
                span,
                format!("this has shape {now}"),
            )
            .with_label(decl, format!("`{}` was declared with shape {was}", name.name))
            .with_help(format!("assignment keeps a variable's shape (it may run in a loop); use `let {} = ...` for a new value", name.name)),
        );
        scope.rebind(&name.name, Ty::Unknown);
    }

    fn for_loop(
        &mut self,
        names: &[ast::Ident],
        range: &ast::Range,
        body: &Body,
        scope: &mut Scope,
        ctx: Context,
    ) {
        scope.push();
        let start = self.infer(&range.start, scope, ctx);
        let end = range.end.as_ref().map(|e| (e, self.infer(e, scope, ctx)));
        let mut bind_ok = true;
        match (&start, &end) {
            (_, Some((e, t))) => {
                for (expr, ty) in [(&range.start, &start), (*e, t)] {
                    if let Ty::Tensor(tt) = ty {
                        self.error(
                            Diagnostic::new(
                                "lmx::branch::tensor_loop_bound",
                                "data-dependent loop: a bound of this `for` is a tensor",
                                expr.span,
                                format!("this is a tensor of shape {}, known only when the graph runs", tt.shape_text()),
                            )
                            .with_help("loops are unrolled when the graph is built, so their bounds must be static; mask the extra iterations with `where(cond, a, b)`"),
                        );
                        bind_ok = false;
                    } else {
                        self.expect_static(ty, &StaticTy::Int(None), expr.span, "a loop bound");
                    }
                }
                if let [i] = names {
                    scope.bind(&i.name, Ty::Static(StaticTy::Int(None)), i.span);
                } else {
                    self.error(Diagnostic::new(
                        "lmx::loop::names",
                        "a range loop binds one name",
                        range.span,
                        "one name expected",
                    ));
                }
            }
            (Ty::Module(ModuleTy::BlockList(b)), None) => {
                let elem = Ty::Module(ModuleTy::Block(b.clone()));
                match names {
                    [x] => scope.bind(&x.name, elem, x.span),
                    [i, x] => {
                        scope.bind(&i.name, Ty::Static(StaticTy::Int(None)), i.span);
                        scope.bind(&x.name, elem, x.span);
                    }
                    _ => self.error(Diagnostic::new(
                        "lmx::loop::names",
                        "a block-list loop binds `block` or `index, block`",
                        range.span,
                        "too many names",
                    )),
                }
            }
            (Ty::Tensor(t), None) => {
                self.error(
                    Diagnostic::new(
                        "lmx::branch::tensor_loop_bound",
                        "data-dependent loop: this `for` iterates over a tensor",
                        range.span,
                        format!("this is a tensor of shape {}; its length and values are known only when the graph runs", t.shape_text()),
                    )
                    .with_help("iterate over a static range `0..n` or a block list; compute over all elements at once with tensor operations"),
                );
                bind_ok = false;
            }
            (Ty::Unknown, None) => bind_ok = false,
            (other, None) => {
                self.error(Diagnostic::new(
                    "lmx::loop::iterable",
                    format!("cannot loop over a {other}"),
                    range.span,
                    "expected `a..b` or a block list",
                ));
                bind_ok = false;
            }
        }
        if !bind_ok {
            for n in names {
                scope.bind(&n.name, Ty::Unknown, n.span);
            }
        }
        self.body(body, scope, ctx);
        scope.pop();
    }

    /// A step statement nested in a `for`, `if` or `while`: an error, and it counts as written
    /// so that no "never applies its gradients" follows it.
    fn nested_step_statement(&mut self, s: &ast::Stmt) {
        let keyword = match &s.kind {
            StmtKind::Optimizer(_) => "optimizer",
            StmtKind::Accumulate(_) => "accumulate",
            StmtKind::Update(_) => "update",
            StmtKind::Frozen(..) => "frozen",
            _ => "metrics",
        };
        self.error(
            Diagnostic::new(
                "lmx::step::nested",
                format!("`{keyword}` must stand at the top level of the step"),
                Span::new(s.span.start, s.span.start + keyword.len()),
                "inside a loop or a branch, it would run zero or several times",
            )
            .with_help(match keyword {
                "frozen" => "declare each frozen model once, at the step's top level".to_string(),
                _ => format!(
                    "a step declares `{keyword}` once, unconditionally: move it out of the loop \
                     or branch; scale or mask values with `where(cond, a, b)` instead"
                ),
            }),
        );
        if let Some(state) = self.step_state.as_mut() {
            match &s.kind {
                StmtKind::Optimizer(_) => state.optimizer_written = true,
                StmtKind::Update(_) => state.updated = true,
                _ => {}
            }
        }
    }

    /// Checks a training step.
    pub(crate) fn check_step(&mut self, step: &ast::Step) -> StepIr {
        let mut scope = self.globals.clone();
        scope.push();
        let (inputs, _) = self.resolve_inputs(&step.inputs, &mut scope);
        bind_inputs(&step.inputs, &inputs, &mut scope);
        let mut state = StepState::default();
        self.step_state = Some(StepState::default());
        let mut metric_origins = Vec::new();
        let mut frozen = Vec::new();
        for s in &step.body.stmts {
            if self.repeated(s, &mut state) {
                continue;
            }
            match &s.kind {
                StmtKind::Optimizer(call) => self.optimizer(call, &mut state),
                StmtKind::Frozen(name, source) => {
                    self.frozen_declaration(name, source, &mut scope, &mut frozen)
                }
                StmtKind::Update(e) if self.frozen_update(e, &scope) => state.updated = true,
                StmtKind::Accumulate(e) => {
                    let t = self.infer(e, &mut scope, Context::Step);
                    if self.expect_static(&t, &StaticTy::Int(None), e.span, "`accumulate`") {
                        self.accumulate_count(e, &t);
                    }
                    state.accumulate = Some(e.clone());
                }
                StmtKind::Update(e) => {
                    let t = self.infer(e, &mut scope, Context::Step);
                    if !matches!(t, Ty::Grads | Ty::Unknown) {
                        self.error(Diagnostic::new(
                            "lmx::step::update",
                            format!("`update` needs the gradients from `grad(loss)`, found a {t}"),
                            e.span,
                            "not gradients",
                        ));
                    }
                    if matches!(t, Ty::Grads) {
                        state.update = Some(e.clone());
                    }
                    state.updated = true;
                }
                StmtKind::Metrics(names) => {
                    for n in names {
                        if let Some(first) = state.metric_spans.get(&n.name) {
                            self.error(
                                Diagnostic::new(
                                    "lmx::step::repeated",
                                    format!("metric `{}` is listed twice", n.name),
                                    n.span,
                                    "listed again here",
                                )
                                .with_label(*first, "first listed here")
                                .with_help("list each metric once"),
                            );
                            continue;
                        }
                        state.metric_spans.insert(n.name.clone(), n.span);
                        let t = self.infer(
                            &Expr {
                                kind: ExprKind::Name(n.name.clone()),
                                span: n.span,
                            },
                            &mut scope,
                            Context::Step,
                        );
                        match t {
                            Ty::Tensor(TensorTy { shape: Some(s), .. }) if !s.is_empty() => {
                                self.error(
                                    Diagnostic::new(
                                        "lmx::step::metric_shape",
                                        format!(
                                            "metric `{}` must be a scalar, found shape {}",
                                            n.name,
                                            shape_text(&s)
                                        ),
                                        n.span,
                                        "not a scalar",
                                    )
                                    .with_help("reduce it first, e.g. `mean(x)`"),
                                );
                            }
                            Ty::Tensor(t) => metric_origins.push((n.clone(), t.origin)),
                            Ty::Unknown => {}
                            other => self.error(Diagnostic::new(
                                "lmx::step::metric_shape",
                                format!(
                                    "metric `{}` must be a scalar tensor, found {}",
                                    n.name,
                                    article_ty(&other)
                                ),
                                n.span,
                                "not a tensor",
                            )),
                        }
                        state.metrics.push(n.name.clone());
                    }
                }
                _ => {
                    if let StmtKind::Let(names, value) = &s.kind {
                        if let ExprKind::Call(callee, _) = &value.kind {
                            if matches!(&callee.kind, ExprKind::Name(f) if f == "clip_grad_norm") {
                                state.clipped = names.first().map(|n| n.name.clone());
                            }
                        }
                    }
                    self.stmt(s, &mut scope, Context::Step);
                }
            }
        }
        if let Some(nested) = self.step_state.take() {
            state.clip = nested.clip;
            state.clip_at = nested.clip_at;
            state.updated |= nested.updated;
            state.optimizer_written |= nested.optimizer_written;
            state.grad = nested.grad;
        }
        if let Some((grad, loss)) = &state.grad {
            self.frozen_grad(&step.body, *grad, loss, &frozen);
        }
        self.check_clipped_update(&state);
        let (loss_metric, norm_metric, reported) = self.step_metrics(&state, &metric_origins);
        let end = Span::new(step.body.span.end.saturating_sub(1), step.body.span.end);
        let optimizer = state.optimizer.take().unwrap_or_else(|| {
            if !state.optimizer_written {
                self.error(
                    Diagnostic::new(
                        "lmx::step::no_optimizer",
                        format!("step `{}` declares no optimizer", step.name.name),
                        step.name.span,
                        "this step never says how to update",
                    )
                    .with_help("add e.g. `optimizer adamw(weight_decay = 0.1)`"),
                );
            }
            OptimizerIr {
                kind: OptimizerKind::AdamW,
                args: Vec::new(),
            }
        });
        if !state.updated {
            self.error(
                Diagnostic::new(
                    "lmx::step::no_update",
                    format!("step `{}` never applies its gradients", step.name.name),
                    end,
                    "expected `update grads` before `}`",
                )
                .with_help("compute `let grads = grad(loss)` and finish with `update grads`"),
            );
        }
        let accumulate = state.accumulate.clone().unwrap_or(Expr {
            kind: ExprKind::Int(1),
            span: step.name.span,
        });
        let mut slots = vec![StateSlot::Params];
        slots.extend(
            optimizer
                .kind
                .moments()
                .iter()
                .map(|m| StateSlot::Moment(m)),
        );
        if !matches!(accumulate.kind, ExprKind::Int(1)) {
            slots.push(StateSlot::GradAccum);
        }
        slots.push(StateSlot::Step);
        slots.push(StateSlot::LearningRate);
        if self.model_uses_rng() {
            slots.push(StateSlot::Rng);
        }
        if self.writes_buffers {
            slots.push(StateSlot::Buffers);
        }
        slots.extend(frozen.iter().map(|f| StateSlot::Frozen(f.name.clone())));
        StepIr {
            name: step.name.name.clone(),
            inputs,
            optimizer,
            accumulate,
            clip: state.clip,
            metrics: state.metrics,
            loss: state.grad,
            loss_metric,
            norm_metric,
            reported,
            frozen,
            state: slots,
        }
    }

    /// Sorts the step's metrics into the loss (the name given to `grad`), the gradient norm
    /// (from `clip_grad_norm`) and the step's own metrics, which the loss's computation returns
    /// beside the loss: each must be computed before the statement holding `grad(..)`, or the
    /// compiled loss has not computed it.
    fn step_metrics(
        &mut self,
        state: &StepState,
        metrics: &[(ast::Ident, Span)],
    ) -> (Option<String>, Option<String>, Vec<String>) {
        // Without a `grad(..)`, the step has an error of its own already.
        let Some((grad, loss)) = &state.grad else {
            return (None, None, Vec::new());
        };
        let loss_name = match &loss.kind {
            ExprKind::Name(n) => Some(n.as_str()),
            _ => None,
        };
        let (mut loss, mut norm, mut reported) = (None, None, Vec::new());
        for (name, origin) in metrics {
            if Some(name.name.as_str()) == loss_name {
                loss = Some(name.name.clone());
            } else if state.clip_at == Some(*origin) {
                norm = Some(name.name.clone());
            } else if origin.end <= grad.start {
                reported.push(name.name.clone());
            } else {
                self.error(
                    Diagnostic::new(
                        "lmx::step::metric",
                        format!(
                            "metric `{}` is computed after the loss is differentiated",
                            name.name
                        ),
                        name.span,
                        "not returned by the compiled step",
                    )
                    .with_label(*origin, "computed here")
                    .with_label(*grad, "after `grad(..)`")
                    .with_help(
                        "the compiled step returns the loss, the gradient norm and what the loss's \
                         computation computes: compute the metric before `grad(loss)`",
                    ),
                );
            }
        }
        (loss, norm, reported)
    }

    /// Whether `s` repeats a step statement (`optimizer`, `accumulate`, `update`, `metrics`)
    /// written before at the top level of the step; reports it, which then stands for that one
    /// mistake (the repeated statement is not checked further).
    fn repeated(&mut self, s: &ast::Stmt, state: &mut StepState) -> bool {
        let keyword = match &s.kind {
            StmtKind::Optimizer(_) => "optimizer",
            StmtKind::Accumulate(_) => "accumulate",
            StmtKind::Update(_) => "update",
            StmtKind::Metrics(_) => "metrics",
            _ => return false,
        };
        let here = Span::new(s.span.start, s.span.start + keyword.len());
        let Some(first) = state.first.get(keyword).copied() else {
            state.first.insert(keyword, here);
            return false;
        };
        let help = match keyword {
            "metrics" => "list every metric in one `metrics` line: `metrics loss, grad_norm`",
            "update" => "a step applies its gradients once; combine them before `update`",
            _ => "keep one of them",
        };
        self.error(
            Diagnostic::new(
                "lmx::step::repeated",
                format!("a step declares `{keyword}` once"),
                here,
                "declared again here",
            )
            .with_label(first, "first declared here")
            .with_help(help),
        );
        true
    }

    /// A literal accumulation count below 1 would never apply the gradients.
    fn accumulate_count(&mut self, e: &Expr, t: &Ty) {
        let Ty::Static(StaticTy::Int(Some(d))) = t else {
            return;
        };
        if let Some(n) = d.as_constant().filter(|n| *n < 1) {
            self.error(
                Diagnostic::new(
                    "lmx::step::accumulate",
                    format!("`accumulate {n}` never completes an update"),
                    e.span,
                    "the number of micro-batches per update must be at least 1",
                )
                .with_help("write `accumulate 1` (the default) or leave it out"),
            );
        }
    }

    fn model_uses_rng(&self) -> bool {
        self.rng_used
    }

    fn optimizer(&mut self, call: &ast::Call, state: &mut StepState) {
        let Some(kind) = OptimizerKind::ALL
            .into_iter()
            .find(|k| k.name() == call.name.name)
        else {
            self.error(
                Diagnostic::new(
                    "lmx::step::unknown_optimizer",
                    format!("unknown optimizer `{}`", call.name.name),
                    call.name.span,
                    "not an optimizer",
                )
                .with_help("optimizers are sgd, adam, adamw, lion and adafactor"),
            );
            state.optimizer_written = true;
            return;
        };
        let mut args = Vec::new();
        let mut scope = self.globals.clone();
        for a in &call.args {
            let Some(name) = &a.name else {
                self.error(Diagnostic::new(
                    "lmx::call::keyword",
                    "optimizer settings are named, e.g. `beta1 = 0.9`",
                    a.value.span,
                    "unnamed",
                ));
                continue;
            };
            let Some(&(_, default)) = kind
                .hyper_parameters()
                .iter()
                .find(|(n, _)| *n == name.name)
            else {
                let names: Vec<&str> = kind.hyper_parameters().iter().map(|(n, _)| *n).collect();
                self.error(
                    Diagnostic::new(
                        "lmx::call::unknown_argument",
                        format!("`{}` has no setting `{}`", kind.name(), name.name),
                        name.span,
                        "unknown setting",
                    )
                    .with_help(format!("its settings are: {}", names.join(", "))),
                );
                continue;
            };
            if let Some((_, first)) = args.iter().find(|(n, _): &&(String, Expr)| *n == name.name) {
                self.error(
                    Diagnostic::new(
                        "lmx::call::duplicate_argument",
                        format!("`{}` is set twice", name.name),
                        name.span,
                        "set again here",
                    )
                    .with_label(first.span, "first set here")
                    .with_help("keep one of them"),
                );
                continue;
            }
            let t = self.infer(&a.value, &mut scope, Context::Step);
            let expected = match default {
                SettingDefault::Bool(_) => StaticTy::Bool,
                SettingDefault::Float(_) | SettingDefault::Unset => StaticTy::Float,
            };
            self.expect_static(&t, &expected, a.value.span, "an optimizer setting");
            args.push((name.name.clone(), a.value.clone()));
        }
        state.optimizer = Some(OptimizerIr { kind, args });
    }

    /// Records the first call of `grad` or `clip_grad_norm` in the step being checked (`slot`);
    /// a second one is an error.
    fn once_per_step(
        &mut self,
        span: Span,
        what: &str,
        slot: fn(&mut StepState) -> &mut Option<Span>,
    ) {
        let Some(first) = self
            .step_state
            .as_mut()
            .map(|st| *slot(st).get_or_insert(span))
        else {
            return;
        };
        if first != span {
            self.error(
                Diagnostic::new(
                    "lmx::step::repeated",
                    format!("a step {what}"),
                    span,
                    "again here",
                )
                .with_label(first, "first here")
                .with_help("the compiled step differentiates one loss, clips the gradients at most once and applies them"),
            );
        }
    }

    /// With a `clip_grad_norm`, `update` must apply its result: the compiled step clips
    /// whatever it applies, so updating other gradients would silently clip them too.
    fn check_clipped_update(&mut self, state: &StepState) {
        let (Some(clip), Some(update)) = (state.clip_at, &state.update) else {
            return;
        };
        let applies_clipped = matches!(
            (&update.kind, &state.clipped),
            (ExprKind::Name(n), Some(c)) if n == c
        );
        if !applies_clipped {
            let mut d = Diagnostic::new(
                "lmx::step::unclipped",
                "`update` applies gradients other than the clipped ones",
                update.span,
                "not the result of `clip_grad_norm`",
            )
            .with_label(clip, "the gradients are clipped here");
            if let Some(c) = &state.clipped {
                d = d.with_help(format!("apply the clipped gradients: `update {c}`"));
            }
            self.error(d);
        }
    }

    /// `forward(..)`, `grad(loss)`, `clip_grad_norm(grads, max)` inside a step.
    pub(crate) fn step_builtin(&mut self, name: &str, span: Span, args: &Args<'_>) -> Ty {
        match name {
            "forward" => match self.model_sig.clone() {
                Some(sig) => self.signature_call(&sig, "forward", span, args),
                None => Ty::Unknown,
            },
            "grad" | "clip_grad_norm"
                if {
                    let params = if name == "grad" {
                        crate::builtins::GRAD_PARAMS
                    } else {
                        crate::builtins::CLIP_PARAMS
                    };
                    self.bind(name, params, span, args.args).is_none()
                } =>
            {
                Ty::Unknown
            }
            "grad" => {
                let Some((e, t)) = args.get(0, "loss") else {
                    return Ty::Unknown;
                };
                match t {
                    Ty::Tensor(TensorTy { shape: Some(s), .. }) if !s.is_empty() => {
                        let t = t.clone();
                        self.error(
                            Diagnostic::new(
                                "lmx::step::grad_not_scalar",
                                format!(
                                    "`grad` needs a scalar loss, found shape {}",
                                    shape_text(s)
                                ),
                                e.span,
                                "not a scalar",
                            )
                            .with_label(
                                match &t {
                                    Ty::Tensor(t) => t.origin,
                                    _ => e.span,
                                },
                                "its shape comes from here",
                            )
                            .with_help("reduce the loss first, e.g. `mean(losses)`"),
                        );
                        Ty::Unknown
                    }
                    Ty::Tensor(_) => {
                        self.once_per_step(span, "differentiates one loss", |st| &mut st.grad_at);
                        if let Some(st) = self.step_state.as_mut() {
                            st.grad.get_or_insert((span, e.clone()));
                        }
                        Ty::Grads
                    }
                    Ty::Unknown => Ty::Unknown,
                    other => {
                        self.error(Diagnostic::new(
                            "lmx::type::mismatch",
                            format!("`grad` needs a tensor loss, found a {other}"),
                            e.span,
                            "not a tensor",
                        ));
                        Ty::Unknown
                    }
                }
            }
            _ => {
                let (Some((g, gt)), Some((m, mt))) = (args.get(0, "grads"), args.get(1, "max"))
                else {
                    self.error(Diagnostic::new(
                        "lmx::call::missing_argument",
                        "`clip_grad_norm` takes gradients and a maximum norm",
                        span,
                        "missing arguments",
                    ));
                    return Ty::Unknown;
                };
                if !matches!(gt, Ty::Grads | Ty::Unknown) {
                    self.error(Diagnostic::new(
                        "lmx::type::mismatch",
                        "`clip_grad_norm` clips the gradients from `grad(loss)`",
                        g.span,
                        "not gradients",
                    ));
                }
                let (m, mt) = (m.clone(), mt.clone());
                self.expect_static(&mt, &StaticTy::Float, m.span, "the maximum norm");
                // A clip of something other than gradients is reported above, and is no clip.
                if matches!(gt, Ty::Grads) {
                    self.once_per_step(span, "clips its gradients once", |st| &mut st.clip_at);
                    if let Some(st) = self.step_state.as_mut() {
                        st.clip.get_or_insert(m);
                    }
                }
                Ty::Tuple(vec![
                    Ty::Grads,
                    Ty::Tensor(TensorTy::new(ast::Dtype::Float, Vec::new(), span)),
                ])
            }
        }
    }
}
