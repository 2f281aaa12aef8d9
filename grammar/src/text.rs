//! Expressions printed back as `.lmx` text, for messages and for comparing guards.

use crate::ast::{Expr, ExprKind, StmtKind, Subscript, UnaryOp};

/// The expression as `.lmx` text, fully parenthesised where precedence matters.
pub fn expr_text(e: &Expr) -> String {
    match &e.kind {
        ExprKind::Int(i) => i.to_string(),
        ExprKind::Float(x) => format!("{x:?}"),
        ExprKind::Bool(b) => b.to_string(),
        ExprKind::Str(s) => format!("{s:?}"),
        ExprKind::Name(n) => n.clone(),
        ExprKind::List(items) => format!("[{}]", join(items)),
        ExprKind::Unary(UnaryOp::Neg, a) => format!("-{}", operand(a)),
        ExprKind::Unary(UnaryOp::Not, a) => format!("not {}", operand(a)),
        ExprKind::Binary(op, _, a, b) => {
            format!("{} {} {}", operand(a), op.symbol(), operand(b))
        }
        ExprKind::Call(f, args) => {
            let args: Vec<String> = args
                .iter()
                .map(|a| match &a.name {
                    Some(n) => format!("{} = {}", n.name, expr_text(&a.value)),
                    None => expr_text(&a.value),
                })
                .collect();
            format!("{}({})", expr_text(f), args.join(", "))
        }
        ExprKind::Member(a, n) => format!("{}.{}", expr_text(a), n.name),
        ExprKind::Index(a, subs) => {
            let subs: Vec<String> = subs.iter().map(subscript).collect();
            format!("{}[{}]", expr_text(a), subs.join(", "))
        }
        ExprKind::If(c, then, _) => {
            let value = match then.stmts.last().map(|s| &s.kind) {
                Some(StmtKind::Expr(v)) => expr_text(v),
                _ => "..".to_string(),
            };
            format!("if {} {{ {value} }} else {{ .. }}", expr_text(c))
        }
    }
}

fn operand(e: &Expr) -> String {
    match e.kind {
        ExprKind::Binary(..) | ExprKind::Unary(..) | ExprKind::If(..) => {
            format!("({})", expr_text(e))
        }
        _ => expr_text(e),
    }
}

fn join(items: &[Expr]) -> String {
    items.iter().map(expr_text).collect::<Vec<_>>().join(", ")
}

fn subscript(s: &Subscript) -> String {
    match s {
        Subscript::Ellipsis(_) => "...".to_string(),
        Subscript::Index(e) => expr_text(e),
        Subscript::Slice(a, b, _) => format!(
            "{}:{}",
            a.as_ref().map(expr_text).unwrap_or_default(),
            b.as_ref().map(expr_text).unwrap_or_default()
        ),
    }
}
