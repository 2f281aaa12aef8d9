//! The shape rules of the sparse-expert built-ins (`switch_glu`, `balance`, `route_groups`).

use super::bind::RuleCx;
use crate::ast::Dtype;
use crate::diag::Diagnostic;
use crate::dim::Dim;
use crate::types::{TensorTy, Ty};

/// `switch_glu(x, indices, gate, up, down)`: `x [..., d]`, int `indices [..., k]` over the same
/// leading axes, `gate` and `up` `[experts, hidden, d]`, `down [experts, d_out, hidden]`; the
/// result is `[..., k, d_out]`. Records the weights each token multiplies by (`k` experts'
/// three matrices) for the FLOP count.
pub fn switch_glu(c: &mut RuleCx<'_, '_>) -> Ty {
    let tensors: Vec<Option<TensorTy>> = (0..5).map(|i| c.tensor(i)).collect();
    let [Some(x), Some(idx), Some(gate), Some(up), Some(down)] = &tensors[..] else {
        return Ty::Unknown;
    };
    if idx.dtype != Dtype::Int {
        let span = c.arg_span(1);
        c.error(
            Diagnostic::new(
                "lmx::type::mismatch",
                format!(
                    "`switch_glu` takes int expert indices, found {} tensor",
                    idx.dtype.with_article()
                ),
                span,
                "not int",
            )
            .with_help("the indices of `top_k(scores, k)`"),
        );
        return Ty::Unknown;
    }
    for w in [gate, up, down] {
        if w.rank().is_some_and(|r| r != 3) {
            c.rank_error("[experts, output, input]", w);
            return Ty::Unknown;
        }
    }
    let (Some(sx), Some(si), Some(sg), Some(su), Some(sd)) =
        (&x.shape, &idx.shape, &gate.shape, &up.shape, &down.shape)
    else {
        return Ty::Tensor(TensorTy {
            shape: None,
            origin: c.span,
            ..x.clone()
        });
    };
    let (Some(d), Some(k)) = (sx.last(), si.last()) else {
        c.rank_error("[..., d] and indices [..., k]", x);
        return Ty::Unknown;
    };
    let mismatch = if sx.len() != si.len() || sx[..sx.len() - 1] != si[..si.len() - 1] {
        Some(("the indices' leading axes differ from x's", x, idx))
    } else if sg != su {
        Some(("`gate` and `up` differ", gate, up))
    } else if &sg[2] != d {
        Some(("the experts' input width differs from x's", gate, x))
    } else if sd[0] != sg[0] || sd[2] != sg[1] {
        Some((
            "`down` does not take `gate`'s experts and width",
            down,
            gate,
        ))
    } else {
        None
    };
    if let Some((what, a, b)) = mismatch {
        let span = c.span;
        c.error(
            Diagnostic::new(
                "lmx::shape::mismatch",
                format!(
                    "`switch_glu`: {what}: {} and {}",
                    a.shape_text(),
                    b.shape_text()
                ),
                span,
                "in this call",
            )
            .with_label(a.origin, format!("this has shape {}", a.shape_text()))
            .with_label(b.origin, format!("this has shape {}", b.shape_text())),
        );
        return Ty::Unknown;
    }
    // Per token: k experts, each `hidden x d` twice (gate, up) and `d_out x hidden` once.
    let per_expert = sg[1]
        .mul(d)
        .mul(&Dim::constant(2))
        .add(&sd[1].mul(&sd[2]), 1);
    c.facts().gathered_weights.push(per_expert.mul(k));
    let mut shape = si.clone();
    shape.push(sd[1].clone());
    Ty::Tensor(TensorTy::new(x.dtype, shape, c.span))
}

/// `balance(y, probs, indices, coef)`: `y`'s type; `probs [..., experts]` float and int
/// `indices [..., k]` over the same leading axes.
pub fn balance(c: &mut RuleCx<'_, '_>) -> Ty {
    let (Some(y), Some(probs), Some(idx)) = (c.tensor(0), c.tensor(1), c.tensor(2)) else {
        return Ty::Unknown;
    };
    if idx.dtype != Dtype::Int {
        let span = c.arg_span(2);
        c.error(Diagnostic::new(
            "lmx::type::mismatch",
            format!(
                "`balance` takes int expert indices, found {} tensor",
                idx.dtype.with_article()
            ),
            span,
            "not int",
        ));
        return Ty::Unknown;
    }
    if let (Some(sp), Some(si)) = (&probs.shape, &idx.shape) {
        if sp.len() != si.len()
            || sp[..sp.len().saturating_sub(1)] != si[..si.len().saturating_sub(1)]
        {
            let span = c.span;
            c.error(
                Diagnostic::new(
                    "lmx::shape::mismatch",
                    format!(
                        "`balance`: the router's probabilities {} and its choices {} cover different tokens",
                        probs.shape_text(),
                        idx.shape_text()
                    ),
                    span,
                    "in this call",
                )
                .with_label(probs.origin, format!("this has shape {}", probs.shape_text()))
                .with_label(idx.origin, format!("this has shape {}", idx.shape_text())),
            );
            return Ty::Unknown;
        }
    }
    Ty::Tensor(TensorTy {
        origin: c.span,
        ..y
    })
}

/// `route_groups(scores, bias, k, groups, topk_groups)`: float `scores [..., experts]` and
/// `bias [experts]`; `experts` in `groups` equal groups, `1 <= topk_groups <= groups`, `1 <= k
/// <= experts` where they are constants; the result is int `[..., k]`.
pub fn route_groups(c: &mut RuleCx<'_, '_>) -> Ty {
    let (Some(scores), Some(bias)) = (c.tensor(0), c.tensor(1)) else {
        return Ty::Unknown;
    };
    for (i, t) in [(0, &scores), (1, &bias)] {
        if t.dtype != Dtype::Float {
            let span = c.arg_span(i);
            let what = c.param_name(i);
            c.error(Diagnostic::new(
                "lmx::type::mismatch",
                format!(
                    "`route_groups` takes a float `{what}`, found {} tensor",
                    t.dtype.with_article()
                ),
                span,
                "not float",
            ));
            return Ty::Unknown;
        }
    }
    if bias.rank().is_some_and(|r| r != 1) {
        c.rank_error("[experts]", &bias);
        return Ty::Unknown;
    }
    let experts = match (&scores.shape, &bias.shape) {
        (Some(ss), Some(sb)) => {
            let Some(last) = ss.last() else {
                c.rank_error("[..., experts]", &scores);
                return Ty::Unknown;
            };
            if last != &sb[0] {
                let span = c.span;
                c.error(
                    Diagnostic::new(
                        "lmx::shape::mismatch",
                        format!(
                            "`route_groups`: the bias {} is not one value per expert of the scores {}",
                            bias.shape_text(),
                            scores.shape_text()
                        ),
                        span,
                        "in this call",
                    )
                    .with_label(scores.origin, format!("this has shape {}", scores.shape_text()))
                    .with_label(bias.origin, format!("this has shape {}", bias.shape_text())),
                );
                return Ty::Unknown;
            }
            last.as_constant()
        }
        _ => None,
    };
    let (k, groups, topk_groups) = (c.constant(2), c.constant(3), c.constant(4));
    let fault = if k.is_some_and(|k| k < 1 || experts.is_some_and(|e| k > e)) {
        Some((2, "`k` must be between 1 and the number of experts"))
    } else if groups.is_some_and(|g| g < 1 || experts.is_some_and(|e| e % g != 0)) {
        Some((3, "`groups` must divide the experts into equal groups"))
    } else if topk_groups.is_some_and(|t| t < 1 || groups.is_some_and(|g| t > g)) {
        Some((4, "`topk_groups` must be between 1 and `groups`"))
    } else {
        None
    };
    if let Some((i, message)) = fault {
        let span = c.arg_span(i);
        c.error(Diagnostic::new(
            "lmx::call::argument_range",
            format!("{message} in `route_groups`"),
            span,
            "out of range",
        ));
        return Ty::Unknown;
    }
    let shape = scores.shape.clone().map(|mut s| {
        if let Some(last) = s.last_mut() {
            *last = c.dim(2);
        }
        s
    });
    Ty::Tensor(TensorTy {
        dtype: Dtype::Int,
        shape,
        origin: c.span,
    })
}
