//! Calls: built-in tensor functions with their shape rules, layers, blocks, and host reads.

use std::collections::HashMap;

use super::exprs::broadcast;

/// The help line of host-read diagnostics.
pub const HOST_READ_HELP: &str = "keep the value in the graph: compute with tensors, and choose between values with `where(cond, a, b)`";
use super::scope::Scope;
use super::{Checker, Context, Signature};
use crate::ast::{Arg, Dtype, Expr, ExprKind};
use crate::diag::Diagnostic;
use crate::dim::{shape_text, Dim};
use crate::span::Span;
use crate::types::{LayerTy, ModuleTy, TensorTy, Ty};

/// Built-ins available only in steps.
pub const STEP_BUILTINS: [&str; 3] = ["forward", "grad", "clip_grad_norm"];

/// Whether `name` is a built-in function in this context.
pub fn is_builtin(name: &str, ctx: Context) -> bool {
    crate::builtins::lookup(name).is_some()
        || (ctx == Context::Step && STEP_BUILTINS.contains(&name))
}

/// The type of `a @ b`.
pub(crate) fn matmul(c: &mut Checker<'_>, span: Span, a: &TensorTy, b: &TensorTy) -> Ty {
    let (Some(sa), Some(sb)) = (&a.shape, &b.shape) else {
        return Ty::Tensor(TensorTy {
            dtype: a.dtype,
            shape: None,
            origin: span,
        });
    };
    if sa.len() < 2 || sb.len() < 2 {
        c.error(
            Diagnostic::new(
                "lmx::shape::rank",
                "`@` needs tensors of rank 2 or more",
                span,
                "in this product",
            )
            .with_label(a.origin, format!("this has shape {}", a.shape_text()))
            .with_label(b.origin, format!("this has shape {}", b.shape_text())),
        );
        return Ty::Unknown;
    }
    let (k1, k2) = (&sa[sa.len() - 1], &sb[sb.len() - 2]);
    if k1 != k2 {
        c.error(
            Diagnostic::new(
                "lmx::shape::matmul",
                format!(
                    "inner dimensions differ in {} @ {}: `{k1}` against `{k2}`",
                    a.shape_text(),
                    b.shape_text()
                ),
                span,
                "in this product",
            )
            .with_label(a.origin, format!("the left side has shape {}", a.shape_text()))
            .with_label(b.origin, format!("the right side has shape {}", b.shape_text()))
            .with_help("the last dimension of the left side must equal the second-to-last of the right side; `swapaxes(b, -1, -2)` transposes"),
        );
        return Ty::Unknown;
    }
    match broadcast(&sa[..sa.len() - 2], &sb[..sb.len() - 2]) {
        Ok(mut batch) => {
            batch.push(sa[sa.len() - 2].clone());
            batch.push(sb[sb.len() - 1].clone());
            Ty::Tensor(TensorTy::new(a.dtype, batch, span))
        }
        Err(_) => {
            c.error(Diagnostic::new(
                "lmx::shape::mismatch",
                format!(
                    "batch dimensions of {} and {} do not broadcast",
                    a.shape_text(),
                    b.shape_text()
                ),
                span,
                "in this product",
            ));
            Ty::Unknown
        }
    }
}

/// Arguments of one call, with their types, found by position or keyword.
pub(crate) struct Args<'a> {
    pub(crate) args: &'a [Arg],
    pub(crate) tys: Vec<Ty>,
    span: Span,
}

impl<'a> Args<'a> {
    pub(crate) fn get(&self, pos: usize, name: &str) -> Option<(&'a Expr, &Ty)> {
        let by_name = self
            .args
            .iter()
            .position(|a| a.name.as_ref().is_some_and(|n| n.name == name));
        let idx = by_name.or_else(|| {
            self.args
                .iter()
                .enumerate()
                .filter(|(_, a)| a.name.is_none())
                .nth(pos)
                .map(|(i, _)| i)
        })?;
        Some((&self.args[idx].value, &self.tys[idx]))
    }
}

impl Checker<'_> {
    /// The type of `callee(args)`.
    pub(crate) fn call(
        &mut self,
        e: &Expr,
        callee: &Expr,
        args: &[Arg],
        scope: &mut Scope,
        ctx: Context,
    ) -> Ty {
        // A built-in's name is resolved here, in the one position where a function may appear.
        let ft = match &callee.kind {
            ExprKind::Name(n) if scope.get(n).is_none() && is_builtin(n, ctx) => {
                Ty::Function(n.clone())
            }
            // A model a step calls besides its own is in the step's state only when declared.
            ExprKind::Name(n)
                if ctx == Context::Step
                    && scope.get(n).is_none()
                    && super::suggest::closest(n, scope.names()).is_none() =>
            {
                self.error(
                    Diagnostic::new(
                        "lmx::name::unknown",
                        format!("cannot find `{n}` in this scope"),
                        callee.span,
                        "not found",
                    )
                    .with_help(format!(
                        "a frozen copy of the model is declared at the step's top level: \
                         `frozen {n} = policy`"
                    )),
                );
                Ty::Unknown
            }
            // A frozen model is callable, and only that (`lookup` refuses it as a value).
            ExprKind::Name(n)
                if scope
                    .get(n)
                    .is_some_and(|b| matches!(b.ty, Ty::Module(ModuleTy::Frozen(_)))) =>
            {
                Ty::Module(ModuleTy::Frozen(n.clone()))
            }
            _ => self.infer(callee, scope, ctx),
        };
        let tys: Vec<Ty> = args
            .iter()
            .map(|a| self.infer(&a.value, scope, ctx))
            .collect();
        let args = Args {
            args,
            tys,
            span: e.span,
        };
        match ft {
            Ty::Unknown => Ty::Unknown,
            Ty::Function(name) => match crate::builtins::lookup(&name) {
                Some(b) => self.builtin_call(b, e, args.args, args.tys, ctx),
                None => self.step_builtin(&name, e.span, &args),
            },
            Ty::Module(ModuleTy::Layer(layer)) => self.layer_call(&layer, callee, &args),
            Ty::Module(ModuleTy::Frozen(name)) => match self.model_sig.clone() {
                Some(sig) => self.signature_call(&sig, &name, e.span, &args),
                None => Ty::Unknown,
            },
            Ty::Module(ModuleTy::Block(block)) if self.broken_blocks.contains(&block) => {
                Ty::Unknown
            }
            Ty::Module(ModuleTy::Block(block)) => {
                let sig = self.blocks.get(&block).map(|b| b.sig.clone());
                match sig {
                    Some(sig) => self.signature_call(&sig, &block, e.span, &args),
                    None => Ty::Unknown,
                }
            }
            other => {
                self.error(Diagnostic::new(
                    "lmx::type::not_callable",
                    format!("a {other} cannot be called"),
                    callee.span,
                    "called here",
                ));
                Ty::Unknown
            }
        }
    }

    pub(crate) fn host_read(&mut self, what: &str, target: Span, at: Span, t: &Ty) {
        let shape = match t {
            Ty::Tensor(t) => t.shape_text(),
            _ => "[?]".to_string(),
        };
        self.error(
            Diagnostic::new(
                "lmx::branch::host_read",
                format!("`{what}` reads a tensor to the host inside a traced function"),
                at,
                "this waits for the graph to run and leaves it",
            )
            .with_label(target, format!("this is a tensor of shape {shape}"))
            .with_help(HOST_READ_HELP),
        );
    }

    fn tensor_arg(
        &mut self,
        args: &Args<'_>,
        pos: usize,
        name: &str,
        func: &str,
    ) -> Option<TensorTy> {
        match args.get(pos, name) {
            Some((_, Ty::Tensor(t))) => Some(t.clone()),
            Some((_, Ty::Unknown)) => None,
            Some((e, other)) => {
                self.error(Diagnostic::new(
                    "lmx::type::mismatch",
                    format!("`{func}` expects a tensor for `{name}`, found a {other}"),
                    e.span,
                    "expected a tensor",
                ));
                None
            }
            None => {
                self.missing_arg(args.span, func, name);
                None
            }
        }
    }

    fn missing_arg(&mut self, span: Span, func: &str, name: &str) {
        self.error(Diagnostic::new(
            "lmx::call::missing_argument",
            format!("`{func}` is missing its argument `{name}`"),
            span,
            format!("`{name}` is required"),
        ));
    }

    pub(crate) fn rank_error(&mut self, span: Span, func: &str, want: &str, t: &TensorTy) {
        self.error(
            Diagnostic::new(
                "lmx::shape::rank",
                format!(
                    "`{func}` expects {want}, found rank {}",
                    t.rank().unwrap_or(0)
                ),
                span,
                format!("called with shape {}", t.shape_text()),
            )
            .with_label(
                t.origin,
                format!("the shape {} comes from here", t.shape_text()),
            ),
        );
    }

    fn layer_call(&mut self, layer: &LayerTy, callee: &Expr, args: &Args<'_>) -> Ty {
        let name = crate::text::expr_text(callee);
        if let LayerTy::Experts(experts) = layer {
            return self.experts_call(&experts.dim, &experts.hidden, &name, args);
        }
        if self
            .bind(&name, crate::builtins::LAYER_PARAMS, args.span, args.args)
            .is_none()
        {
            return Ty::Unknown;
        }
        let Some(x) = self.tensor_arg(args, 0, "x", &name) else {
            return Ty::Unknown;
        };
        let Some(shape) = x.shape.clone() else {
            return Ty::Tensor(TensorTy {
                origin: args.span,
                ..x
            });
        };
        let (want, out) = match layer {
            LayerTy::Embedding { dim, .. } => {
                if x.dtype != Dtype::Int {
                    self.error(
                        Diagnostic::new(
                            "lmx::type::mismatch",
                            format!("embedding `{name}` takes int token ids, found a float tensor"),
                            args.span,
                            "called with floats",
                        )
                        .with_label(x.origin, "this tensor is float"),
                    );
                    return Ty::Unknown;
                }
                let mut s = shape;
                s.push(dim.clone());
                return Ty::Tensor(TensorTy::new(Dtype::Float, s, args.span));
            }
            LayerTy::Linear { input, output } => (input, Some(output)),
            LayerTy::Norm { dim } => (dim, None),
            LayerTy::Experts(_) => return Ty::Unknown,
        };
        match shape.last() {
            Some(last) if last == want => {
                let mut s = shape.clone();
                if let (Some(o), Some(l)) = (out, s.last_mut()) {
                    *l = o.clone();
                }
                Ty::Tensor(TensorTy::new(x.dtype, s, args.span))
            }
            _ => {
                self.error(
                    Diagnostic::new(
                        "lmx::shape::layer_input",
                        format!(
                            "`{name}` expects inputs of shape [.., {want}], found {}",
                            x.shape_text()
                        ),
                        args.span,
                        format!("`{name}` takes a last dimension of `{want}`"),
                    )
                    .with_label(
                        x.origin,
                        format!("the shape {} comes from here", x.shape_text()),
                    ),
                );
                Ty::Unknown
            }
        }
    }

    /// `switch_mlp(x, indices)` of an `experts(dim, hidden, count)` layer: `x [.., dim]` and int
    /// `indices [.., k]` over the same leading axes give `[.., k, dim]`; each token multiplies
    /// by `k` experts' three `hidden x dim` matrices (the FLOP count's gathered weights).
    fn experts_call(&mut self, dim: &Dim, hidden: &Dim, name: &str, args: &Args<'_>) -> Ty {
        if self
            .bind(name, crate::builtins::EXPERTS_PARAMS, args.span, args.args)
            .is_none()
        {
            return Ty::Unknown;
        }
        let (Some(x), Some(idx)) = (
            self.tensor_arg(args, 0, "x", name),
            self.tensor_arg(args, 1, "indices", name),
        ) else {
            return Ty::Unknown;
        };
        let problem = if idx.dtype != Dtype::Int {
            Some((
                "lmx::type::mismatch",
                format!(
                    "`{name}` takes int expert indices, found {} tensor",
                    idx.dtype.with_article()
                ),
            ))
        } else {
            match (&x.shape, &idx.shape) {
                (Some(sx), Some(si)) => {
                    let leading = |s: &[Dim]| s[..s.len().saturating_sub(1)].to_vec();
                    if sx.last() != Some(dim) {
                        Some((
                            "lmx::shape::layer_input",
                            format!(
                                "`{name}` expects inputs of shape [.., {dim}], found {}",
                                x.shape_text()
                            ),
                        ))
                    } else if si.is_empty() || leading(sx) != leading(si) {
                        Some((
                            "lmx::shape::mismatch",
                            format!(
                                "`{name}`: the indices {} do not cover x's tokens {}",
                                idx.shape_text(),
                                x.shape_text()
                            ),
                        ))
                    } else {
                        None
                    }
                }
                _ => None,
            }
        };
        if let Some((code, message)) = problem {
            self.error(Diagnostic::new(code, message, args.span, "in this call"));
            return Ty::Unknown;
        }
        let (Some(sx), Some(si)) = (x.shape, idx.shape) else {
            return Ty::Tensor(TensorTy {
                shape: None,
                origin: args.span,
                ..x
            });
        };
        if let Some(k) = si.last() {
            let per_token = hidden.mul(dim).mul(&Dim::constant(3)).mul(k);
            let layer = name.split('.').next().unwrap_or(name).to_owned();
            self.facts.experts_calls.push((layer, per_token));
        }
        let mut shape = si;
        shape.push(sx[sx.len() - 1].clone());
        Ty::Tensor(TensorTy::new(x.dtype, shape, args.span))
    }

    /// A call of a block or of the model's forward pass: binds the signature's free sizes.
    pub(crate) fn signature_call(
        &mut self,
        sig: &Signature,
        callee: &str,
        span: Span,
        args: &Args<'_>,
    ) -> Ty {
        if args.args.len() != sig.inputs.len() {
            self.error(Diagnostic::new(
                "lmx::call::arity",
                format!(
                    "`{callee}` takes {} input{}, found {}",
                    sig.inputs.len(),
                    if sig.inputs.len() == 1 { "" } else { "s" },
                    args.args.len()
                ),
                span,
                "wrong number of inputs",
            ));
            return Ty::Unknown;
        }
        let mut bound: HashMap<String, Dim> = HashMap::new();
        for (i, (name, want)) in sig.inputs.iter().enumerate() {
            let Some(got) = self.tensor_arg(args, i, name, callee) else {
                return Ty::Unknown;
            };
            if got.dtype != want.dtype {
                self.error(
                    Diagnostic::new(
                        "lmx::type::mismatch",
                        format!(
                            "`{callee}` takes `{name}` as {} tensor, found {} tensor",
                            want.dtype.with_article(),
                            got.dtype.with_article()
                        ),
                        args.args[i].value.span,
                        format!("{} tensor", got.dtype.with_article()),
                    )
                    .with_label(got.origin, "its dtype comes from here"),
                );
                return Ty::Unknown;
            }
            let (Some(ws), Some(gs)) = (&want.shape, &got.shape) else {
                continue;
            };
            if ws.len() != gs.len() {
                self.rank_error(
                    span,
                    callee,
                    &format!("`{name}` of shape {}", shape_text(ws)),
                    &got,
                );
                return Ty::Unknown;
            }
            for (w, g) in ws.iter().zip(gs) {
                let free = sig.free.iter().find(|f| *w == Dim::symbol(f));
                let expected = match free {
                    Some(f) if !bound.contains_key(f) => {
                        bound.insert(f.clone(), g.clone());
                        continue;
                    }
                    _ => w.subst(&bound),
                };
                if &expected != g {
                    self.error(
                        Diagnostic::new(
                            "lmx::shape::mismatch",
                            format!(
                                "`{callee}` expects `{name}` of shape {}, found {}",
                                shape_text(ws),
                                got.shape_text()
                            ),
                            args.args[i].value.span,
                            format!("`{g}` where `{expected}` is expected"),
                        )
                        .with_label(
                            got.origin,
                            format!("the shape {} comes from here", got.shape_text()),
                        ),
                    );
                    return Ty::Unknown;
                }
            }
        }
        match &sig.output {
            Some(out) => {
                let shape = out
                    .shape
                    .as_ref()
                    .map(|s| s.iter().map(|d| d.subst(&bound)).collect());
                Ty::Tensor(TensorTy {
                    dtype: out.dtype,
                    shape,
                    origin: span,
                })
            }
            None => Ty::Tensor(TensorTy {
                dtype: Dtype::Float,
                shape: None,
                origin: span,
            }),
        }
    }
}
