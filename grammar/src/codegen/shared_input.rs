//! Linear layers applied to one input, found in a body before it is translated, so that the
//! translation applies them together (`pass.linears`, which makes them one product where that
//! pays: `nn::linears_in`). Attention's `q_proj(x)`, `k_proj(x)` and `v_proj(x)` are the case.
//!
//! A group holds consecutive calls `layer(x)` of one input name `x` in the statements of one
//! body, until `x` is bound again. The group is applied where its first call is, so no call that
//! may draw from the step's key (a block, a linear layer over another input, stacked experts,
//! `dropout`) may lie between its calls: an adapter's dropout masks are then drawn in the order
//! the source gives. A loop ends a group; an `if` statement does unless every call in it draws nothing and it
//! binds no group's input.

use crate::ast::{Arg, Body, Expr, ExprKind, StmtKind, Subscript};
use crate::span::Span;

/// How a call in a body is met, as the translator tells it from the names in scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CallKind {
    /// A plain linear layer applied to a tensor name alone: a group's member.
    Linear,
    /// A call that may draw from the step's key (a block, stacked experts, a linear layer over
    /// anything but a tensor name, `dropout`, a model's forward pass): it ends every group.
    Barrier,
    /// A built-in or a layer that draws nothing (a norm, an embedding).
    Pure,
}

/// A call met in a body: its callee's name (when it has one), its arguments and where it is.
pub(crate) struct Call<'e> {
    pub callee: Option<&'e str>,
    pub args: &'e [Arg],
    pub span: Span,
}

/// One call of a linear layer: where it is, the layer's name and its input's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Member {
    pub call: Span,
    pub layer: String,
    pub input: String,
}

/// The groups of `body`'s statements (two calls or more each), in the order their first calls
/// come; `kind` tells each call of the body.
pub(crate) fn groups(body: &Body, kind: &mut dyn FnMut(&Call) -> CallKind) -> Vec<Vec<Member>> {
    let mut open: Vec<Member> = Vec::new();
    let mut done = Vec::new();
    for stmt in &body.stmts {
        let (value, bound): (Option<&Expr>, Vec<&str>) = match &stmt.kind {
            StmtKind::Let(names, value) => {
                (Some(value), names.iter().map(|n| n.name.as_str()).collect())
            }
            StmtKind::Assign(name, value) => (Some(value), vec![name.name.as_str()]),
            StmtKind::Expr(value) => (Some(value), Vec::new()),
            _ => (None, Vec::new()),
        };
        let Some(value) = value else {
            close(&mut open, &mut done);
            continue;
        };
        let mut calls = Vec::new();
        if !calls_in(value, &mut calls, None) {
            // A statement with a nested body (an `if`) goes by when every call in it draws
            // nothing and it binds no group's input: its calls need no place in the order.
            let (mut calls, mut assigned) = (Vec::new(), bound.clone());
            let goes_by = calls_in(value, &mut calls, Some(&mut assigned))
                && calls.iter().all(|call| kind(call) == CallKind::Pure)
                && open
                    .first()
                    .is_none_or(|first| !assigned.contains(&first.input.as_str()));
            if !goes_by {
                close(&mut open, &mut done);
            }
            continue;
        }
        for call in calls {
            let Call { callee, args, span } = call;
            let member = match (kind(&call), callee, args) {
                (CallKind::Pure, ..) => continue,
                (CallKind::Linear, Some(layer), [Arg { value, .. }]) => match &value.kind {
                    ExprKind::Name(input) => Some(Member {
                        call: span,
                        layer: layer.to_string(),
                        input: input.clone(),
                    }),
                    _ => None,
                },
                _ => None,
            };
            match member {
                Some(member) if open.first().is_none_or(|first| first.input == member.input) => {
                    open.push(member)
                }
                Some(member) => {
                    close(&mut open, &mut done);
                    open.push(member);
                }
                None => close(&mut open, &mut done),
            }
        }
        if open
            .first()
            .is_some_and(|first| bound.contains(&first.input.as_str()))
        {
            close(&mut open, &mut done);
        }
    }
    close(&mut open, &mut done);
    done
}

/// Ends the open group, keeping it if it holds more than one call.
fn close(open: &mut Vec<Member>, done: &mut Vec<Vec<Member>>) {
    let group = std::mem::take(open);
    if group.len() > 1 {
        done.push(group);
    }
}

/// The calls in `e`, arguments before the call they are passed to, as the translator evaluates
/// them. Without `nested`, `false` when `e` holds a nested body (an `if`); with it, the calls of
/// nested bodies too and, in `nested`, the names their statements assign (`false` for a loop or
/// another statement in them).
fn calls_in<'e>(
    e: &'e Expr,
    out: &mut Vec<Call<'e>>,
    mut nested: Option<&mut Vec<&'e str>>,
) -> bool {
    match &e.kind {
        ExprKind::Int(_)
        | ExprKind::Float(_)
        | ExprKind::Bool(_)
        | ExprKind::Str(_)
        | ExprKind::Name(_) => true,
        ExprKind::List(items) => items
            .iter()
            .all(|item| calls_in(item, out, nested.as_deref_mut())),
        ExprKind::Unary(_, inner) => calls_in(inner, out, nested),
        ExprKind::Binary(_, _, a, b) => {
            calls_in(a, out, nested.as_deref_mut()) && calls_in(b, out, nested)
        }
        ExprKind::Call(callee, args) => {
            let name = match &callee.kind {
                ExprKind::Name(name) => Some(name.as_str()),
                _ => {
                    if !calls_in(callee, out, nested.as_deref_mut()) {
                        return false;
                    }
                    None
                }
            };
            if !args
                .iter()
                .all(|arg| calls_in(&arg.value, out, nested.as_deref_mut()))
            {
                return false;
            }
            out.push(Call {
                callee: name,
                args,
                span: e.span,
            });
            true
        }
        ExprKind::Member(target, _) => calls_in(target, out, nested),
        ExprKind::Index(target, subs) => {
            calls_in(target, out, nested.as_deref_mut())
                && subs.iter().all(|sub| match sub {
                    Subscript::Ellipsis(_) => true,
                    Subscript::Index(i) => calls_in(i, out, nested.as_deref_mut()),
                    Subscript::Slice(a, b, _) => [a, b]
                        .into_iter()
                        .flatten()
                        .all(|bound| calls_in(bound, out, nested.as_deref_mut())),
                })
        }
        ExprKind::If(cond, then, otherwise) => {
            let Some(assigned) = nested else {
                return false;
            };
            calls_in(cond, out, Some(&mut *assigned))
                && [Some(then), otherwise.as_ref()]
                    .into_iter()
                    .flatten()
                    .flat_map(|body| &body.stmts)
                    .all(|stmt| match &stmt.kind {
                        StmtKind::Let(_, value) | StmtKind::Expr(value) => {
                            calls_in(value, out, Some(&mut *assigned))
                        }
                        StmtKind::Assign(name, value) => {
                            assigned.push(name.name.as_str());
                            calls_in(value, out, Some(&mut *assigned))
                        }
                        _ => false,
                    })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The groups of a block's forward `body`, its linear layers
    /// `linears` (called on a tensor name alone), its built-ins `pure` and everything else a
    /// barrier; each group as its layers' names.
    fn grouped(body: &str, linears: &[&str]) -> Vec<Vec<String>> {
        let source = format!(
            "model M {{ config {{ d: int = 4 }} block B {{ params {{ }} forward(x: [B, T, d]) -> [B, T, d] {{ {body} }} }} forward(ids: [B, T]) -> [B, T, d] {{ ids }} }}"
        );
        let model = crate::parse::parse(&source).expect("the test's source parses");
        let body = &model.blocks[0].forward.body;
        let pure = ["reshape", "transpose", "silu", "rope"];
        let mut kind = |call: &Call| match call.callee {
            Some(name) if linears.contains(&name) && call.args.len() == 1 => CallKind::Linear,
            Some(name) if pure.contains(&name) => CallKind::Pure,
            _ => CallKind::Barrier,
        };
        groups(body, &mut kind)
            .into_iter()
            .map(|group| group.into_iter().map(|m| m.layer).collect())
            .collect()
    }

    #[test]
    fn attentions_projections_of_one_input_are_one_group() {
        let body = "let q = transpose(reshape(q_proj(x), [1]), [0]) \
                    let k = rope(k_proj(x)) \
                    let v = v_proj(x) \
                    o_proj(q)";
        assert_eq!(
            grouped(body, &["q_proj", "k_proj", "v_proj", "o_proj"]),
            [["q_proj", "k_proj", "v_proj"]]
        );
    }

    /// Qwen2's attention: the rotation's `if` between the key's and the value's projections
    /// draws nothing, so the value's joins the group.
    #[test]
    fn an_if_that_draws_nothing_leaves_the_group_open() {
        let body = "let q = q_proj(x) \
                    let k = k_proj(x) \
                    if true { q = rope(q) k = rope(k) } else { q = rope(q) } \
                    let v = v_proj(x) \
                    o_proj(v)";
        assert_eq!(
            grouped(body, &["q_proj", "k_proj", "v_proj", "o_proj"]),
            [["q_proj", "k_proj", "v_proj"]]
        );
    }

    #[test]
    fn binding_the_input_again_ends_its_group() {
        let body = "let a = q_proj(x) x = k_proj(x) let b = v_proj(x) let c = o_proj(x) b";
        assert_eq!(
            grouped(body, &["q_proj", "k_proj", "v_proj", "o_proj"]),
            [["q_proj", "k_proj"], ["v_proj", "o_proj"]]
        );
    }

    #[test]
    fn a_call_that_may_draw_a_loop_or_an_if_that_draws_ends_a_group() {
        let linears = ["q_proj", "k_proj", "v_proj"];
        let drawn = "let a = q_proj(x) let d = dropout(x, 0.1) let b = k_proj(x) b";
        assert!(grouped(drawn, &linears).is_empty());
        let drawn_inside = "let a = q_proj(x) if true { a = dropout(a, 0.1) } let b = k_proj(x) b";
        assert!(grouped(drawn_inside, &linears).is_empty());
        let rebinds_input = "let a = q_proj(x) if true { x = rope(x) } let b = k_proj(x) b";
        assert!(grouped(rebinds_input, &linears).is_empty());
        let looped = "let a = q_proj(x) for i in 0..2 { a = rope(a) } let b = k_proj(x) b";
        assert!(grouped(looped, &linears).is_empty());
        let other_input = "let a = q_proj(x) let b = k_proj(a) let c = v_proj(x) c";
        assert!(grouped(other_input, &linears).is_empty());
        let after = "let a = q_proj(x) let b = k_proj(x) let c = v_proj(a) let d = q_proj(a) d";
        assert_eq!(
            grouped(after, &linears),
            [["q_proj", "k_proj"], ["v_proj", "q_proj"]]
        );
        let one_statement = "silu(q_proj(x)) * k_proj(x)";
        assert_eq!(grouped(one_statement, &linears), [["q_proj", "k_proj"]]);
    }
}
