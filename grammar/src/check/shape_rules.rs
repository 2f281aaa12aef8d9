//! The built-ins' shape and dtype rules, over arguments the binder has already fitted to their
//! slots (a `Tensor` slot holds a tensor, an `Int` slot a static int, ...).

use super::bind::RuleCx;
use super::exprs::broadcast;
use crate::ast::Dtype;
use crate::diag::Diagnostic;
use crate::dim::{shape_text, Dim};
use crate::ir::{AttentionSite, ScanKind, ScanSite};
use crate::types::{StaticTy, TensorTy, Ty};

/// The dtype of an elementwise result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Out {
    /// The input's.
    Same,
    /// Float (transcendental functions of int tensors are float in MLX).
    Float,
    /// Bool (logical functions).
    Bool,
}

impl Out {
    fn dtype(self, input: Dtype) -> Dtype {
        match self {
            Out::Same => input,
            Out::Float => Dtype::Float,
            Out::Bool => Dtype::Bool,
        }
    }
}

fn tensor(t: TensorTy, span: crate::span::Span) -> Ty {
    Ty::Tensor(TensorTy { origin: span, ..t })
}

/// The tensor `x` (parameter 0) and its shape; without a known shape, the result to give: `x`
/// itself (a rule over its axes can say no more).
fn shaped(c: &RuleCx<'_, '_>) -> Result<(TensorTy, Vec<Dim>), Ty> {
    let Some(x) = c.tensor(0) else {
        return Err(Ty::Unknown);
    };
    match x.shape.clone() {
        Some(shape) => Ok((x, shape)),
        None => Err(tensor(x, c.span)),
    }
}

/// Elementwise over `x`.
pub fn same_shape(c: &mut RuleCx<'_, '_>, out: Out) -> Ty {
    let Some(x) = c.tensor(0) else {
        return Ty::Unknown;
    };
    if out == Out::Bool && c.name == "logical_not" && x.dtype != Dtype::Bool {
        return not_bool(c, 0, &x);
    }
    let dtype = out.dtype(x.dtype);
    tensor(TensorTy { dtype, ..x }, c.span)
}

fn not_bool(c: &mut RuleCx<'_, '_>, i: usize, t: &TensorTy) -> Ty {
    let span = c.arg_span(i);
    let name = c.name;
    c.error(
        Diagnostic::new(
            "lmx::type::mismatch",
            format!(
                "`{name}` takes bool tensors, found {} tensor",
                t.dtype.with_article()
            ),
            span,
            "not bool",
        )
        .with_help("compare to make a mask, e.g. `x > 0`"),
    );
    Ty::Unknown
}

/// `softcap(x, cap)`: the cap must be positive where it is a literal.
pub fn softcap(c: &mut RuleCx<'_, '_>) -> Ty {
    let span = c.arg_span(1);
    if let Some(cap) = c.expr(1).and_then(literal_number) {
        if cap <= 0.0 || !cap.is_finite() {
            c.error(Diagnostic::new(
                "lmx::call::argument_range",
                "`cap` of `softcap` must be a positive number",
                span,
                "not positive",
            ));
            return Ty::Unknown;
        }
    }
    same_shape(c, Out::Float)
}

/// The value of a number literal, negated or not.
fn literal_number(e: &crate::ast::Expr) -> Option<f64> {
    use crate::ast::{ExprKind, UnaryOp};
    match &e.kind {
        ExprKind::Float(x) => Some(*x),
        ExprKind::Int(i) => Some(*i as f64),
        ExprKind::Unary(UnaryOp::Neg, inner) => literal_number(inner).map(|x| -x),
        _ => None,
    }
}

/// Same shape, with `axis` checked against the rank.
pub fn along_axis(c: &mut RuleCx<'_, '_>) -> Ty {
    let Some(x) = c.tensor(0) else {
        return Ty::Unknown;
    };
    if let Some(rank) = x.rank() {
        if c.axis(1, rank).is_none() {
            return Ty::Unknown;
        }
    }
    tensor(x, c.span)
}

/// A probability distribution along `axis` (`softmax`, `log_softmax`): float, same shape.
pub fn distribution(c: &mut RuleCx<'_, '_>) -> Ty {
    match along_axis(c) {
        Ty::Tensor(t) => Ty::Tensor(TensorTy {
            dtype: Dtype::Float,
            ..t
        }),
        other => other,
    }
}

/// Int indices of `x`'s shape, with `axis` checked against the rank (`argsort`).
pub fn along_axis_int(c: &mut RuleCx<'_, '_>) -> Ty {
    match along_axis(c) {
        Ty::Tensor(t) => Ty::Tensor(TensorTy {
            dtype: Dtype::Int,
            ..t
        }),
        other => other,
    }
}

/// `argpartition(x, kth, axis)`: `kth` within the axis where both are known.
pub fn argpartition(c: &mut RuleCx<'_, '_>) -> Ty {
    let Some(x) = c.tensor(0) else {
        return Ty::Unknown;
    };
    let Some(shape) = x.shape.clone() else {
        return Ty::Tensor(TensorTy {
            dtype: Dtype::Int,
            origin: c.span,
            ..x
        });
    };
    let Some(axis) = c.axis(2, shape.len()) else {
        return Ty::Unknown;
    };
    if let (Some(kth), Some(size)) = (c.constant(1), shape[axis].as_constant()) {
        if kth < -size || kth >= size {
            let span = c.arg_span(1);
            c.error(Diagnostic::new(
                "lmx::call::argument_range",
                format!("`kth` of `argpartition` is {kth}, outside an axis of size {size}"),
                span,
                "out of range",
            ));
            return Ty::Unknown;
        }
    }
    Ty::Tensor(TensorTy::new(Dtype::Int, shape, c.span))
}

/// `dropout(x, p)`: records that the forward pass draws random numbers.
pub fn dropout(c: &mut RuleCx<'_, '_>) -> Ty {
    let p = c.expr(1).cloned();
    let facts = c.facts();
    facts.uses_rng = true;
    facts.dropout.extend(p);
    same_shape(c, Out::Same)
}

/// A reduction over `axis` (every axis when left out), keeping it as size 1 with `keepdims`.
pub fn reduce(c: &mut RuleCx<'_, '_>) -> Ty {
    let Some(mut x) = c.tensor(0) else {
        return Ty::Unknown;
    };
    // A mean or a log-sum-exp of ints is a float (MLX's promotion).
    if matches!(c.name, "mean" | "logsumexp") {
        x.dtype = Dtype::Float;
    }
    let Some(keep) = c.flag(2) else {
        let span = c.arg_span(2);
        let name = c.name;
        c.error(Diagnostic::new(
            "lmx::call::literal_flag",
            format!("`keepdims` of `{name}` must be a literal `true` or `false`"),
            span,
            "the result's rank depends on it",
        ));
        return Ty::Unknown;
    };
    let Some(shape) = x.shape.clone() else {
        return tensor(x, c.span);
    };
    if !c.given(1) {
        let shape = if keep {
            vec![Dim::constant(1); shape.len()]
        } else {
            Vec::new()
        };
        return Ty::Tensor(TensorTy::new(x.dtype, shape, c.span));
    }
    let Some(axis) = c.axis(1, shape.len()) else {
        return Ty::Unknown;
    };
    let mut shape = shape;
    if keep {
        shape[axis] = Dim::constant(1);
    } else {
        shape.remove(axis);
    }
    Ty::Tensor(TensorTy::new(x.dtype, shape, c.span))
}

/// The broadcast of the operands `ops` (tensors or static numbers).
pub fn broadcast_operands(c: &mut RuleCx<'_, '_>, ops: &[usize], out: Out) -> Ty {
    let mut acc: Option<(Option<Vec<Dim>>, Dtype)> = None;
    let mut float_static = false;
    for &i in ops {
        let t = match c.ty(i) {
            Some(Ty::Tensor(t)) => t.clone(),
            Some(Ty::Static(StaticTy::Float)) => {
                float_static = true;
                continue;
            }
            _ => continue,
        };
        if out == Out::Bool && t.dtype != Dtype::Bool {
            return not_bool(c, i, &t);
        }
        acc = Some(match acc {
            None => (t.shape.clone(), t.dtype),
            Some((shape, dtype)) => {
                let dtype = promote(dtype, t.dtype);
                match (shape, &t.shape) {
                    (Some(a), Some(b)) => match broadcast(&a, b) {
                        Ok(s) => (Some(s), dtype),
                        Err(_) => {
                            let span = c.arg_span(i);
                            let name = c.name;
                            c.error(
                                Diagnostic::new(
                                    "lmx::shape::mismatch",
                                    format!(
                                        "arguments of `{name}` do not broadcast: {} and {}",
                                        shape_text(&a),
                                        shape_text(b)
                                    ),
                                    span,
                                    format!("this has shape {}", t.shape_text()),
                                )
                                .with_label(t.origin, "its shape comes from here"),
                            );
                            return Ty::Unknown;
                        }
                    },
                    _ => (None, dtype),
                }
            }
        });
    }
    let Some((shape, dtype)) = acc else {
        let (span, name) = (c.span, c.name);
        c.error(
            Diagnostic::new(
                "lmx::type::mismatch",
                format!("`{name}` needs at least one tensor operand"),
                span,
                "every operand is static",
            )
            .with_help("compute static values with `min`, `max` and operators"),
        );
        return Ty::Unknown;
    };
    let dtype = match out {
        Out::Same if float_static => promote(dtype, Dtype::Float),
        other => other.dtype(dtype),
    };
    Ty::Tensor(TensorTy {
        dtype,
        shape,
        origin: c.span,
    })
}

/// The dtype of a result mixing `a` and `b`: float wins over int, int over bool.
pub fn promote(a: Dtype, b: Dtype) -> Dtype {
    match (a, b) {
        (Dtype::Float, _) | (_, Dtype::Float) => Dtype::Float,
        (Dtype::Int, _) | (_, Dtype::Int) => Dtype::Int,
        _ => Dtype::Bool,
    }
}

/// `where(cond, a, b)`: a bool condition, broadcast with both values.
pub fn select(c: &mut RuleCx<'_, '_>) -> Ty {
    let Some(cond) = c.tensor(0) else {
        return Ty::Unknown;
    };
    if cond.dtype != Dtype::Bool {
        return not_bool(c, 0, &cond);
    }
    let is_static = |c: &RuleCx<'_, '_>, i| matches!(c.ty(i), Some(Ty::Static(_)));
    if is_static(c, 1) && is_static(c, 2) {
        return static_select(c, cond);
    }
    let Ty::Tensor(values) = broadcast_operands(c, &[1, 2], Out::Same) else {
        return Ty::Unknown;
    };
    match (&cond.shape, &values.shape) {
        (Some(a), Some(b)) => match broadcast(a, b) {
            Ok(s) => Ty::Tensor(TensorTy::new(values.dtype, s, c.span)),
            Err(_) => {
                let span = c.span;
                c.error(Diagnostic::new(
                    "lmx::shape::mismatch",
                    format!(
                        "the condition {} and the values {} of `where` do not broadcast",
                        cond.shape_text(),
                        values.shape_text()
                    ),
                    span,
                    "in this selection",
                ));
                Ty::Unknown
            }
        },
        _ => Ty::Tensor(TensorTy {
            shape: None,
            ..values
        }),
    }
}

/// `where(cond, 0.1, 1.0)`: two static values chosen per element of the condition.
fn static_select(c: &mut RuleCx<'_, '_>, cond: TensorTy) -> Ty {
    let float = [1, 2]
        .iter()
        .any(|&i| matches!(c.ty(i), Some(Ty::Static(StaticTy::Float))));
    let dtype = if float { Dtype::Float } else { Dtype::Int };
    Ty::Tensor(TensorTy { dtype, ..cond })
}

/// `reshape(x, shape)`: element counts equal symbolically.
pub fn reshape(c: &mut RuleCx<'_, '_>) -> Ty {
    let Some(x) = c.tensor(0) else {
        return Ty::Unknown;
    };
    let shape = c.shape(1);
    if let Some(from) = &x.shape {
        let product = |s: &[Dim]| s.iter().fold(Dim::constant(1), |acc, d| acc.mul(d));
        let (a, b) = (product(from), product(&shape));
        if a != b {
            // A compound size is parenthesised, so that the product reads as it multiplies.
            let text = |s: &[Dim]| {
                s.iter()
                    .map(|d| match d.to_string() {
                        t if t.contains(' ') => format!("({t})"),
                        t => t,
                    })
                    .collect::<Vec<_>>()
                    .join(" * ")
            };
            let (ta, tb) = (text(from), text(&shape));
            let span = c.span;
            c.error(
                Diagnostic::new(
                    "lmx::shape::reshape",
                    format!(
                        "cannot reshape {} into {}: `{ta}` elements against `{tb}`",
                        x.shape_text(),
                        shape_text(&shape)
                    ),
                    span,
                    "the element counts differ",
                )
                .with_label(
                    x.origin,
                    format!("the shape {} comes from here", x.shape_text()),
                ),
            );
            return Ty::Unknown;
        }
    }
    Ty::Tensor(TensorTy::new(x.dtype, shape, c.span))
}

/// `transpose(x, axes)`: a permutation of every axis (reversed when left out).
pub fn transpose(c: &mut RuleCx<'_, '_>) -> Ty {
    let (x, shape) = match shaped(c) {
        Ok(shaped) => shaped,
        Err(ty) => return ty,
    };
    if !c.given(1) {
        let reversed = shape.iter().rev().cloned().collect();
        return Ty::Tensor(TensorTy::new(x.dtype, reversed, c.span));
    }
    let perm: Option<Vec<usize>> = c
        .axes(1)
        .into_iter()
        .map(|a| a.and_then(|a| super::bind::normalise_axis(a, shape.len())))
        .collect();
    let valid = perm.as_ref().is_some_and(|p| {
        let mut sorted = p.clone();
        sorted.sort_unstable();
        sorted == (0..shape.len()).collect::<Vec<_>>()
    });
    match perm {
        Some(p) if valid => Ty::Tensor(TensorTy::new(
            x.dtype,
            p.iter().map(|&i| shape[i].clone()).collect(),
            c.span,
        )),
        _ => {
            let span = c.arg_span(1);
            c.error(
                Diagnostic::new(
                    "lmx::shape::axis",
                    format!(
                        "`transpose` needs a permutation of the {} axes of {}",
                        shape.len(),
                        x.shape_text()
                    ),
                    span,
                    "not a permutation",
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

/// `swapaxes(x, a, b)`.
pub fn swapaxes(c: &mut RuleCx<'_, '_>) -> Ty {
    let (x, mut shape) = match shaped(c) {
        Ok(shaped) => shaped,
        Err(ty) => return ty,
    };
    let (Some(i), Some(j)) = (c.axis(1, shape.len()), c.axis(2, shape.len())) else {
        return Ty::Unknown;
    };
    shape.swap(i, j);
    Ty::Tensor(TensorTy::new(x.dtype, shape, c.span))
}

/// `expand_dims(x, axis)`: the axis counts in the result's rank.
pub fn expand_dims(c: &mut RuleCx<'_, '_>) -> Ty {
    let (x, mut shape) = match shaped(c) {
        Ok(shaped) => shaped,
        Err(ty) => return ty,
    };
    let Some(axis) = c.axis(1, shape.len() + 1) else {
        return Ty::Unknown;
    };
    shape.insert(axis, Dim::constant(1));
    Ty::Tensor(TensorTy::new(x.dtype, shape, c.span))
}

/// `squeeze(x, axis)`: the axis must have size 1.
pub fn squeeze(c: &mut RuleCx<'_, '_>) -> Ty {
    let (x, mut shape) = match shaped(c) {
        Ok(shaped) => shaped,
        Err(ty) => return ty,
    };
    let Some(axis) = c.axis(1, shape.len()) else {
        return Ty::Unknown;
    };
    if shape[axis].as_constant() != Some(1) {
        let span = c.arg_span(1);
        c.error(
            Diagnostic::new(
                "lmx::shape::squeeze",
                format!(
                    "`squeeze` removes an axis of size 1, but axis {axis} of {} has size `{}`",
                    x.shape_text(),
                    shape[axis]
                ),
                span,
                "not of size 1",
            )
            .with_label(
                x.origin,
                format!("the shape {} comes from here", x.shape_text()),
            ),
        );
        return Ty::Unknown;
    }
    shape.remove(axis);
    Ty::Tensor(TensorTy::new(x.dtype, shape, c.span))
}

/// `split(x, n, axis)`: `n` equal parts.
pub fn split(c: &mut RuleCx<'_, '_>) -> Ty {
    let Some(x) = c.tensor(0) else {
        return Ty::Unknown;
    };
    let n = match c.expr(1).map(|e| &e.kind) {
        Some(crate::ast::ExprKind::Int(n)) if (1..=64).contains(n) => *n,
        _ => {
            let span = c.arg_span(1);
            c.error(Diagnostic::new(
                "lmx::call::split_count",
                "`split` needs a literal count between 1 and 64",
                span,
                "the number of results must be written out",
            ));
            return Ty::Unknown;
        }
    };
    let Some(mut shape) = x.shape.clone() else {
        let part = Ty::Tensor(TensorTy {
            shape: None,
            origin: c.span,
            ..x
        });
        return Ty::Tuple(vec![part; n as usize]);
    };
    let Some(axis) = c.axis(2, shape.len()) else {
        return Ty::Unknown;
    };
    if let Some(size) = shape[axis].as_constant() {
        if size % n != 0 {
            let span = c.span;
            c.error(Diagnostic::new(
                "lmx::shape::split",
                format!("`split` cannot cut axis {axis} of size {size} into {n} equal parts"),
                span,
                "not divisible",
            ));
            return Ty::Unknown;
        }
    }
    shape[axis] = shape[axis].div(&Dim::constant(n));
    let part = Ty::Tensor(TensorTy::new(x.dtype, shape, c.span));
    Ty::Tuple(vec![part; n as usize])
}

/// `concat(xs, axis)`: equal off the axis, sizes added along it.
pub fn concat(c: &mut RuleCx<'_, '_>) -> Ty {
    let parts = c.tensors(0);
    let Some((_, first)) = parts.first().cloned() else {
        return Ty::Unknown;
    };
    let mut dtype = first.dtype;
    let Some(first_shape) = first.shape.clone() else {
        return tensor(first, c.span);
    };
    let Some(axis) = c.axis(1, first_shape.len()) else {
        return Ty::Unknown;
    };
    let mut out = first_shape.clone();
    for (span, t) in &parts[1..] {
        dtype = promote(dtype, t.dtype);
        let Some(shape) = &t.shape else {
            return Ty::Tensor(TensorTy {
                dtype,
                shape: None,
                origin: c.span,
            });
        };
        let same_rest = shape.len() == first_shape.len()
            && shape
                .iter()
                .zip(&first_shape)
                .enumerate()
                .all(|(i, (a, b))| i == axis || a == b);
        if !same_rest {
            c.error(Diagnostic::new(
                "lmx::shape::mismatch",
                format!(
                    "`concat` parts differ off the joined axis: {} and {}",
                    shape_text(&first_shape),
                    shape_text(shape)
                ),
                *span,
                format!("this has shape {}", shape_text(shape)),
            ));
            return Ty::Unknown;
        }
        out[axis] = out[axis].add(&shape[axis], 1);
    }
    Ty::Tensor(TensorTy::new(dtype, out, c.span))
}

/// `matmul(a, b)`: the same rule as `a @ b`.
pub fn matmul(c: &mut RuleCx<'_, '_>) -> Ty {
    let (Some(a), Some(b)) = (c.tensor(0), c.tensor(1)) else {
        return Ty::Unknown;
    };
    let span = c.span;
    super::calls::matmul(c.c, span, &a, &b)
}

/// `arange(n)`: `[n] int`.
pub fn arange(c: &mut RuleCx<'_, '_>) -> Ty {
    let n = c.dim(0);
    Ty::Tensor(TensorTy::new(Dtype::Int, vec![n], c.span))
}

/// `zeros(shape)`, `ones(shape)`.
pub fn filled(c: &mut RuleCx<'_, '_>) -> Ty {
    let shape = c.shape(0);
    Ty::Tensor(TensorTy::new(Dtype::Float, shape, c.span))
}

/// `attention(q, k, v, ..)`: rank-4 inputs, matching widths and lengths, whole groups of query
/// heads per key head; records the call for the cost report.
pub fn attention(c: &mut RuleCx<'_, '_>) -> Ty {
    let (Some(q), Some(k), Some(v)) = (c.tensor(0), c.tensor(1), c.tensor(2)) else {
        return Ty::Unknown;
    };
    for t in [&q, &k, &v] {
        if t.rank().is_some_and(|r| r != 4) {
            c.rank_error("[B, heads, T, head_dim]", t);
            return Ty::Unknown;
        }
    }
    let (Some(sq), Some(sk), Some(sv)) = (&q.shape, &k.shape, &v.shape) else {
        return Ty::Tensor(TensorTy {
            shape: None,
            origin: c.span,
            ..q
        });
    };
    if sq[3] != sk[3] || sk[2] != sv[2] || sk[1] != sv[1] {
        let (what, a, b) = if sq[3] != sk[3] {
            ("head width", &q, &k)
        } else if sk[2] != sv[2] {
            ("length", &k, &v)
        } else {
            ("head count", &k, &v)
        };
        let span = c.span;
        c.error(
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
    if let (Some(h), Some(kv)) = (sq[1].as_constant(), sk[1].as_constant()) {
        if kv == 0 || h % kv != 0 {
            let span = c.span;
            c.error(
                Diagnostic::new(
                    "lmx::shape::heads",
                    format!(
                        "`attention` needs whole groups of query heads per key head: {h} query heads over {kv} key heads"
                    ),
                    span,
                    "in this attention",
                )
                .with_label(q.origin, format!("this has shape {}", q.shape_text()))
                .with_label(k.origin, format!("this has shape {}", k.shape_text())),
            );
            return Ty::Unknown;
        }
    }
    if !positive_literal(c, 7) {
        return Ty::Unknown;
    }
    let causal = c.flag(3).unwrap_or(false);
    let site = AttentionSite {
        heads: sq[1].clone(),
        kv_heads: sk[1].clone(),
        q_len: sq[2].clone(),
        kv_len: sk[2].clone(),
        head_dim: sq[3].clone(),
        causal,
    };
    c.facts().attention.push(site);
    let shape = vec![sq[0].clone(), sq[1].clone(), sq[2].clone(), sv[3].clone()];
    Ty::Tensor(TensorTy::new(q.dtype, shape, c.span))
}

/// `rope(x, base, dims, factor)`: rank 4; `dims` (parameter `dims`) even and at most the head
/// width; the parameters `positive` positive numbers where they are literals.
pub fn rope(c: &mut RuleCx<'_, '_>, dims: usize, positive: &[usize]) -> Ty {
    let Some(x) = c.tensor(0) else {
        return Ty::Unknown;
    };
    if x.rank().is_some_and(|r| r != 4) {
        c.rank_error("[B, heads, T, head_dim]", &x);
        return Ty::Unknown;
    }
    if let Some(n) = c.given(dims).then(|| c.constant(dims)).flatten() {
        let width = x.shape.as_ref().and_then(|s| s[3].as_constant());
        if n < 2 || n % 2 != 0 || width.is_some_and(|w| n > w) {
            let span = c.arg_span(dims);
            let name = c.name;
            let width = width.map_or("head width".to_string(), |w| format!("head width {w}"));
            c.error(Diagnostic::new(
                "lmx::call::argument_range",
                format!("`dims` of `{name}` must be even, from 2 to the {width}; found {n}"),
                span,
                "out of range",
            ));
            return Ty::Unknown;
        }
    }
    for &i in positive {
        if !positive_literal(c, i) {
            return Ty::Unknown;
        }
    }
    tensor(x, c.span)
}

/// `rope_llama3(x, base, factor, low_freq_factor, high_freq_factor, original_ctx, dims)`:
/// as `rope`, its scaling settings positive and `low_freq_factor < high_freq_factor` (the
/// smooth band between the two wavelengths is otherwise empty or reversed).
pub fn rope_llama3(c: &mut RuleCx<'_, '_>) -> Ty {
    let ty = rope(c, 6, &[1, 2, 3, 4, 5]);
    let (low, high) = (
        c.expr(3).and_then(literal_number),
        c.expr(4).and_then(literal_number),
    );
    if let (Some(low), Some(high)) = (low, high) {
        if low >= high {
            let span = c.arg_span(4);
            c.error(Diagnostic::new(
                "lmx::call::argument_range",
                format!(
                    "`high_freq_factor` of `rope_llama3` must exceed `low_freq_factor`; found {high} and {low}"
                ),
                span,
                "not above low_freq_factor",
            ));
            return Ty::Unknown;
        }
    }
    ty
}

/// `rope_yarn(x, base, factor, original_ctx, beta_fast, beta_slow, mscale, mscale_all_dim,
/// dims)`: as `rope`, its base, factor, context and betas positive.
pub fn rope_yarn(c: &mut RuleCx<'_, '_>) -> Ty {
    rope(c, 8, &[1, 2, 3, 4, 5])
}

/// Whether parameter `i` is not a literal or is a finite positive one; reports it otherwise.
fn positive_literal(c: &mut RuleCx<'_, '_>, i: usize) -> bool {
    let Some(value) = c.expr(i).and_then(literal_number) else {
        return true;
    };
    if value > 0.0 && value.is_finite() {
        return true;
    }
    let span = c.arg_span(i);
    let (name, param) = (c.name, c.param_name(i));
    c.error(Diagnostic::new(
        "lmx::call::argument_range",
        format!("`{param}` of `{name}` must be a positive number"),
        span,
        "not positive",
    ));
    false
}

/// `alibi(heads, len)`: `[heads, len, len]`.
pub fn alibi(c: &mut RuleCx<'_, '_>) -> Ty {
    let (h, t) = (c.dim(0), c.dim(1));
    Ty::Tensor(TensorTy::new(Dtype::Float, vec![h, t.clone(), t], c.span))
}

/// `sinusoidal(len, dim)`: `[len, dim]`.
pub fn sinusoidal(c: &mut RuleCx<'_, '_>) -> Ty {
    let (t, d) = (c.dim(0), c.dim(1));
    Ty::Tensor(TensorTy::new(Dtype::Float, vec![t, d], c.span))
}

/// `one_hot(indices, n)`: int indices, a new last axis of `n`.
pub fn one_hot(c: &mut RuleCx<'_, '_>) -> Ty {
    let Some(x) = c.tensor(0) else {
        return Ty::Unknown;
    };
    if x.dtype != Dtype::Int {
        return not_int(c, 0, &x);
    }
    let n = c.dim(1);
    let shape = x.shape.map(|mut s| {
        s.push(n);
        s
    });
    Ty::Tensor(TensorTy {
        dtype: Dtype::Float,
        shape,
        origin: c.span,
    })
}

fn not_int(c: &mut RuleCx<'_, '_>, i: usize, t: &TensorTy) -> Ty {
    let span = c.arg_span(i);
    let name = c.name;
    c.error(
        Diagnostic::new(
            "lmx::type::mismatch",
            format!(
                "`{name}` takes int indices, found {} tensor",
                t.dtype.with_article()
            ),
            span,
            "not int",
        )
        .with_label(t.origin, "its dtype comes from here"),
    );
    Ty::Unknown
}

/// `top_k(x, k)`: values and int indices, the last axis `k` wide.
pub fn top_k(c: &mut RuleCx<'_, '_>) -> Ty {
    let Some(x) = c.tensor(0) else {
        return Ty::Unknown;
    };
    let k = c.dim(1);
    let shape = x.shape.clone().map(|mut s| {
        if let Some(last) = s.last_mut() {
            *last = k;
        }
        s
    });
    Ty::Tuple(vec![
        Ty::Tensor(TensorTy {
            dtype: x.dtype,
            shape: shape.clone(),
            origin: c.span,
        }),
        Ty::Tensor(TensorTy {
            dtype: Dtype::Int,
            shape,
            origin: c.span,
        }),
    ])
}

/// `take_along_axis(x, indices, axis)`: equal ranks, int indices; the indices' shape.
pub fn take_along_axis(c: &mut RuleCx<'_, '_>) -> Ty {
    let (Some(x), Some(i)) = (c.tensor(0), c.tensor(1)) else {
        return Ty::Unknown;
    };
    if i.dtype != Dtype::Int {
        return not_int(c, 1, &i);
    }
    if let (Some(rx), Some(ri)) = (x.rank(), i.rank()) {
        if rx != ri {
            c.rank_error(&format!("indices of rank {rx}"), &i);
            return Ty::Unknown;
        }
        if c.axis(2, rx).is_none() {
            return Ty::Unknown;
        }
    }
    Ty::Tensor(TensorTy {
        dtype: x.dtype,
        shape: i.shape,
        origin: c.span,
    })
}

/// `cross_entropy(logits, targets)`: a scalar; logits are the targets' shape plus classes.
pub fn cross_entropy(c: &mut RuleCx<'_, '_>) -> Ty {
    let (Some(logits), Some(targets)) = (c.tensor(0), c.tensor(1)) else {
        return Ty::Unknown;
    };
    if targets.dtype != Dtype::Int {
        let span = targets.origin;
        c.error(Diagnostic::new(
            "lmx::type::mismatch",
            "`cross_entropy` targets must be an int tensor of class ids",
            span,
            "not int",
        ));
        return Ty::Unknown;
    }
    if let (Some(l), Some(t)) = (&logits.shape, &targets.shape) {
        if l.len() != t.len() + 1 || l[..t.len()] != t[..] {
            let span = c.span;
            c.error(
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
    Ty::Tensor(TensorTy::new(Dtype::Float, Vec::new(), c.span))
}

/// The shapes of a recurrent call's tensor arguments `which`, each of the rank its layout in
/// `layouts` names (`None` when one is unknown or of another rank, after reporting it).
fn scan_shapes(
    c: &mut RuleCx<'_, '_>,
    layouts: &[(usize, &str)],
) -> Option<Vec<(TensorTy, Vec<Dim>)>> {
    let mut out = Vec::new();
    for &(i, layout) in layouts {
        let t = c.tensor(i)?;
        let rank = layout.matches(',').count() + 1;
        if t.rank().is_some_and(|r| r != rank) {
            c.rank_error(layout, &t);
            return None;
        }
        if t.dtype != Dtype::Float {
            let span = c.arg_span(i);
            let (name, param) = (c.name, c.param_name(i));
            c.error(Diagnostic::new(
                "lmx::type::scan_input",
                format!(
                    "`{param}` of `{name}` must be a float tensor, not {}",
                    t.dtype.name()
                ),
                span,
                "not float",
            ));
            return None;
        }
        let shape = t.shape.clone()?;
        out.push((t, shape));
    }
    Some(out)
}

/// Reports that size `what` of argument `a` (axis `ia`) differs from argument `b`'s (axis `ib`):
/// the recurrence's state could not be laid out.
fn scan_mismatch(
    c: &mut RuleCx<'_, '_>,
    what: &str,
    a: (&TensorTy, &[Dim], usize),
    b: (&TensorTy, &[Dim], usize),
) -> bool {
    if a.1[a.2] == b.1[b.2] {
        return false;
    }
    let span = c.span;
    let name = c.name;
    c.error(
        Diagnostic::new(
            "lmx::shape::scan_state",
            format!(
                "`{name}`'s {what} differs between its arguments: `{}` and `{}`",
                a.1[a.2], b.1[b.2]
            ),
            span,
            "its state cannot be laid out",
        )
        .with_label(a.0.origin, format!("this has shape {}", a.0.shape_text()))
        .with_label(b.0.origin, format!("this has shape {}", b.0.shape_text())),
    );
    true
}

/// `ssd(x, dt, a, b, c, chunk)`: `x [B, T, H, P]`, `dt [B, T, H]`, `a [H]`, `b` and
/// `c [B, T, G, N]` with `G` dividing `H`; the result is `x`'s shape, the state `[B, H, P, N]`.
pub fn ssd(c: &mut RuleCx<'_, '_>) -> Ty {
    let layouts = [
        (0, "[B, T, heads, head_dim]"),
        (1, "[B, T, heads]"),
        (2, "[heads]"),
        (3, "[B, T, groups, state]"),
        (4, "[B, T, groups, state]"),
    ];
    let Some(args) = scan_shapes(c, &layouts) else {
        return Ty::Unknown;
    };
    let [(x, sx), (dt, sdt), (a, sa), (b, sb), (cc, sc)] = &args[..] else {
        return Ty::Unknown;
    };
    let pairs = [
        ("batch", (x, sx, 0), (dt, sdt, 0)),
        ("length", (x, sx, 1), (dt, sdt, 1)),
        ("head count", (x, sx, 2), (dt, sdt, 2)),
        ("head count", (x, sx, 2), (a, sa, 0)),
        ("batch", (x, sx, 0), (b, sb, 0)),
        ("length", (x, sx, 1), (b, sb, 1)),
        ("batch", (b, sb, 0), (cc, sc, 0)),
        ("length", (b, sb, 1), (cc, sc, 1)),
        ("group count", (b, sb, 2), (cc, sc, 2)),
        ("state width", (b, sb, 3), (cc, sc, 3)),
    ];
    for (what, l, r) in pairs {
        if scan_mismatch(c, what, (l.0, l.1, l.2), (r.0, r.1, r.2)) {
            return Ty::Unknown;
        }
    }
    let (heads, groups) = (&sx[2], &sb[2]);
    if let (Some(h), Some(g)) = (heads.as_constant(), groups.as_constant()) {
        if g == 0 || h % g != 0 {
            let span = c.span;
            c.error(
                Diagnostic::new(
                    "lmx::shape::heads",
                    format!("`ssd` needs whole groups of heads per `b`/`c` group: {h} heads over {g} groups"),
                    span,
                    "in this scan",
                )
                .with_label(x.origin, format!("this has shape {}", x.shape_text()))
                .with_label(b.origin, format!("this has shape {}", b.shape_text())),
            );
            return Ty::Unknown;
        }
    }
    if c.constant(5).is_some_and(|n| n < 1) {
        let span = c.arg_span(5);
        c.error(Diagnostic::new(
            "lmx::call::argument_range",
            "`chunk` of `ssd` must be a positive number of positions",
            span,
            "not positive",
        ));
        return Ty::Unknown;
    }
    let (p, n) = (&sx[3], &sb[3]);
    // Per token: C.B scores and mixing within the chunk, then the chunk's state in and out.
    let chunk = c.dim(5);
    let two = Dim::constant(2);
    let flops = two
        .mul(groups)
        .mul(&chunk)
        .mul(n)
        .add(&two.mul(heads).mul(&chunk).mul(p), 1)
        .add(&Dim::constant(4).mul(heads).mul(p).mul(n), 1);
    c.facts().scans.push(ScanSite {
        kind: ScanKind::Ssd,
        state: vec![heads.clone(), p.clone(), n.clone()],
        dtype: Dtype::Float,
        flops,
    });
    Ty::Tensor(TensorTy::new(x.dtype, sx.clone(), c.span))
}

/// `gated_delta(q, k, v, g, beta, chunk)`: `q` and `k [B, T, H, Dk]`, `v [B, T, H, Dv]`, `g` and
/// `beta [B, T, H]`; the result is `[B, T, H, Dv]`, the state `[B, H, Dk, Dv]`.
pub fn gated_delta(c: &mut RuleCx<'_, '_>) -> Ty {
    let layouts = [
        (0, "[B, T, heads, k_dim]"),
        (1, "[B, T, heads, k_dim]"),
        (2, "[B, T, heads, v_dim]"),
        (3, "[B, T, heads]"),
        (4, "[B, T, heads]"),
    ];
    let Some(args) = scan_shapes(c, &layouts) else {
        return Ty::Unknown;
    };
    let [(q, sq), (k, sk), (v, sv), (g, sg), (b, sb)] = &args[..] else {
        return Ty::Unknown;
    };
    let mut pairs = Vec::new();
    for (what, axis) in [
        ("batch", 0),
        ("length", 1),
        ("head count", 2),
        ("key width", 3),
    ] {
        pairs.push((what, (k, sk, axis)));
    }
    for (what, axis) in [("batch", 0), ("length", 1), ("head count", 2)] {
        pairs.push((what, (v, sv, axis)));
        pairs.push((what, (g, sg, axis)));
        pairs.push((what, (b, sb, axis)));
    }
    for (what, other) in pairs {
        if scan_mismatch(c, what, (q, sq, other.2), (other.0, other.1, other.2)) {
            return Ty::Unknown;
        }
    }
    if c.constant(5).is_some_and(|n| n < 1) {
        let span = c.arg_span(5);
        c.error(Diagnostic::new(
            "lmx::call::argument_range",
            "`chunk` of `gated_delta` must be a positive number of positions",
            span,
            "not positive",
        ));
        return Ty::Unknown;
    }
    let (heads, dk, dv) = (&sq[2], &sq[3], &sv[3]);
    // Per token: the chunk's scores and UT system (2 x 2 L Dk), its solve (L^2 for the chunk's
    // share of the squarings' first), values and decayed keys through it (2 L (Dv + Dk)), the
    // state read and written (3 x 2 Dk Dv).
    let chunk = c.dim(5);
    let two = Dim::constant(2);
    let per_head = Dim::constant(4)
        .mul(&chunk)
        .mul(dk)
        .add(&chunk.mul(&chunk), 1)
        .add(&two.mul(&chunk).mul(&dv.add(dk, 1)), 1)
        .add(&Dim::constant(6).mul(dk).mul(dv), 1);
    c.facts().scans.push(ScanSite {
        kind: ScanKind::GatedDelta,
        state: vec![heads.clone(), dk.clone(), dv.clone()],
        dtype: Dtype::Float,
        flops: heads.mul(&per_head),
    });
    let shape = vec![sq[0].clone(), sq[1].clone(), heads.clone(), dv.clone()];
    Ty::Tensor(TensorTy::new(v.dtype, shape, c.span))
}

/// `causal_conv1d(x, weight, bias)`: `x [B, T, C]`, `weight [C, 1, K]`, `bias [C]`; the result is
/// `x`'s shape, the state the last `K - 1` inputs `[B, K - 1, C]`.
pub fn causal_conv1d(c: &mut RuleCx<'_, '_>) -> Ty {
    let mut layouts = vec![(0, "[B, T, channels]"), (1, "[channels, 1, kernel]")];
    if c.given(2) {
        layouts.push((2, "[channels]"));
    }
    let Some(args) = scan_shapes(c, &layouts) else {
        return Ty::Unknown;
    };
    let (x, sx) = &args[0];
    let (w, sw) = &args[1];
    if scan_mismatch(c, "channel count", (x, sx, 2), (w, sw, 0)) {
        return Ty::Unknown;
    }
    if let Some((bias, sb)) = args.get(2) {
        if scan_mismatch(c, "channel count", (x, sx, 2), (bias, sb, 0)) {
            return Ty::Unknown;
        }
    }
    if sw[1].as_constant().is_some_and(|one| one != 1) || sw[2].as_constant().is_some_and(|k| k < 1)
    {
        let span = c.arg_span(1);
        c.error(Diagnostic::new(
            "lmx::shape::scan_state",
            format!(
                "`causal_conv1d`'s weight must be `[channels, 1, kernel]` (depthwise, a kernel of at least 1), not {}",
                w.shape_text()
            ),
            span,
            "not a depthwise kernel",
        ));
        return Ty::Unknown;
    }
    let kernel = &sw[2];
    c.facts().scans.push(ScanSite {
        kind: ScanKind::Conv,
        state: vec![kernel.add(&Dim::constant(1), -1), sx[2].clone()],
        dtype: x.dtype,
        flops: Dim::constant(2).mul(&sx[2]).mul(kernel),
    });
    Ty::Tensor(TensorTy::new(x.dtype, sx.clone(), c.span))
}
