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
use crate::ir::AttentionSite;
use crate::span::Span;
use crate::types::{LayerTy, ModuleTy, StaticTy, TensorTy, Ty};

/// Functions that keep their argument's shape.
pub const ELEMENTWISE: [&str; 17] = [
    "gelu",
    "gelu_approx",
    "silu",
    "relu",
    "sigmoid",
    "tanh",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "abs",
    "square",
    "sin",
    "cos",
    "softplus",
    "stop_gradient",
    "as_float",
];

/// Every built-in function of forward passes.
pub const FORWARD_BUILTINS: [&str; 30] = [
    "softmax",
    "log_softmax",
    "dropout",
    "sum",
    "mean",
    "max",
    "min",
    "logsumexp",
    "maximum",
    "minimum",
    "where",
    "reshape",
    "transpose",
    "swapaxes",
    "expand_dims",
    "squeeze",
    "split",
    "concat",
    "matmul",
    "arange",
    "zeros",
    "ones",
    "attention",
    "rope",
    "alibi",
    "sinusoidal",
    "one_hot",
    "argsort",
    "argpartition",
    "top_k",
];

/// Built-ins that may be called with static arguments only.
pub const MORE_BUILTINS: [&str; 9] = [
    "take_along_axis",
    "cross_entropy",
    "len",
    "int",
    "float",
    "bool",
    "logical_and",
    "logical_or",
    "logical_not",
];

/// Built-ins available only in steps.
pub const STEP_BUILTINS: [&str; 3] = ["forward", "grad", "clip_grad_norm"];

/// Whether `name` is a built-in function in this context.
pub fn is_builtin(name: &str, ctx: Context) -> bool {
    ELEMENTWISE.contains(&name)
        || FORWARD_BUILTINS.contains(&name)
        || MORE_BUILTINS.contains(&name)
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
    args: &'a [Arg],
    tys: Vec<Ty>,
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

fn normalise_axis(axis: i64, rank: usize) -> Option<usize> {
    let r = i64::try_from(rank).ok()?;
    let a = if axis < 0 { axis + r } else { axis };
    usize::try_from(a).ok().filter(|a| *a < rank)
}

fn literal_int(e: &Expr) -> Option<i64> {
    match &e.kind {
        ExprKind::Int(i) => Some(*i),
        ExprKind::Unary(crate::ast::UnaryOp::Neg, inner) => literal_int(inner).map(|i| -i),
        _ => None,
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
        let ft = self.infer(callee, scope, ctx);
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
            Ty::Function(name) if name.starts_with('.') => {
                let ExprKind::Member(target, method) = &callee.kind else {
                    return Ty::Unknown;
                };
                let t = self.infer(target, scope, ctx);
                self.host_read(&format!(".{}()", &name[1..]), target.span, method.span, &t);
                Ty::Unknown
            }
            Ty::Function(name) => self.builtin(&name, e.span, &args, ctx),
            Ty::Module(ModuleTy::Layer(layer)) => self.layer_call(&layer, callee, &args),
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

    fn host_read(&mut self, what: &str, target: Span, at: Span, t: &Ty) {
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

    /// A static int argument; `Some(None)` when it is static but not a known dim.
    fn int_arg(
        &mut self,
        args: &Args<'_>,
        pos: usize,
        name: &str,
        func: &str,
    ) -> Option<Option<Dim>> {
        let (e, t) = args.get(pos, name)?;
        if let Ty::Tensor(t) = t {
            self.error(
                Diagnostic::new(
                    "lmx::branch::tensor_shape",
                    format!("`{name}` of `{func}` is a tensor, but it must be known when the graph is built"),
                    e.span,
                    format!("this is a tensor of shape {}", t.shape_text()),
                )
                .with_help("sizes, axes and counts must be static: config values, shape sizes or literals"),
            );
            return None;
        }
        if !self.expect_static(
            t,
            &StaticTy::Int(None),
            e.span,
            &format!("`{name}` of `{func}`"),
        ) {
            return None;
        }
        match t {
            Ty::Static(StaticTy::Int(d)) => Some(d.clone()),
            _ => Some(None),
        }
    }

    fn axis_arg(&mut self, args: &Args<'_>, pos: usize, rank: usize, func: &str) -> Option<usize> {
        let Some((e, _)) = args.get(pos, "axis") else {
            return normalise_axis(-1, rank);
        };
        self.int_arg(args, pos, "axis", func)?;
        let axis = literal_int(e);
        match axis.and_then(|a| normalise_axis(a, rank)) {
            Some(a) => Some(a),
            None => {
                self.error(Diagnostic::new(
                    "lmx::shape::axis",
                    format!("axis of `{func}` must be a literal within rank {rank}"),
                    e.span,
                    "out of range",
                ));
                None
            }
        }
    }

    fn builtin(&mut self, name: &str, span: Span, args: &Args<'_>, ctx: Context) -> Ty {
        let all_static = args.tys.iter().all(|t| matches!(t, Ty::Static(_)));
        if ELEMENTWISE.contains(&name) {
            if all_static && !args.tys.is_empty() {
                return Ty::Static(StaticTy::Float);
            }
            let Some(t) = self.tensor_arg(args, 0, "x", name) else {
                return Ty::Unknown;
            };
            let dtype = if name == "as_float" {
                Dtype::Float
            } else {
                t.dtype
            };
            return Ty::Tensor(TensorTy {
                dtype,
                origin: span,
                ..t
            });
        }
        match name {
            "int" | "float" | "bool" | "len" => {
                if let Some((e, t @ Ty::Tensor(_))) = args.get(0, "x") {
                    self.host_read(&format!("{name}(..)"), e.span, span, t);
                    return Ty::Unknown;
                }
                match name {
                    "float" => Ty::Static(StaticTy::Float),
                    "bool" => Ty::Static(StaticTy::Bool),
                    _ => Ty::Static(StaticTy::Int(None)),
                }
            }
            "min" | "max" if all_static => {
                let ints = args
                    .tys
                    .iter()
                    .all(|t| matches!(t, Ty::Static(StaticTy::Int(_))));
                Ty::Static(if ints {
                    StaticTy::Int(None)
                } else {
                    StaticTy::Float
                })
            }
            "softmax" | "log_softmax" | "dropout" => {
                if name == "dropout" && ctx == Context::Step {
                    self.error(
                        Diagnostic::new(
                            "lmx::step::dropout",
                            "`dropout` belongs in a forward pass, not in a step",
                            span,
                            "in a step",
                        )
                        .with_help(
                            "apply it inside the model's or a block's `forward`, where the step's random key reaches it",
                        ),
                    );
                } else if name == "dropout" {
                    self.facts.uses_rng = true;
                    match args.get(1, "p") {
                        Some((e, t)) => {
                            let t = t.clone();
                            if self.expect_static(
                                &t,
                                &StaticTy::Float,
                                e.span,
                                "a dropout probability",
                            ) {
                                self.facts.dropout.push(e.clone());
                            }
                        }
                        None => self.missing_arg(span, name, "p"),
                    }
                }
                self.tensor_arg(args, 0, "x", name)
                    .map_or(Ty::Unknown, |t| Ty::Tensor(TensorTy { origin: span, ..t }))
            }
            "sum" | "mean" | "max" | "min" | "logsumexp" => self.reduce(name, span, args),
            "maximum" | "minimum" | "where" | "logical_and" | "logical_or" | "logical_not" => {
                self.elementwise_many(name, span, args)
            }
            "reshape" => self.reshape(span, args),
            "transpose" => self.transpose(span, args),
            "swapaxes" => {
                let Some(t) = self.tensor_arg(args, 0, "x", name) else {
                    return Ty::Unknown;
                };
                let Some(mut shape) = t.shape.clone() else {
                    return Ty::Tensor(t);
                };
                let (Some((a, _)), Some((b, _))) = (args.get(1, "a"), args.get(2, "b")) else {
                    self.missing_arg(span, name, "a, b");
                    return Ty::Unknown;
                };
                match (
                    literal_int(a).and_then(|a| normalise_axis(a, shape.len())),
                    literal_int(b).and_then(|b| normalise_axis(b, shape.len())),
                ) {
                    (Some(i), Some(j)) => {
                        shape.swap(i, j);
                        Ty::Tensor(TensorTy::new(t.dtype, shape, span))
                    }
                    _ => {
                        self.error(Diagnostic::new(
                            "lmx::shape::axis",
                            format!(
                                "axes of `swapaxes` must be literals within rank {}",
                                shape.len()
                            ),
                            span,
                            "out of range",
                        ));
                        Ty::Unknown
                    }
                }
            }
            "expand_dims" | "squeeze" => {
                let Some(t) = self.tensor_arg(args, 0, "x", name) else {
                    return Ty::Unknown;
                };
                let Some(mut shape) = t.shape.clone() else {
                    return Ty::Tensor(t);
                };
                let rank = if name == "expand_dims" {
                    shape.len() + 1
                } else {
                    shape.len()
                };
                let Some(axis) = self.axis_arg(args, 1, rank, name) else {
                    return Ty::Unknown;
                };
                if name == "expand_dims" {
                    shape.insert(axis, Dim::constant(1));
                } else {
                    shape.remove(axis);
                }
                Ty::Tensor(TensorTy::new(t.dtype, shape, span))
            }
            "split" => self.split(span, args),
            "concat" => self.concat(span, args),
            "matmul" => {
                let (Some(a), Some(b)) = (
                    self.tensor_arg(args, 0, "a", name),
                    self.tensor_arg(args, 1, "b", name),
                ) else {
                    return Ty::Unknown;
                };
                matmul(self, span, &a, &b)
            }
            "arange" => {
                let Some(n) = self.int_arg(args, 0, "n", name) else {
                    self.missing_arg(span, name, "n");
                    return Ty::Unknown;
                };
                let n = n.unwrap_or_else(|| Dim::opaque("n"));
                Ty::Tensor(TensorTy::new(Dtype::Int, vec![n], span))
            }
            "zeros" | "ones" => match self.shape_list(args, 0, name) {
                Some(shape) => Ty::Tensor(TensorTy::new(Dtype::Float, shape, span)),
                None => Ty::Unknown,
            },
            "attention" => self.attention(span, args),
            "rope" => {
                let Some(t) = self.tensor_arg(args, 0, "x", name) else {
                    return Ty::Unknown;
                };
                if t.rank().is_some_and(|r| r != 4) {
                    self.rank_error(span, "rope", "[B, heads, T, head_dim]", &t);
                    return Ty::Unknown;
                }
                Ty::Tensor(TensorTy { origin: span, ..t })
            }
            "alibi" => {
                let heads = self.int_arg(args, 0, "heads", name).flatten();
                let len = self.int_arg(args, 1, "len", name).flatten();
                match (heads, len) {
                    (Some(h), Some(t)) => {
                        Ty::Tensor(TensorTy::new(Dtype::Float, vec![h, t.clone(), t], span))
                    }
                    _ => Ty::Unknown,
                }
            }
            "sinusoidal" => {
                let len = self.int_arg(args, 0, "len", name).flatten();
                let dim = self.int_arg(args, 1, "dim", name).flatten();
                match (len, dim) {
                    (Some(t), Some(d)) => Ty::Tensor(TensorTy::new(Dtype::Float, vec![t, d], span)),
                    _ => Ty::Unknown,
                }
            }
            "one_hot" => {
                let Some(t) = self.tensor_arg(args, 0, "indices", name) else {
                    return Ty::Unknown;
                };
                let Some(n) = self.int_arg(args, 1, "n", name).flatten() else {
                    return Ty::Unknown;
                };
                let Some(mut shape) = t.shape else {
                    return Ty::Unknown;
                };
                shape.push(n);
                Ty::Tensor(TensorTy::new(Dtype::Float, shape, span))
            }
            "argsort" | "argpartition" => {
                let Some(t) = self.tensor_arg(args, 0, "x", name) else {
                    return Ty::Unknown;
                };
                if name == "argpartition" {
                    self.int_arg(args, 1, "kth", name);
                }
                Ty::Tensor(TensorTy {
                    dtype: Dtype::Int,
                    origin: span,
                    ..t
                })
            }
            "top_k" => {
                let Some(t) = self.tensor_arg(args, 0, "x", name) else {
                    return Ty::Unknown;
                };
                let Some(k) = self.int_arg(args, 1, "k", name).flatten() else {
                    return Ty::Unknown;
                };
                let Some(mut shape) = t.shape.clone() else {
                    return Ty::Unknown;
                };
                if let Some(last) = shape.last_mut() {
                    *last = k;
                }
                Ty::Tuple(vec![
                    Ty::Tensor(TensorTy::new(t.dtype, shape.clone(), span)),
                    Ty::Tensor(TensorTy::new(Dtype::Int, shape, span)),
                ])
            }
            "take_along_axis" => {
                let (Some(x), Some(i)) = (
                    self.tensor_arg(args, 0, "x", name),
                    self.tensor_arg(args, 1, "indices", name),
                ) else {
                    return Ty::Unknown;
                };
                if x.rank().is_some() && i.rank().is_some() && x.rank() != i.rank() {
                    self.rank_error(
                        span,
                        name,
                        &format!("indices of rank {}", x.rank().unwrap_or(0)),
                        &i,
                    );
                    return Ty::Unknown;
                }
                Ty::Tensor(TensorTy {
                    dtype: x.dtype,
                    shape: i.shape,
                    origin: span,
                })
            }
            "cross_entropy" => self.cross_entropy(span, args),
            "forward" | "grad" | "clip_grad_norm" if ctx == Context::Step => {
                self.step_builtin(name, span, args)
            }
            _ => {
                self.error(Diagnostic::new(
                    "lmx::name::unknown",
                    format!("`{name}` cannot be called here"),
                    span,
                    "not available in this context",
                ));
                Ty::Unknown
            }
        }
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

    fn reduce(&mut self, name: &str, span: Span, args: &Args<'_>) -> Ty {
        let Some(t) = self.tensor_arg(args, 0, "x", name) else {
            return Ty::Unknown;
        };
        let Some(shape) = t.shape.clone() else {
            return Ty::Tensor(t);
        };
        if args.get(1, "axis").is_none() {
            return Ty::Tensor(TensorTy::new(t.dtype, Vec::new(), span));
        }
        let Some(axis) = self.axis_arg(args, 1, shape.len(), name) else {
            return Ty::Unknown;
        };
        let keep = matches!(
            args.get(2, "keepdims"),
            Some((
                Expr {
                    kind: ExprKind::Bool(true),
                    ..
                },
                _
            ))
        );
        let mut shape = shape;
        if keep {
            shape[axis] = Dim::constant(1);
        } else {
            shape.remove(axis);
        }
        Ty::Tensor(TensorTy::new(t.dtype, shape, span))
    }

    fn elementwise_many(&mut self, name: &str, span: Span, args: &Args<'_>) -> Ty {
        let mut out: Option<TensorTy> = None;
        for (i, (arg, ty)) in args.args.iter().zip(&args.tys).enumerate() {
            let t = match ty {
                Ty::Tensor(t) => t.clone(),
                Ty::Static(_) => continue,
                _ => return Ty::Unknown,
            };
            if name == "where" && i == 0 && t.dtype != Dtype::Bool {
                self.error(Diagnostic::new(
                    "lmx::type::mismatch",
                    "the condition of `where` must be a bool tensor",
                    arg.value.span,
                    "compare to make a mask, e.g. `x > 0`",
                ));
                return Ty::Unknown;
            }
            let dtype = if name == "where" && i == 0 {
                Dtype::Float
            } else {
                t.dtype
            };
            out = Some(match out {
                None => TensorTy {
                    dtype,
                    origin: span,
                    ..t
                },
                Some(acc) => match (&acc.shape, &t.shape) {
                    (Some(a), Some(b)) => match broadcast(a, b) {
                        Ok(s) => TensorTy::new(dtype, s, span),
                        Err(_) => {
                            self.error(
                                Diagnostic::new(
                                    "lmx::shape::mismatch",
                                    format!(
                                        "arguments of `{name}` do not broadcast: {} and {}",
                                        shape_text(a),
                                        shape_text(b)
                                    ),
                                    arg.value.span,
                                    format!("this has shape {}", t.shape_text()),
                                )
                                .with_label(t.origin, "its shape comes from here"),
                            );
                            return Ty::Unknown;
                        }
                    },
                    _ => TensorTy {
                        dtype,
                        shape: None,
                        origin: span,
                    },
                },
            });
        }
        let logical = name.starts_with("logical");
        match out {
            Some(t) if logical => Ty::Tensor(TensorTy {
                dtype: Dtype::Bool,
                ..t
            }),
            Some(t) => Ty::Tensor(t),
            None => {
                self.tensor_arg(args, 0, "x", name);
                Ty::Unknown
            }
        }
    }

    /// The dims of a `[a, b, c]` argument.
    fn shape_list(&mut self, args: &Args<'_>, pos: usize, func: &str) -> Option<Vec<Dim>> {
        let (e, ty) = args.get(pos, "shape").or_else(|| {
            self.missing_arg(args.span, func, "shape");
            None
        })?;
        let (ExprKind::List(items), Ty::Tuple(tys)) = (&e.kind, ty) else {
            self.error(Diagnostic::new(
                "lmx::type::mismatch",
                format!("`{func}` expects a shape such as `[B, T, d_model]`"),
                e.span,
                "expected a list of sizes",
            ));
            return None;
        };
        let mut out = Vec::new();
        for (item, t) in items.iter().zip(tys) {
            match t {
                Ty::Static(StaticTy::Int(Some(d))) => out.push(d.clone()),
                Ty::Tensor(t) => {
                    self.error(
                        Diagnostic::new(
                            "lmx::branch::tensor_shape",
                            "a tensor is used as a size",
                            item.span,
                            format!("this is a tensor of shape {}", t.shape_text()),
                        )
                        .with_help("sizes must be known when the graph is built: config values, shape sizes or literals"),
                    );
                    return None;
                }
                Ty::Unknown => return None,
                other => {
                    self.expect_static(other, &StaticTy::Int(None), item.span, "a size");
                    out.push(Dim::opaque(&crate::text::expr_text(item)));
                }
            }
        }
        Some(out)
    }

    fn reshape(&mut self, span: Span, args: &Args<'_>) -> Ty {
        let Some(t) = self.tensor_arg(args, 0, "x", "reshape") else {
            return Ty::Unknown;
        };
        let Some(shape) = self.shape_list(args, 1, "reshape") else {
            return Ty::Unknown;
        };
        if let Some(from) = &t.shape {
            let product = |s: &[Dim]| s.iter().fold(Dim::constant(1), |acc, d| acc.mul(d));
            let (a, b) = (product(from), product(&shape));
            if a != b {
                let text = |s: &[Dim]| {
                    s.iter()
                        .map(|d| d.to_string())
                        .collect::<Vec<_>>()
                        .join(" * ")
                };
                let (a, b) = (text(from), text(&shape));
                self.error(
                    Diagnostic::new(
                        "lmx::shape::reshape",
                        format!(
                            "cannot reshape {} into {}: `{a}` elements against `{b}`",
                            t.shape_text(),
                            shape_text(&shape)
                        ),
                        span,
                        "the element counts differ",
                    )
                    .with_label(
                        t.origin,
                        format!("the shape {} comes from here", t.shape_text()),
                    ),
                );
                return Ty::Unknown;
            }
        }
        Ty::Tensor(TensorTy::new(t.dtype, shape, span))
    }

    fn transpose(&mut self, span: Span, args: &Args<'_>) -> Ty {
        let Some(t) = self.tensor_arg(args, 0, "x", "transpose") else {
            return Ty::Unknown;
        };
        let Some(shape) = t.shape.clone() else {
            return Ty::Tensor(t);
        };
        let Some((e, _)) = args.get(1, "axes") else {
            self.missing_arg(span, "transpose", "axes");
            return Ty::Unknown;
        };
        let perm: Option<Vec<usize>> = match &e.kind {
            ExprKind::List(items) => items
                .iter()
                .map(|i| literal_int(i).and_then(|a| normalise_axis(a, shape.len())))
                .collect(),
            _ => None,
        };
        let valid = perm.as_ref().is_some_and(|p| {
            let mut sorted = p.clone();
            sorted.sort_unstable();
            sorted == (0..shape.len()).collect::<Vec<_>>()
        });
        match perm {
            Some(p) if valid => Ty::Tensor(TensorTy::new(
                t.dtype,
                p.iter().map(|&i| shape[i].clone()).collect(),
                span,
            )),
            _ => {
                self.error(
                    Diagnostic::new(
                        "lmx::shape::axis",
                        format!(
                            "`transpose` needs a permutation of the {} axes of {}",
                            shape.len(),
                            t.shape_text()
                        ),
                        e.span,
                        "not a permutation",
                    )
                    .with_label(
                        t.origin,
                        format!("the shape {} comes from here", t.shape_text()),
                    ),
                );
                Ty::Unknown
            }
        }
    }

    fn split(&mut self, span: Span, args: &Args<'_>) -> Ty {
        let Some(t) = self.tensor_arg(args, 0, "x", "split") else {
            return Ty::Unknown;
        };
        let Some((n_expr, _)) = args.get(1, "n") else {
            self.missing_arg(span, "split", "n");
            return Ty::Unknown;
        };
        let n = match literal_int(n_expr) {
            Some(n) if (1..=64).contains(&n) => n,
            _ => {
                self.error(Diagnostic::new(
                    "lmx::call::split_count",
                    "`split` needs a literal count between 1 and 64",
                    n_expr.span,
                    "the number of results must be written out",
                ));
                return Ty::Unknown;
            }
        };
        let Some(mut shape) = t.shape.clone() else {
            return Ty::Unknown;
        };
        let Some(axis) = self.axis_arg(args, 2, shape.len(), "split") else {
            return Ty::Unknown;
        };
        shape[axis] = shape[axis].div(&Dim::constant(n));
        let part = Ty::Tensor(TensorTy::new(t.dtype, shape, span));
        Ty::Tuple(vec![part; usize::try_from(n).unwrap_or(1)])
    }

    fn concat(&mut self, span: Span, args: &Args<'_>) -> Ty {
        let Some((
            Expr {
                kind: ExprKind::List(items),
                ..
            },
            Ty::Tuple(tys),
        )) = args.get(0, "xs")
        else {
            self.missing_arg(span, "concat", "xs");
            return Ty::Unknown;
        };
        let mut parts = Vec::new();
        for (item, t) in items.iter().zip(tys) {
            match t {
                Ty::Tensor(TensorTy {
                    shape: Some(s),
                    dtype,
                    ..
                }) => parts.push((item.span, s.clone(), *dtype)),
                _ => return Ty::Unknown,
            }
        }
        let Some((_, first, dtype)) = parts.first().cloned() else {
            return Ty::Unknown;
        };
        let Some(axis) = self.axis_arg(args, 1, first.len(), "concat") else {
            return Ty::Unknown;
        };
        let mut out = first.clone();
        for (s, shape, _) in &parts[1..] {
            let same_rest = shape.len() == first.len()
                && shape
                    .iter()
                    .zip(&first)
                    .enumerate()
                    .all(|(i, (a, b))| i == axis || a == b);
            if !same_rest {
                self.error(Diagnostic::new(
                    "lmx::shape::mismatch",
                    format!(
                        "`concat` parts differ off the joined axis: {} and {}",
                        shape_text(&first),
                        shape_text(shape)
                    ),
                    *s,
                    format!("this has shape {}", shape_text(shape)),
                ));
                return Ty::Unknown;
            }
            out[axis] = out[axis].add(&shape[axis], 1);
        }
        Ty::Tensor(TensorTy::new(dtype, out, span))
    }

    fn attention(&mut self, span: Span, args: &Args<'_>) -> Ty {
        let (Some(q), Some(k), Some(v)) = (
            self.tensor_arg(args, 0, "q", "attention"),
            self.tensor_arg(args, 1, "k", "attention"),
            self.tensor_arg(args, 2, "v", "attention"),
        ) else {
            return Ty::Unknown;
        };
        for t in [&q, &k, &v] {
            if t.rank().is_some_and(|r| r != 4) {
                self.rank_error(span, "attention", "[B, heads, T, head_dim]", t);
                return Ty::Unknown;
            }
        }
        for name in ["window", "scale"] {
            if let Some((e, Ty::Tensor(t))) = args.get(usize::MAX, name) {
                self.error(
                    Diagnostic::new(
                        "lmx::branch::tensor_shape",
                        format!("`{name}` of `attention` is a tensor, but it must be known when the graph is built"),
                        e.span,
                        format!("this is a tensor of shape {}", t.shape_text()),
                    )
                    .with_help("pass a static value; for per-position masking pass a `bias` tensor"),
                );
                return Ty::Unknown;
            }
        }
        let (Some(sq), Some(sk), Some(sv)) = (&q.shape, &k.shape, &v.shape) else {
            return Ty::Tensor(TensorTy {
                shape: None,
                origin: span,
                ..q
            });
        };
        if sq[3] != sk[3] || sk[2] != sv[2] {
            let (what, a, b) = if sq[3] != sk[3] {
                ("head width", &q, &k)
            } else {
                ("length", &k, &v)
            };
            self.error(
                Diagnostic::new(
                    "lmx::shape::mismatch",
                    format!(
                        "`attention` {what} differs: {} and {}",
                        a.shape_text(),
                        b.shape_text()
                    ),
                    span,
                    "in this attention",
                )
                .with_label(a.origin, format!("this has shape {}", a.shape_text()))
                .with_label(b.origin, format!("this has shape {}", b.shape_text())),
            );
            return Ty::Unknown;
        }
        let causal = matches!(
            args.get(usize::MAX, "causal"),
            Some((
                Expr {
                    kind: ExprKind::Bool(true),
                    ..
                },
                _
            ))
        );
        self.facts.attention.push(AttentionSite {
            heads: sq[1].clone(),
            kv_heads: sk[1].clone(),
            q_len: sq[2].clone(),
            kv_len: sk[2].clone(),
            head_dim: sq[3].clone(),
            causal,
        });
        let shape = vec![sq[0].clone(), sq[1].clone(), sq[2].clone(), sv[3].clone()];
        Ty::Tensor(TensorTy::new(q.dtype, shape, span))
    }

    fn cross_entropy(&mut self, span: Span, args: &Args<'_>) -> Ty {
        let (Some(logits), Some(targets)) = (
            self.tensor_arg(args, 0, "logits", "cross_entropy"),
            self.tensor_arg(args, 1, "targets", "cross_entropy"),
        ) else {
            return Ty::Unknown;
        };
        if targets.dtype != Dtype::Int {
            self.error(Diagnostic::new(
                "lmx::type::mismatch",
                "`cross_entropy` targets must be an int tensor of class ids",
                targets.origin,
                "not int",
            ));
            return Ty::Unknown;
        }
        if let (Some(l), Some(t)) = (&logits.shape, &targets.shape) {
            if l.len() != t.len() + 1 || l[..t.len()] != t[..] {
                self.error(
                    Diagnostic::new(
                        "lmx::shape::mismatch",
                        format!(
                            "`cross_entropy` logits {} do not match targets {}",
                            logits.shape_text(),
                            targets.shape_text()
                        ),
                        span,
                        "logits must be the targets' shape plus a class axis",
                    )
                    .with_label(
                        logits.origin,
                        format!("logits have shape {}", logits.shape_text()),
                    )
                    .with_label(
                        targets.origin,
                        format!("targets have shape {}", targets.shape_text()),
                    ),
                );
                return Ty::Unknown;
            }
        }
        Ty::Tensor(TensorTy::new(Dtype::Float, Vec::new(), span))
    }

    fn layer_call(&mut self, layer: &LayerTy, callee: &Expr, args: &Args<'_>) -> Ty {
        let name = crate::text::expr_text(callee);
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
                    "`{callee}` takes {} inputs, found {}",
                    sig.inputs.len(),
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
