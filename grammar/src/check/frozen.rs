//! A step's frozen models (`frozen reference = policy`): declared once at the step's top level,
//! called as the model's forward pass is, never updated, and never the only way the
//! differentiated loss reaches the model.

use std::collections::HashMap;

use super::scope::Scope;
use super::Checker;
use crate::ast::{self, Body, Expr, ExprKind, StmtKind, Subscript};
use crate::diag::Diagnostic;
use crate::ir::{FrozenIr, FrozenSourceIr};
use crate::span::Span;
use crate::types::{ModuleTy, Ty};

/// The sources a frozen model may be declared from, as written after `=`.
const SOURCES: [(&str, FrozenSourceIr); 1] = [("policy", FrozenSourceIr::Policy)];

impl Checker<'_> {
    /// `frozen name = source` at the step's top level: binds `name` as a frozen model.
    pub(crate) fn frozen_declaration(
        &mut self,
        name: &ast::Ident,
        source: &ast::Ident,
        scope: &mut Scope,
        declared: &mut Vec<FrozenIr>,
    ) {
        if let Some(first) = declared.iter().find(|f| f.name == name.name) {
            let first = first.span;
            self.error(
                Diagnostic::new(
                    "lmx::step::repeated",
                    format!("frozen model `{}` is declared twice", name.name),
                    name.span,
                    "declared again here",
                )
                .with_label(first, "first declared here")
                .with_help("declare each frozen model once"),
            );
            return;
        }
        if let Some(taken) = scope.get(&name.name) {
            let (ty, at) = (taken.ty.clone(), taken.span);
            self.error(
                Diagnostic::new(
                    "lmx::step::frozen_name",
                    format!("`{}` already names a {ty}", name.name),
                    name.span,
                    "this frozen model would hide it",
                )
                .with_label(at, "declared here")
                .with_help("give the frozen model a name of its own, e.g. `reference`"),
            );
            return;
        }
        scope.bind(
            &name.name,
            Ty::Module(ModuleTy::Frozen(name.name.clone())),
            name.span,
        );
        let Some((_, kind)) = SOURCES.iter().find(|(s, _)| *s == source.name) else {
            self.error(
                Diagnostic::new(
                    "lmx::step::frozen_source",
                    format!("a frozen model cannot be made from `{}`", source.name),
                    source.span,
                    "not a source of frozen models",
                )
                .with_help(format!(
                    "write `frozen {} = policy`: a copy of the model as the run starts (the \
                     reference of DPO and GRPO); a teacher is given to `lmx train --teacher DIR`",
                    name.name
                )),
            );
            return;
        };
        declared.push(FrozenIr {
            name: name.name.clone(),
            source: *kind,
            span: name.span,
        });
    }

    /// `update reference`: the optimizer updates the trained parameters, never a frozen model.
    /// True when `e` names a frozen model (and so was reported).
    pub(crate) fn frozen_update(&mut self, e: &Expr, scope: &Scope) -> bool {
        let ExprKind::Name(n) = &e.kind else {
            return false;
        };
        let Some(b) = scope.get(n) else {
            return false;
        };
        if !matches!(b.ty, Ty::Module(ModuleTy::Frozen(_))) {
            return false;
        }
        let decl = b.span;
        self.error(
            Diagnostic::new(
                "lmx::step::frozen_update",
                format!("`update` applies gradients to the trained parameters, not to the frozen model `{n}`"),
                e.span,
                "a frozen model has no gradients and no optimizer state",
            )
            .with_label(decl, "declared frozen here")
            .with_help("update the policy's gradients: `update grad(loss)`"),
        );
        true
    }

    /// A loss that reaches the model only through frozen models has no gradient: `grad` of it
    /// would train nothing. Reported at the `grad` call, naming the frozen models it reads.
    pub(crate) fn frozen_grad(
        &mut self,
        body: &Body,
        grad: Span,
        loss: &Expr,
        frozen: &[FrozenIr],
    ) {
        if frozen.is_empty() {
            return;
        }
        let mut values = HashMap::new();
        bindings(body, &mut values);
        let mut reads = Reads::default();
        let mut seen = Vec::new();
        reads.expr(loss, &values, frozen, &mut seen);
        if reads.policy || reads.frozen.is_empty() {
            return;
        }
        let names = reads
            .frozen
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ");
        self.error(
            Diagnostic::new(
                "lmx::step::frozen_grad",
                format!("this loss reads the model only through the frozen {names}: it has no gradient"),
                grad,
                "differentiated here",
            )
            .with_label(loss.span, "computed without `forward(..)`")
            .with_help("a frozen model takes no gradient: compute the loss from the policy's `forward(..)`, e.g. against the frozen model's output"),
        );
    }
}

/// Every value each name is given in `body` (by `let` or `=`, in nested bodies too).
fn bindings<'a>(body: &'a Body, out: &mut HashMap<&'a str, Vec<&'a Expr>>) {
    for s in &body.stmts {
        match &s.kind {
            StmtKind::Let(names, value) => {
                for n in names {
                    out.entry(n.name.as_str()).or_default().push(value);
                }
            }
            StmtKind::Assign(n, value) => out.entry(n.name.as_str()).or_default().push(value),
            StmtKind::For(_, _, inner) | StmtKind::While(_, inner) => bindings(inner, out),
            _ => {}
        }
    }
}

/// What an expression reads, through the names it uses: the policy (`forward(..)`) and which
/// frozen models.
#[derive(Default)]
struct Reads {
    policy: bool,
    frozen: Vec<String>,
}

impl Reads {
    fn expr<'a>(
        &mut self,
        e: &'a Expr,
        values: &HashMap<&'a str, Vec<&'a Expr>>,
        frozen: &[FrozenIr],
        seen: &mut Vec<&'a str>,
    ) {
        match &e.kind {
            ExprKind::Name(n) => {
                if seen.contains(&n.as_str()) {
                    return;
                }
                seen.push(n);
                for value in values.get(n.as_str()).into_iter().flatten() {
                    self.expr(value, values, frozen, seen);
                }
            }
            ExprKind::Call(callee, args) => {
                if let ExprKind::Name(f) = &callee.kind {
                    if f == "forward" {
                        self.policy = true;
                    } else if frozen.iter().any(|x| &x.name == f) && !self.frozen.contains(f) {
                        self.frozen.push(f.clone());
                    }
                }
                self.expr(callee, values, frozen, seen);
                for a in args {
                    self.expr(&a.value, values, frozen, seen);
                }
            }
            ExprKind::List(items) => {
                for i in items {
                    self.expr(i, values, frozen, seen);
                }
            }
            ExprKind::Unary(_, a) | ExprKind::Member(a, _) => self.expr(a, values, frozen, seen),
            ExprKind::Binary(_, _, a, b) => {
                self.expr(a, values, frozen, seen);
                self.expr(b, values, frozen, seen);
            }
            ExprKind::Index(a, subs) => {
                self.expr(a, values, frozen, seen);
                for s in subs {
                    match s {
                        Subscript::Index(i) => self.expr(i, values, frozen, seen),
                        Subscript::Slice(a, b, _) => {
                            for x in a.iter().chain(b) {
                                self.expr(x, values, frozen, seen);
                            }
                        }
                        Subscript::Ellipsis(_) => {}
                    }
                }
            }
            ExprKind::If(cond, then, otherwise) => {
                self.expr(cond, values, frozen, seen);
                // Every value a branch computes counts as read: a name bound inside it and
                // used by its tail is not in `values`.
                for body in std::iter::once(then).chain(otherwise) {
                    for s in &body.stmts {
                        if let StmtKind::Let(_, v) | StmtKind::Assign(_, v) | StmtKind::Expr(v) =
                            &s.kind
                        {
                            self.expr(v, values, frozen, seen);
                        }
                    }
                }
            }
            ExprKind::Int(_) | ExprKind::Float(_) | ExprKind::Bool(_) | ExprKind::Str(_) => {}
        }
    }
}
