//! Expressions: names, operators, indexing, conditionals; the data-dependence rules.

use super::scope::Scope;
use super::{calls, Checker, Context};
use crate::ast::{BinaryOp, Body, Dtype, Expr, ExprKind, Subscript, UnaryOp};
use crate::diag::Diagnostic;
use crate::dim::{shape_text, Dim};
use crate::span::Span;
use crate::text::expr_text;
use crate::types::{LayerTy, ModuleTy, StaticTy, TensorTy, Ty};

/// The help line of every data-dependent-branch diagnostic.
pub const WHERE_HELP: &str = "a step is traced once into a fixed graph, so control flow may depend only on static values; select elementwise with `where(cond, a, b)`";

/// Methods that read a tensor's value to the host.
pub const HOST_READS: [&str; 5] = ["item", "tolist", "numpy", "to_host", "eval"];

/// Broadcasts two shapes (aligned on the right); `Err((i, j))` names the clashing axes.
pub fn broadcast(a: &[Dim], b: &[Dim]) -> Result<Vec<Dim>, (usize, usize)> {
    let n = a.len().max(b.len());
    let mut out = Vec::with_capacity(n);
    for k in (0..n).rev() {
        let da = (k + a.len()).checked_sub(n).map(|i| (i, &a[i]));
        let db = (k + b.len()).checked_sub(n).map(|i| (i, &b[i]));
        out.push(match (da, db) {
            (Some((_, x)), None) | (None, Some((_, x))) => x.clone(),
            (Some((i, x)), Some((j, y))) => {
                if x == y || y.as_constant() == Some(1) {
                    x.clone()
                } else if x.as_constant() == Some(1) {
                    y.clone()
                } else {
                    return Err((i, j));
                }
            }
            (None, None) => Dim::constant(1),
        });
    }
    out.reverse();
    Ok(out)
}

impl Checker<'_> {
    /// The type of an expression; reports what is wrong with it.
    pub(crate) fn infer(&mut self, e: &Expr, scope: &mut Scope, ctx: Context) -> Ty {
        match &e.kind {
            ExprKind::Int(i) => Ty::dim(Dim::constant(*i)),
            ExprKind::Float(_) => Ty::Static(StaticTy::Float),
            ExprKind::Bool(_) => Ty::Static(StaticTy::Bool),
            ExprKind::Str(_) => Ty::Static(StaticTy::Str),
            ExprKind::Name(n) => self.lookup(n, e.span, scope, ctx),
            ExprKind::List(items) => {
                Ty::Tuple(items.iter().map(|i| self.infer(i, scope, ctx)).collect())
            }
            ExprKind::Unary(op, a) => self.unary(*op, a, e.span, scope, ctx),
            ExprKind::Binary(op, op_span, a, b) => {
                let ta = self.infer(a, scope, ctx);
                let tb = self.infer(b, scope, ctx);
                let ty = self.binary(*op, *op_span, e, (a, ta), (b, tb));
                self.note_activation(&ty);
                ty
            }
            ExprKind::Call(callee, args) => {
                let ty = self.call(e, callee, args, scope, ctx);
                self.note_activation(&ty);
                ty
            }
            ExprKind::Member(target, name) => {
                let t = self.infer(target, scope, ctx);
                self.member(&t, target, name)
            }
            ExprKind::Index(target, subs) => self.index(e, target, subs, scope, ctx),
            ExprKind::If(cond, then, otherwise) => {
                self.conditional(e, cond, then, otherwise.as_ref(), scope, ctx)
            }
        }
    }

    fn note_activation(&mut self, ty: &Ty) {
        match ty {
            Ty::Tensor(TensorTy { shape: Some(s), .. }) => self.facts.activations.push(s.clone()),
            // `split` and `top_k` produce several tensors.
            Ty::Tuple(parts) => parts.iter().for_each(|p| self.note_activation(p)),
            _ => {}
        }
    }

    fn lookup(&mut self, name: &str, span: Span, scope: &Scope, ctx: Context) -> Ty {
        if let Some(b) = scope.get(name) {
            if let Some(g) = &b.guard {
                if !self.guards.contains(g) {
                    let (g, decl) = (g.clone(), b.span);
                    self.error(
                        Diagnostic::new(
                            "lmx::params::guarded",
                            format!("`{name}` exists only when `{g}`"),
                            span,
                            "used where it may not exist",
                        )
                        .with_label(decl, format!("declared with `if {g}`"))
                        .with_help(format!("use it inside `if {g} {{ ... }}`")),
                    );
                    return Ty::Unknown;
                }
            }
            if let Ty::Module(ModuleTy::Frozen(_)) = &b.ty {
                let decl = b.span;
                self.error(
                    Diagnostic::new(
                        "lmx::step::frozen_value",
                        format!("the frozen model `{name}` is used as a value"),
                        span,
                        "not called",
                    )
                    .with_label(decl, "declared frozen here")
                    .with_help(format!(
                        "a frozen model is only called, as `forward` is: `{name}(tokens)`"
                    )),
                );
                return Ty::Unknown;
            }
            return b.ty.clone();
        }
        if calls::is_builtin(name, ctx) {
            self.error(
                Diagnostic::new(
                    "lmx::type::function_value",
                    format!("`{name}` is a built-in function, used here as a value"),
                    span,
                    "not called",
                )
                .with_help(format!("call it: `{name}(..)`")),
            );
            return Ty::Unknown;
        }
        let mut d = Diagnostic::new(
            "lmx::name::unknown",
            format!("cannot find `{name}` in this scope"),
            span,
            "not found",
        );
        let names = scope.names();
        if let Some(s) = super::suggest::closest(name, names) {
            d = d.with_help(format!("did you mean `{s}`?"));
        }
        self.error(d);
        Ty::Unknown
    }

    fn unary(&mut self, op: UnaryOp, a: &Expr, span: Span, scope: &mut Scope, ctx: Context) -> Ty {
        let t = self.infer(a, scope, ctx);
        match (op, t) {
            (UnaryOp::Not, Ty::Tensor(t)) => {
                self.tensor_logic("not", span, a.span, &t);
                Ty::Unknown
            }
            (UnaryOp::Not, Ty::Static(s)) => {
                self.expect_static(
                    &Ty::Static(s),
                    &StaticTy::Bool,
                    a.span,
                    "the operand of `not`",
                );
                Ty::Static(StaticTy::Bool)
            }
            (UnaryOp::Neg, Ty::Static(StaticTy::Int(d))) => {
                Ty::Static(StaticTy::Int(d.map(|d| Dim::constant(-1).mul(&d))))
            }
            (UnaryOp::Neg, t @ (Ty::Static(StaticTy::Float) | Ty::Tensor(_) | Ty::Unknown)) => t,
            (UnaryOp::Neg, other) => {
                self.error(
                    Diagnostic::new(
                        "lmx::type::mismatch",
                        format!("`-` negates numbers and tensors, found a {}", other),
                        a.span,
                        format!("this is a {other}"),
                    )
                    .with_help("negate a bool with `not`"),
                );
                Ty::Unknown
            }
            (UnaryOp::Not, t) => t,
        }
    }

    fn tensor_logic(&mut self, op: &str, span: Span, operand: Span, t: &TensorTy) {
        self.error(
            Diagnostic::new(
                "lmx::branch::tensor_logic",
                format!("`{op}` needs a static bool, but its operand is a tensor"),
                operand,
                format!("this is a tensor of shape {}", t.shape_text()),
            )
            .with_label(span, "reading it as a bool would leave the graph")
            .with_help("combine masks elementwise with `logical_and(a, b)`, `logical_or(a, b)` or `logical_not(a)`"),
        );
    }

    fn binary(
        &mut self,
        op: BinaryOp,
        op_span: Span,
        whole: &Expr,
        (a, ta): (&Expr, Ty),
        (b, tb): (&Expr, Ty),
    ) -> Ty {
        if matches!(ta, Ty::Unknown) || matches!(tb, Ty::Unknown) {
            return Ty::Unknown;
        }
        if matches!(op, BinaryOp::And | BinaryOp::Or) {
            for (e, t) in [(a, &ta), (b, &tb)] {
                if let Ty::Tensor(t) = t {
                    self.tensor_logic(op.symbol(), op_span, e.span, t);
                    return Ty::Unknown;
                }
                self.expect_static(
                    t,
                    &StaticTy::Bool,
                    e.span,
                    &format!("an operand of `{}`", op.symbol()),
                );
            }
            return Ty::Static(StaticTy::Bool);
        }
        match (&ta, &tb) {
            (Ty::Static(x), Ty::Static(y)) => self.static_binary(op, whole, x, y),
            (Ty::Tensor(x), Ty::Tensor(y)) if op == BinaryOp::MatMul => {
                calls::matmul(self, op_span, x, y)
            }
            (Ty::Tensor(x), Ty::Tensor(y)) => {
                let dtype = promote(op, x.dtype, y.dtype);
                match (&x.shape, &y.shape) {
                    (Some(sx), Some(sy)) => match broadcast(sx, sy) {
                        Ok(shape) => Ty::Tensor(TensorTy::new(dtype, shape, whole.span)),
                        Err((i, j)) => {
                            self.error(
                                Diagnostic::new(
                                    "lmx::shape::mismatch",
                                    format!(
                                        "shapes {} and {} do not broadcast: `{}` against `{}`",
                                        x.shape_text(),
                                        y.shape_text(),
                                        sx[i],
                                        sy[j]
                                    ),
                                    op_span,
                                    format!("in this `{}`", op.symbol()),
                                )
                                .with_label(a.span, format!("this has shape {}", x.shape_text()))
                                .with_label(b.span, format!("this has shape {}", y.shape_text()))
                                .with_help("dimensions must be equal, or 1 on one side"),
                            );
                            Ty::Unknown
                        }
                    },
                    _ => Ty::Tensor(TensorTy {
                        dtype,
                        shape: None,
                        origin: whole.span,
                    }),
                }
            }
            (Ty::Tensor(t), Ty::Static(n)) | (Ty::Static(n), Ty::Tensor(t)) => {
                if op == BinaryOp::MatMul {
                    self.error(Diagnostic::new(
                        "lmx::type::mismatch",
                        "`@` needs two tensors",
                        op_span,
                        "one side is a static number",
                    ));
                    return Ty::Unknown;
                }
                let number = match n {
                    StaticTy::Float => Dtype::Float,
                    StaticTy::Int(_) => Dtype::Int,
                    StaticTy::Bool => Dtype::Bool,
                    StaticTy::Str | StaticTy::Enum(_) => {
                        let (e, what) = if matches!(ta, Ty::Static(_)) {
                            (a, n)
                        } else {
                            (b, n)
                        };
                        self.error(Diagnostic::new(
                            "lmx::type::mismatch",
                            format!(
                                "`{}` cannot combine a tensor and a {}",
                                op.symbol(),
                                what.name()
                            ),
                            e.span,
                            format!("this is a {}", what.name()),
                        ));
                        return Ty::Unknown;
                    }
                };
                let dtype = promote(op, t.dtype, number);
                Ty::Tensor(TensorTy {
                    dtype,
                    shape: t.shape.clone(),
                    // A new dtype comes from here; the same one from where the tensor did.
                    origin: if dtype == t.dtype {
                        t.origin
                    } else {
                        whole.span
                    },
                })
            }
            (Ty::Grads, _) | (_, Ty::Grads) => {
                // The compiled step differentiates one scalar and updates with its gradients as
                // they are (clipped if asked); scaling the loss scales them alike.
                let at = if matches!(ta, Ty::Grads) { a } else { b };
                self.error(
                    Diagnostic::new(
                        "lmx::step::grad_arithmetic",
                        format!("gradients cannot be combined with `{}`", op.symbol()),
                        whole.span,
                        "arithmetic on gradients",
                    )
                    .with_label(at.span, "these are the gradients of the loss")
                    .with_help("scale the loss instead, which scales its gradients alike: `grad(stop_gradient(scale) * loss)`"),
                );
                Ty::Unknown
            }
            _ => {
                let bad = if matches!(ta, Ty::Tensor(_) | Ty::Static(_)) {
                    (b, &tb)
                } else {
                    (a, &ta)
                };
                self.error(Diagnostic::new(
                    "lmx::type::mismatch",
                    format!("`{}` cannot be applied to a {}", op.symbol(), bad.1),
                    bad.0.span,
                    format!("this is a {}", bad.1),
                ));
                Ty::Unknown
            }
        }
    }

    fn static_binary(&mut self, op: BinaryOp, whole: &Expr, x: &StaticTy, y: &StaticTy) -> Ty {
        use BinaryOp::*;
        if op.is_comparison() {
            let number = |t: &StaticTy| matches!(t, StaticTy::Int(_) | StaticTy::Float);
            let comparable = match (x, y) {
                (a, b) if number(a) && number(b) => true,
                (StaticTy::Str, StaticTy::Str) => true,
                // Bools and enum variants are equal or not; they have no order.
                (StaticTy::Bool, StaticTy::Bool) => matches!(op, Eq | Ne),
                (StaticTy::Enum(a), StaticTy::Enum(b)) => matches!(op, Eq | Ne) && a == b,
                _ => false,
            };
            if !comparable {
                self.error(Diagnostic::new(
                    "lmx::type::mismatch",
                    format!(
                        "`{}` cannot compare {} and {}",
                        op.symbol(),
                        article(&written(x)),
                        article(&written(y))
                    ),
                    whole.span,
                    "mismatched static types",
                ));
                return Ty::Unknown;
            }
            return Ty::Static(StaticTy::Bool);
        }
        match (x, y) {
            (StaticTy::Int(dx), StaticTy::Int(dy)) => {
                let dim = match (dx, dy) {
                    (Some(a), Some(b)) => match op {
                        Mul => Some(a.mul(b)),
                        Div => Some(a.div(b)),
                        Add => Some(a.add(b, 1)),
                        Sub => Some(a.add(b, -1)),
                        _ => Some(Dim::opaque(&expr_text(whole))),
                    },
                    _ => None,
                };
                Ty::Static(StaticTy::Int(dim))
            }
            (StaticTy::Int(_) | StaticTy::Float, StaticTy::Int(_) | StaticTy::Float) => {
                Ty::Static(StaticTy::Float)
            }
            (StaticTy::Str, StaticTy::Str) if op == Add => Ty::Static(StaticTy::Str),
            _ => {
                self.error(Diagnostic::new(
                    "lmx::type::mismatch",
                    format!(
                        "`{}` cannot combine a {} and a {}",
                        op.symbol(),
                        x.name(),
                        y.name()
                    ),
                    whole.span,
                    "mismatched static types",
                ));
                Ty::Unknown
            }
        }
    }

    fn member(&mut self, t: &Ty, target: &Expr, name: &crate::ast::Ident) -> Ty {
        match t {
            Ty::Module(ModuleTy::Group(entries)) => {
                if let Some((_, ty)) = entries.iter().find(|(n, _)| *n == name.name) {
                    return ty.clone();
                }
                let mut d = Diagnostic::new(
                    "lmx::name::unknown",
                    format!("`{}` has no parameter `{}`", expr_text(target), name.name),
                    name.span,
                    "not found",
                );
                if let Some(s) =
                    super::suggest::closest(&name.name, entries.iter().map(|(n, _)| n.as_str()))
                {
                    d = d.with_help(format!("did you mean `{s}`?"));
                }
                self.error(d);
                Ty::Unknown
            }
            // An `experts` layer's projections, each a group of its stacked `weight` (read by a
            // dense reference of the experts, as `models/mixtral.lmx`'s `experts = dense`).
            Ty::Module(ModuleTy::Layer(LayerTy::Experts(experts)))
                if matches!(name.name.as_str(), "gate_proj" | "up_proj" | "down_proj") =>
            {
                let (dim, hidden, count) = (&experts.dim, &experts.hidden, &experts.count);
                let (out, input) = if name.name == "down_proj" {
                    (dim, hidden)
                } else {
                    (hidden, dim)
                };
                let shape = vec![count.clone(), out.clone(), input.clone()];
                let weight = Ty::Tensor(TensorTy::new(Dtype::Float, shape, name.span));
                Ty::Module(ModuleTy::Group(vec![("weight".to_owned(), weight)]))
            }
            Ty::Unknown => Ty::Unknown,
            Ty::Tensor(_) if HOST_READS.contains(&name.name.as_str()) => {
                // Reported at the member itself, called or not: a method value bound with `let`
                // and called later reads the tensor just the same.
                let what = format!(".{}()", name.name);
                self.host_read(&what, target.span, name.span, t);
                Ty::Unknown
            }
            other => {
                self.error(Diagnostic::new(
                    "lmx::name::unknown",
                    format!("a {other} has no member `{}`", name.name),
                    name.span,
                    "no such member",
                ));
                Ty::Unknown
            }
        }
    }

    fn index(
        &mut self,
        e: &Expr,
        target: &Expr,
        subs: &[Subscript],
        scope: &mut Scope,
        ctx: Context,
    ) -> Ty {
        let t = self.infer(target, scope, ctx);
        let mut sub_tys = Vec::new();
        for s in subs {
            for part in subscript_exprs(s) {
                let ty = self.infer(part, scope, ctx);
                if let Ty::Tensor(t) = &ty {
                    self.error(
                        Diagnostic::new(
                            "lmx::branch::tensor_index",
                            "a tensor is used as an index",
                            part.span,
                            format!("this is a tensor of shape {}", t.shape_text()),
                        )
                        .with_help("indices are fixed when the graph is built; select by value with `take_along_axis(x, indices, axis)` or `where(cond, a, b)`"),
                    );
                    return Ty::Unknown;
                }
                sub_tys.push((part.span, ty));
            }
        }
        let mut bounds = std::collections::HashMap::new();
        for (span, ty) in &sub_tys {
            if !matches!(ty, Ty::Unknown) {
                self.expect_static(ty, &StaticTy::Int(None), *span, "an index");
            }
            if let Ty::Static(StaticTy::Int(Some(d))) = ty {
                bounds.insert(span.start, d.clone());
            }
        }
        if subs
            .iter()
            .filter(|s| matches!(s, Subscript::Ellipsis(_)))
            .count()
            > 1
        {
            self.error(Diagnostic::new(
                "lmx::shape::rank",
                "an index may contain at most one `...`",
                e.span,
                "more than one `...`",
            ));
            return Ty::Unknown;
        }
        match t {
            Ty::Static(StaticTy::Str) => Ty::Static(StaticTy::Str),
            Ty::Module(ModuleTy::BlockList(b)) => Ty::Module(ModuleTy::Block(b)),
            Ty::Tensor(t) => match &t.shape {
                Some(shape) => self.index_shape(e, shape, subs, t.dtype, &bounds),
                None => Ty::Tensor(TensorTy {
                    shape: None,
                    origin: e.span,
                    ..t
                }),
            },
            Ty::Unknown => Ty::Unknown,
            other => {
                self.error(Diagnostic::new(
                    "lmx::type::mismatch",
                    format!("a {other} cannot be indexed"),
                    target.span,
                    "indexed here",
                ));
                Ty::Unknown
            }
        }
    }

    fn index_shape(
        &mut self,
        e: &Expr,
        shape: &[Dim],
        subs: &[Subscript],
        dtype: Dtype,
        bounds: &std::collections::HashMap<usize, Dim>,
    ) -> Ty {
        let explicit = subs
            .iter()
            .filter(|s| !matches!(s, Subscript::Ellipsis(_)))
            .count();
        if explicit > shape.len() {
            self.error(Diagnostic::new(
                "lmx::shape::rank",
                format!("{explicit} subscripts for a tensor of rank {}", shape.len()),
                e.span,
                format!("the tensor has shape {}", shape_text(shape)),
            ));
            return Ty::Unknown;
        }
        let mut out = Vec::new();
        let mut axis = 0;
        for s in subs {
            match s {
                Subscript::Ellipsis(_) => {
                    let skip = shape.len() - explicit;
                    out.extend(shape[axis..axis + skip].iter().cloned());
                    axis += skip;
                }
                Subscript::Index(_) => axis += 1,
                Subscript::Slice(lo, hi, _) => {
                    let full = &shape[axis];
                    // A bound's position on the axis: a negative literal counts from its end
                    // (`-2` is `T - 2`); another negated value has no known position.
                    let position = |x: &Option<Expr>, default: Dim| {
                        let Some(b) = x else {
                            return Some(default);
                        };
                        let d = bounds.get(&b.span.start)?;
                        match d.as_constant() {
                            Some(c) if c < 0 => Some(full.add(&Dim::constant(-c), -1)),
                            _ if matches!(b.kind, ExprKind::Unary(UnaryOp::Neg, _)) => None,
                            _ => Some(d.clone()),
                        }
                    };
                    let d = match (position(lo, Dim::constant(0)), position(hi, full.clone())) {
                        (Some(l), Some(h)) if l.as_constant() == Some(0) => h,
                        (Some(l), Some(h)) => {
                            let d = h.add(&l, -1);
                            d.as_constant().map_or(d, Dim::constant)
                        }
                        _ => Dim::opaque(&expr_text(e)),
                    };
                    out.push(d);
                    axis += 1;
                }
            }
        }
        out.extend(shape[axis..].iter().cloned());
        Ty::Tensor(TensorTy::new(dtype, out, e.span))
    }

    /// `if` used as a statement or a value.
    pub(crate) fn conditional(
        &mut self,
        e: &Expr,
        cond: &Expr,
        then: &Body,
        otherwise: Option<&Body>,
        scope: &mut Scope,
        ctx: Context,
    ) -> Ty {
        let ct = self.infer(cond, scope, ctx);
        let is_value = gives_value(then) || otherwise.is_some_and(gives_value);
        if let Ty::Tensor(t) = &ct {
            let (code, what) = if is_value {
                ("lmx::branch::tensor_conditional", "conditional expression")
            } else {
                ("lmx::branch::tensor_if", "`if`")
            };
            self.error(
                Diagnostic::new(
                    code,
                    format!("data-dependent branch: the condition of this {what} is a tensor"),
                    cond.span,
                    format!(
                        "this is a tensor of shape {}, known only when the graph runs",
                        t.shape_text()
                    ),
                )
                .with_label(
                    Span::new(e.span.start, e.span.start + 2),
                    "branches on it here",
                )
                .with_help(WHERE_HELP),
            );
            return Ty::Unknown;
        }
        if !matches!(ct, Ty::Unknown) {
            self.expect_static(&ct, &StaticTy::Bool, cond.span, "a condition");
        }
        let text = expr_text(cond);
        // Inside `if a and b`, both `a` and `b` hold: each guards what `a` or `b` alone would.
        let held = conjuncts(cond);
        let pushed = held.len() + 1;
        self.guards.push(text.clone());
        self.guards.extend(held);
        let a = self.body(then, scope, ctx);
        self.guards.truncate(self.guards.len() - pushed);
        self.guards
            .push(format!("not {}", super::stmts::paren(&text)));
        let b = otherwise.map(|o| self.body(o, scope, ctx));
        self.guards.pop();
        match (a, b) {
            (Some(a), Some(Some(b))) => {
                let spans = (
                    then.tail().map_or(e.span, |t| t.span),
                    otherwise.and_then(Body::tail).map_or(e.span, |t| t.span),
                );
                self.join_branches(e, a, b, spans)
            }
            (Some(a), _) if otherwise.is_none() && is_value => {
                self.error(Diagnostic::new(
                    "lmx::type::missing_else",
                    "this `if` gives a value but has no `else`",
                    e.span,
                    "add an `else` branch with a value of the same type",
                ));
                a
            }
            _ => Ty::Tuple(Vec::new()),
        }
    }
}

impl Checker<'_> {
    /// The type of an `if` value from its branches' types (`spans`: their values): the same
    /// type, or an error. A static size that differs between the branches is the one or the
    /// other, so it becomes a size equal only to itself.
    fn join_branches(&mut self, e: &Expr, a: Ty, b: Ty, spans: (Span, Span)) -> Ty {
        let differ = |what: &str, x: String, y: String| {
            Diagnostic::new(
                "lmx::type::branches",
                format!("the branches give {what}, {x} and {y}"),
                Span::new(e.span.start, e.span.start + 2),
                "both branches of this `if` must give the same type",
            )
            .with_label(spans.0, x)
            .with_label(spans.1, y)
        };
        match (&a, &b) {
            (Ty::Unknown, _) | (_, Ty::Unknown) => Ty::Unknown,
            (Ty::Tensor(x), Ty::Tensor(y)) => {
                if x.shape.is_some() && y.shape.is_some() && x.shape != y.shape {
                    self.error(
                        Diagnostic::new(
                            "lmx::shape::branches",
                            format!(
                                "the branches have different shapes, {} and {}",
                                x.shape_text(),
                                y.shape_text()
                            ),
                            e.span,
                            "both branches must give the same shape",
                        )
                        .with_label(x.origin, format!("shape {}", x.shape_text()))
                        .with_label(y.origin, format!("shape {}", y.shape_text())),
                    );
                    return Ty::Unknown;
                }
                if x.dtype != y.dtype {
                    let name = |d: Dtype| match d {
                        Dtype::Float => "a float tensor",
                        Dtype::Int => "an int tensor",
                        Dtype::Bool => "a bool tensor",
                    };
                    let d = differ(
                        "different dtypes",
                        name(x.dtype).to_string(),
                        name(y.dtype).to_string(),
                    );
                    self.error(d);
                    return Ty::Unknown;
                }
                a
            }
            (Ty::Static(StaticTy::Int(x)), Ty::Static(StaticTy::Int(y))) if x != y => {
                let size = x
                    .as_ref()
                    .and(y.as_ref())
                    .map(|_| Dim::opaque(&expr_text(e)));
                Ty::Static(StaticTy::Int(size))
            }
            (Ty::Static(StaticTy::Int(_)), Ty::Static(StaticTy::Float))
            | (Ty::Static(StaticTy::Float), Ty::Static(StaticTy::Int(_))) => {
                Ty::Static(StaticTy::Float)
            }
            (Ty::Static(x), Ty::Static(y)) if x.name() != y.name() => {
                let d = differ(
                    "different types",
                    format!("a static {}", x.name()),
                    format!("a static {}", y.name()),
                );
                self.error(d);
                Ty::Unknown
            }
            (x, y) if x.kind() != y.kind() => {
                let d = differ("a tensor and a static value", x.to_string(), y.to_string());
                self.error(d);
                Ty::Unknown
            }
            _ => a,
        }
    }
}

/// The texts of the operands of a chain of `and`s (none for another condition).
fn conjuncts(cond: &Expr) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![cond];
    while let Some(e) = todo.pop() {
        match &e.kind {
            ExprKind::Binary(BinaryOp::And, _, a, b) => {
                todo.push(b);
                todo.push(a);
            }
            _ if !std::ptr::eq(e, cond) => out.push(expr_text(e)),
            _ => {}
        }
    }
    out
}

/// A static type as written in `.lmx`, an enum with its variants (`enum(layer, rms)`).
fn written(t: &StaticTy) -> String {
    match t {
        StaticTy::Enum(variants) => format!("enum({})", variants.join(", ")),
        other => other.name().to_string(),
    }
}

/// `word` with its indefinite article: "an int", "a float".
pub(crate) fn article(word: &str) -> String {
    if word.starts_with(['a', 'e', 'i', 'o', 'u']) {
        format!("an {word}")
    } else {
        format!("a {word}")
    }
}

/// Whether a body ends with a value: an expression other than an `if` that itself gives none
/// (`if a { if b { x = y } }` is a statement, not a value missing its `else`).
fn gives_value(body: &Body) -> bool {
    match body.tail().map(|e| &e.kind) {
        None => false,
        Some(ExprKind::If(_, then, otherwise)) => {
            gives_value(then) || otherwise.as_ref().is_some_and(gives_value)
        }
        Some(_) => true,
    }
}

fn subscript_exprs(s: &Subscript) -> Vec<&Expr> {
    match s {
        Subscript::Ellipsis(_) => Vec::new(),
        Subscript::Index(e) => vec![e],
        Subscript::Slice(a, b, _) => a.iter().chain(b.iter()).collect(),
    }
}

/// The dtype of `x op y`, as MLX promotes it: a comparison is a mask, a true division is a float,
/// and otherwise the wider of the two kinds (bool, then int, then float) wins, so that an int
/// tensor scaled by a float is a float (which an embedding then refuses as ids).
fn promote(op: BinaryOp, x: Dtype, y: Dtype) -> Dtype {
    let rank = |d: Dtype| match d {
        Dtype::Bool => 0,
        Dtype::Int => 1,
        Dtype::Float => 2,
    };
    if op.is_comparison() {
        Dtype::Bool
    } else if op == BinaryOp::Div {
        Dtype::Float
    } else if rank(x) >= rank(y) {
        x
    } else {
        y
    }
}
