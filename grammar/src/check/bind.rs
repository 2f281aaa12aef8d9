//! Calls of built-ins: arguments bound to the table's parameters, checked against their slots,
//! then typed by the entry's rule; the binding is recorded for the code generator.

use super::calls::HOST_READ_HELP;
use super::{Checker, Context};
use crate::ast::{Arg, Expr, ExprKind};
use crate::builtins::{signature, Builtin, Default, Param, Site, Slot, StaticForm, TensorForm};
use crate::diag::Diagnostic;
use crate::dim::Dim;
use crate::ir::{CallIr, Form};
use crate::span::Span;
use crate::types::{StaticTy, TensorTy, Ty};

/// What a shape rule sees: the checker, the call, and each parameter's argument and type.
pub(crate) struct RuleCx<'c, 'm> {
    pub(crate) c: &'c mut Checker<'m>,
    /// The whole call.
    pub span: Span,
    /// The built-in's name.
    pub name: &'static str,
    form: TensorForm,
    /// Per parameter: the argument given for it and its type.
    args: Vec<Option<(&'c Expr, Ty)>>,
}

impl RuleCx<'_, '_> {
    /// Whether the parameter was given.
    pub fn given(&self, i: usize) -> bool {
        self.args[i].is_some()
    }

    /// The name of parameter `i`.
    pub fn param_name(&self, i: usize) -> &'static str {
        self.form.params[i].name
    }

    /// The argument expression of parameter `i`.
    pub fn expr(&self, i: usize) -> Option<&Expr> {
        self.args[i].as_ref().map(|(e, _)| *e)
    }

    /// The span of parameter `i`'s argument, or the call's.
    pub fn arg_span(&self, i: usize) -> Span {
        self.expr(i).map_or(self.span, |e| e.span)
    }

    /// The tensor of a `Tensor` parameter (the binder has checked that it is one).
    pub fn tensor(&self, i: usize) -> Option<TensorTy> {
        match &self.args[i] {
            Some((_, Ty::Tensor(t))) => Some(t.clone()),
            _ => None,
        }
    }

    /// The type of parameter `i`'s argument.
    pub fn ty(&self, i: usize) -> Option<&Ty> {
        self.args[i].as_ref().map(|(_, t)| t)
    }

    /// The items of a list argument (`[a, b]`) with their types; none for another argument.
    fn list(&self, i: usize) -> impl Iterator<Item = (&Expr, &Ty)> {
        let items: &[Expr] = match &self.args[i] {
            Some((
                Expr {
                    kind: ExprKind::List(items),
                    ..
                },
                Ty::Tuple(_),
            )) => items,
            _ => &[],
        };
        let tys: &[Ty] = match &self.args[i] {
            Some((_, Ty::Tuple(tys))) => tys,
            _ => &[],
        };
        items.iter().zip(tys)
    }

    /// The tensors of a `Tensors` parameter, with their spans.
    pub fn tensors(&self, i: usize) -> Vec<(Span, TensorTy)> {
        self.list(i)
            .filter_map(|(item, t)| match t {
                Ty::Tensor(t) => Some((item.span, t.clone())),
                _ => None,
            })
            .collect()
    }

    /// The symbolic value of an `Int` parameter (an opaque size when it has none).
    pub fn dim(&self, i: usize) -> Dim {
        match &self.args[i] {
            Some((_, Ty::Static(StaticTy::Int(Some(d))))) => d.clone(),
            Some((e, _)) => Dim::opaque(&crate::text::expr_text(e)),
            None => match self.form.params[i].default {
                Default::Int(n) => Dim::constant(n),
                _ => Dim::opaque(self.form.params[i].name),
            },
        }
    }

    /// The constant value of an int parameter, its default when left out.
    pub fn constant(&self, i: usize) -> Option<i64> {
        match &self.args[i] {
            Some((_, Ty::Static(StaticTy::Int(Some(d))))) => d.as_constant(),
            Some(_) => None,
            None => match self.form.params[i].default {
                Default::Int(n) => Some(n),
                _ => None,
            },
        }
    }

    /// The value of a bool parameter when it is a literal (or its default).
    pub fn flag(&self, i: usize) -> Option<bool> {
        match &self.args[i] {
            Some((
                Expr {
                    kind: ExprKind::Bool(b),
                    ..
                },
                _,
            )) => Some(*b),
            Some(_) => None,
            None => match self.form.params[i].default {
                Default::Bool(b) => Some(b),
                _ => None,
            },
        }
    }

    /// An `Axis` parameter normalised against `rank` (negative axes count from the end); an
    /// axis that is not a constant within the rank is reported.
    pub fn axis(&mut self, i: usize, rank: usize) -> Option<usize> {
        let value = self.constant(i);
        match value.and_then(|a| normalise_axis(a, rank)) {
            Some(a) => Some(a),
            None => {
                let what = self.form.params[i].name;
                let found = match value {
                    Some(a) => format!("axis {a} is outside rank {rank}"),
                    None => "not a constant".to_string(),
                };
                self.c.error(
                    Diagnostic::new(
                        "lmx::shape::axis",
                        format!(
                            "`{what}` of `{}` must be a constant axis of a rank-{rank} tensor",
                            self.name
                        ),
                        self.arg_span(i),
                        found,
                    )
                    .with_help(format!(
                        "axes run from 0 to {} (or from -{rank} to -1 counting from the end)",
                        rank.saturating_sub(1)
                    )),
                );
                None
            }
        }
    }

    /// The dims of a `Shape` parameter (`[B, T, d_model]`).
    pub fn shape(&self, i: usize) -> Vec<Dim> {
        self.list(i)
            .map(|(item, t)| match t {
                Ty::Static(StaticTy::Int(Some(d))) => d.clone(),
                _ => Dim::opaque(&crate::text::expr_text(item)),
            })
            .collect()
    }

    /// The constant axes of an `Axes` parameter (`None` where one is not a constant).
    pub fn axes(&self, i: usize) -> Vec<Option<i64>> {
        let Some((_, Ty::Tuple(tys))) = &self.args[i] else {
            return Vec::new();
        };
        tys.iter()
            .map(|t| match t {
                Ty::Static(StaticTy::Int(Some(d))) => d.as_constant(),
                _ => None,
            })
            .collect()
    }

    /// Records a diagnostic.
    pub fn error(&mut self, d: Diagnostic) {
        self.c.error(d);
    }

    /// Facts about the forward pass being checked (attention sites, dropout, randomness).
    pub fn facts(&mut self) -> &mut crate::ir::FnFacts {
        &mut self.c.facts
    }

    /// Reports a tensor of the wrong rank.
    pub fn rank_error(&mut self, want: &str, t: &TensorTy) {
        let (span, name) = (self.span, self.name);
        self.c.rank_error(span, name, want, t);
    }
}

/// `axis` as an index into `rank` axes.
pub(crate) fn normalise_axis(axis: i64, rank: usize) -> Option<usize> {
    let r = i64::try_from(rank).ok()?;
    let a = if axis < 0 { axis + r } else { axis };
    usize::try_from(a).ok().filter(|a| *a < rank)
}

impl Checker<'_> {
    /// The type of a call of the built-in `b`; records the binding in the typed IR.
    pub(crate) fn builtin_call(
        &mut self,
        b: &'static Builtin,
        call: &Expr,
        args: &[Arg],
        tys: Vec<Ty>,
        ctx: Context,
    ) -> Ty {
        let span = call.span;
        if b.site == Site::Forward && ctx == Context::Step {
            self.error(
                Diagnostic::new(
                    "lmx::step::dropout",
                    format!("`{}` belongs in a forward pass, not in a step", b.name),
                    span,
                    "in a step",
                )
                .with_help(
                    "apply it inside the model's or a block's `forward`, where the step's random key reaches it",
                ),
            );
            return Ty::Unknown;
        }
        if b.site == Site::Recurrent && ctx == Context::Step {
            self.error(
                Diagnostic::new(
                    "lmx::step::scan",
                    format!(
                        "`{}` is a recurrence whose state only a forward pass's cache can hold, not a step",
                        b.name
                    ),
                    span,
                    "in a step",
                )
                .with_help(
                    "call it inside the model's or a block's `forward`: generation then carries its state beside the KV cache",
                ),
            );
            return Ty::Unknown;
        }
        if tys.contains(&Ty::Unknown) {
            return Ty::Unknown;
        }
        let all_static = !args.is_empty() && tys.iter().all(|t| matches!(t, Ty::Static(_)));
        match (b.statik, b.tensor) {
            (Some(form), _) if all_static => self.static_call(b, form, call, args, &tys),
            (_, Some(form)) => self.tensor_call(b, form, call, args, tys),
            (Some(form), None) => {
                // A function of static values given a tensor: that would read it to the host.
                if let Some((arg, Ty::Tensor(t))) = args
                    .iter()
                    .zip(&tys)
                    .find(|(_, t)| matches!(t, Ty::Tensor(_)))
                {
                    self.error(
                        Diagnostic::new(
                            "lmx::branch::host_read",
                            format!(
                                "`{}(..)` reads a tensor to the host inside a traced function",
                                b.name
                            ),
                            span,
                            "this waits for the graph to run and leaves it",
                        )
                        .with_label(
                            arg.value.span,
                            format!("this is a tensor of shape {}", t.shape_text()),
                        )
                        .with_help(HOST_READ_HELP),
                    );
                    return Ty::Unknown;
                }
                self.static_call(b, form, call, args, &tys)
            }
            (None, None) => Ty::Unknown,
        }
    }

    fn static_call(
        &mut self,
        b: &'static Builtin,
        form: StaticForm,
        call: &Expr,
        args: &[Arg],
        tys: &[Ty],
    ) -> Ty {
        if let Some(named) = args.iter().find_map(|a| a.name.as_ref()) {
            self.error(Diagnostic::new(
                "lmx::call::unknown_argument",
                format!("`{}` of static values takes no keyword arguments", b.name),
                named.span,
                "not a parameter",
            ));
            return Ty::Unknown;
        }
        if args.len() != form.arity {
            self.error(Diagnostic::new(
                "lmx::call::arity",
                format!(
                    "`{}` of static values takes {} argument{}, found {}",
                    b.name,
                    form.arity,
                    if form.arity == 1 { "" } else { "s" },
                    args.len()
                ),
                call.span,
                "wrong number of arguments",
            ));
            return Ty::Unknown;
        }
        let mut statics = Vec::with_capacity(tys.len());
        for (arg, ty) in args.iter().zip(tys) {
            match ty {
                Ty::Static(s) => statics.push(s.clone()),
                other => {
                    self.error(Diagnostic::new(
                        "lmx::type::mismatch",
                        format!("`{}` takes static values, found a {other}", b.name),
                        arg.value.span,
                        "not a static value",
                    ));
                    return Ty::Unknown;
                }
            }
        }
        match (form.ty)(&statics) {
            Ok(ty) => {
                self.typed.calls.insert(
                    call.span,
                    CallIr {
                        builtin: b,
                        form: Form::Static,
                        args: (0..args.len()).map(Some).collect(),
                    },
                );
                Ty::Static(ty)
            }
            Err(why) => {
                let found: Vec<&str> = statics.iter().map(StaticTy::name).collect();
                self.error(Diagnostic::new(
                    "lmx::type::mismatch",
                    format!("`{}` {why}, found {}", b.name, found.join(", ")),
                    call.span,
                    format!("called with {}", found.join(", ")),
                ));
                Ty::Unknown
            }
        }
    }

    fn tensor_call(
        &mut self,
        b: &'static Builtin,
        form: TensorForm,
        call: &Expr,
        args: &[Arg],
        tys: Vec<Ty>,
    ) -> Ty {
        let Some(slots) = self.bind(b.name, form.params, call.span, args) else {
            return Ty::Unknown;
        };
        let mut ok = true;
        for (param, slot) in form.params.iter().zip(&slots) {
            if let Some(i) = slot {
                ok &= self.fits(b.name, param.name, param.slot, &args[*i].value, &tys[*i]);
            }
        }
        if !ok {
            return Ty::Unknown;
        }
        let mut by_param = Vec::with_capacity(slots.len());
        for slot in &slots {
            by_param.push(slot.map(|i| (&args[i].value, tys[i].clone())));
        }
        let mut cx = RuleCx {
            c: self,
            span: call.span,
            name: b.name,
            form,
            args: by_param,
        };
        let ty = (form.rule)(&mut cx);
        if ty != Ty::Unknown {
            self.typed.calls.insert(
                call.span,
                CallIr {
                    builtin: b,
                    form: Form::Tensor,
                    args: slots,
                },
            );
        }
        ty
    }

    /// Binds arguments to parameters: positional ones in order, then keywords by name.
    /// Reports extra, unknown, repeated and missing arguments.
    pub(crate) fn bind(
        &mut self,
        name: &str,
        params: &'static [Param],
        span: Span,
        args: &[Arg],
    ) -> Option<Vec<Option<usize>>> {
        let mut slots: Vec<Option<usize>> = vec![None; params.len()];
        let mut next = 0;
        for (i, arg) in args.iter().enumerate() {
            let at = match &arg.name {
                None => {
                    if next >= params.len() {
                        self.error(
                            Diagnostic::new(
                                "lmx::call::arity",
                                format!(
                                    "`{name}` takes at most {} argument{}, found {}",
                                    params.len(),
                                    if params.len() == 1 { "" } else { "s" },
                                    args.len()
                                ),
                                arg.value.span,
                                "this argument has no parameter",
                            )
                            .with_help(format!("`{}`", signature(name, params))),
                        );
                        return None;
                    }
                    next += 1;
                    next - 1
                }
                Some(kw) => match params.iter().position(|p| p.name == kw.name) {
                    Some(at) => at,
                    None => {
                        let mut d = Diagnostic::new(
                            "lmx::call::unknown_argument",
                            format!("`{name}` has no parameter `{}`", kw.name),
                            kw.span,
                            "unknown keyword",
                        );
                        d = match super::suggest::closest(&kw.name, params.iter().map(|p| p.name)) {
                            Some(s) => d.with_help(format!(
                                "did you mean `{s}`? `{}`",
                                signature(name, params)
                            )),
                            None => d.with_help(format!("`{}`", signature(name, params))),
                        };
                        self.error(d);
                        return None;
                    }
                },
            };
            if let Some(first) = slots[at] {
                self.error(
                    Diagnostic::new(
                        "lmx::call::duplicate_argument",
                        format!("`{}` of `{name}` is given twice", params[at].name),
                        arg.value.span,
                        "given again here",
                    )
                    .with_label(args[first].value.span, "first given here"),
                );
                return None;
            }
            slots[at] = Some(i);
        }
        if let Some(missing) = params
            .iter()
            .zip(&slots)
            .find(|(p, s)| s.is_none() && p.default == Default::Required)
        {
            self.error(
                Diagnostic::new(
                    "lmx::call::missing_argument",
                    format!("`{name}` is missing its argument `{}`", missing.0.name),
                    span,
                    format!("`{}` is required", missing.0.name),
                )
                .with_help(format!("`{}`", signature(name, params))),
            );
            return None;
        }
        Some(slots)
    }

    /// Whether an argument fits its slot; reports it when not.
    fn fits(&mut self, func: &str, param: &str, slot: Slot, e: &Expr, ty: &Ty) -> bool {
        let mismatch = |found: &Ty| {
            Diagnostic::new(
                "lmx::type::mismatch",
                format!(
                    "`{param}` of `{func}` must be {}, found a {found}",
                    slot.describe()
                ),
                e.span,
                format!("expected {}", slot.describe()),
            )
        };
        let tensor_in_static = |t: &TensorTy| {
            Diagnostic::new(
                "lmx::branch::tensor_shape",
                format!(
                    "`{param}` of `{func}` is a tensor, but it must be known when the graph is built"
                ),
                e.span,
                format!("this is a tensor of shape {}", t.shape_text()),
            )
            .with_help("sizes, axes, flags and settings are static: config values, shape sizes or literals")
        };
        match (slot, ty) {
            (Slot::Tensor, Ty::Tensor(_)) => true,
            (
                Slot::Operand,
                Ty::Tensor(_) | Ty::Static(StaticTy::Int(_) | StaticTy::Float | StaticTy::Bool),
            ) => true,
            (Slot::Int | Slot::Axis | Slot::Count, Ty::Static(StaticTy::Int(_))) => true,
            (Slot::Float, Ty::Static(StaticTy::Int(_) | StaticTy::Float)) => true,
            (Slot::Bool, Ty::Static(StaticTy::Bool)) => true,
            (Slot::Shape | Slot::Axes | Slot::Tensors, Ty::Tuple(items))
                if matches!(e.kind, ExprKind::List(_)) =>
            {
                self.list_fits(func, param, slot, e, items)
            }
            (s, Ty::Tensor(t)) if s.is_static() => {
                let d = tensor_in_static(t);
                self.error(d);
                false
            }
            (_, found) => {
                let d = mismatch(found);
                self.error(d);
                false
            }
        }
    }

    /// Whether each item of a list argument fits.
    fn list_fits(&mut self, func: &str, param: &str, slot: Slot, e: &Expr, items: &[Ty]) -> bool {
        let ExprKind::List(exprs) = &e.kind else {
            return false;
        };
        let item_slot = match slot {
            Slot::Tensors => Slot::Tensor,
            _ => Slot::Int,
        };
        if slot == Slot::Tensors && exprs.is_empty() {
            self.error(Diagnostic::new(
                "lmx::type::mismatch",
                format!("`{param}` of `{func}` needs at least one tensor"),
                e.span,
                "an empty list",
            ));
            return false;
        }
        exprs
            .iter()
            .zip(items)
            .all(|(item, ty)| self.fits(func, param, item_slot, item, ty))
    }
}
