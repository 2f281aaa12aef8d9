//! Evaluation of static expressions (config values, layer sizes, loop bounds) for one preset.

use std::collections::HashMap;
use std::fmt;

use crate::ast::{BinaryOp, Expr, ExprKind, StmtKind, UnaryOp};
use crate::diag::Diagnostic;

/// A build-time value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A boolean.
    Bool(bool),
    /// A string.
    Str(String),
    /// An enum variant.
    Enum(String),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Int(i) => write!(f, "{i}"),
            Value::Float(x) => write!(f, "{x:?}"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Str(s) => write!(f, "{s:?}"),
            Value::Enum(e) => f.write_str(e),
        }
    }
}

impl Value {
    /// The value as a float, for ints and floats.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Int(i) => Some(*i as f64),
            Value::Float(x) => Some(*x),
            _ => None,
        }
    }
}

/// Names and their values.
pub type Env = HashMap<String, Value>;

type Result<T> = std::result::Result<T, Diagnostic>;

fn bad(expr: &Expr, what: &str) -> Diagnostic {
    Diagnostic::new(
        "lmx::eval",
        format!("cannot evaluate this static expression: {what}"),
        expr.span,
        what.to_string(),
    )
}

/// Evaluates a static expression. Integer division must be exact.
pub fn eval(expr: &Expr, env: &Env) -> Result<Value> {
    match &expr.kind {
        ExprKind::Int(i) => Ok(Value::Int(*i)),
        ExprKind::Float(x) => Ok(Value::Float(*x)),
        ExprKind::Bool(b) => Ok(Value::Bool(*b)),
        ExprKind::Str(s) => Ok(Value::Str(s.clone())),
        ExprKind::Name(n) => env
            .get(n)
            .cloned()
            .ok_or_else(|| bad(expr, &format!("`{n}` has no static value"))),
        ExprKind::Unary(op, e) => match (op, eval(e, env)?) {
            (UnaryOp::Neg, Value::Int(i)) => i
                .checked_neg()
                .map(Value::Int)
                .ok_or_else(|| bad(expr, "overflow")),
            (UnaryOp::Neg, Value::Float(x)) => Ok(Value::Float(-x)),
            (UnaryOp::Not, Value::Bool(b)) => Ok(Value::Bool(!b)),
            _ => Err(bad(expr, "wrong operand type")),
        },
        ExprKind::Binary(op @ (BinaryOp::And | BinaryOp::Or), _, a, b) => {
            match (op, eval(a, env)?) {
                (BinaryOp::And, Value::Bool(false)) => Ok(Value::Bool(false)),
                (BinaryOp::Or, Value::Bool(true)) => Ok(Value::Bool(true)),
                (_, Value::Bool(_)) => eval(b, env),
                _ => Err(bad(a, "not a bool")),
            }
        }
        ExprKind::Binary(op, _, a, b) => binary(expr, *op, eval(a, env)?, eval(b, env)?, a, b),
        ExprKind::If(cond, then, otherwise) => {
            let branch = match eval(cond, env)? {
                Value::Bool(true) => Some(then),
                Value::Bool(false) => otherwise.as_ref(),
                _ => return Err(bad(cond, "condition is not a bool")),
            };
            match branch.and_then(|b| b.stmts.last()).map(|s| &s.kind) {
                Some(StmtKind::Expr(e)) => eval(e, env),
                _ => Err(bad(expr, "branch has no value")),
            }
        }
        ExprKind::Index(target, subs) => {
            let s = match eval(target, env)? {
                Value::Str(s) => s,
                _ => return Err(bad(expr, "only strings can be indexed statically")),
            };
            let [crate::ast::Subscript::Index(i)] = subs.as_slice() else {
                return Err(bad(expr, "a string takes one index"));
            };
            let Value::Int(i) = eval(i, env)? else {
                return Err(bad(i, "index is not an int"));
            };
            usize::try_from(i)
                .ok()
                .and_then(|i| s.chars().nth(i))
                .map(|c| Value::Str(c.to_string()))
                .ok_or_else(|| bad(expr, &format!("index {i} is outside {s:?}")))
        }
        ExprKind::Call(callee, args) => {
            let ExprKind::Name(f) = &callee.kind else {
                return Err(bad(expr, "not a static function"));
            };
            let vals = args
                .iter()
                .map(|a| eval(&a.value, env))
                .collect::<Result<Vec<_>>>()?;
            call(expr, f, &vals)
        }
        ExprKind::List(_) | ExprKind::Member(..) => Err(bad(expr, "not a static value")),
    }
}

/// A built-in's static form, as the table defines it.
fn call(expr: &Expr, f: &str, vals: &[Value]) -> Result<Value> {
    let form = crate::builtins::lookup(f)
        .and_then(|b| b.statik)
        .ok_or_else(|| bad(expr, &format!("`{f}` is not a static function here")))?;
    if vals.len() != form.arity {
        return Err(bad(expr, &format!("`{f}` takes {} arguments", form.arity)));
    }
    (form.eval)(vals).map_err(|why| bad(expr, why))
}

fn binary(expr: &Expr, op: BinaryOp, a: Value, b: Value, ea: &Expr, eb: &Expr) -> Result<Value> {
    use BinaryOp::*;
    let overflow = || {
        Diagnostic::new(
            "lmx::config::overflow",
            format!(
                "`{}` overflows a 64-bit integer",
                crate::text::expr_text(expr)
            ),
            expr.span,
            format!("{a} {} {b} overflows", op.symbol()),
        )
    };
    match (op, &a, &b) {
        (Eq, _, _) => Ok(Value::Bool(a == b)),
        (Ne, _, _) => Ok(Value::Bool(a != b)),
        (Div | Rem, Value::Int(x), Value::Int(0)) => Err(Diagnostic::new(
            "lmx::config::division_by_zero",
            format!("`{}` divides by zero", crate::text::expr_text(expr)),
            expr.span,
            format!("{x} {} 0", op.symbol()),
        )
        .with_help(format!(
            "choose a value of `{}` other than 0",
            crate::text::expr_text(eb)
        ))),
        (Div, Value::Int(x), Value::Int(y)) => {
            if x.checked_rem(*y) != Some(0) {
                Err(Diagnostic::new(
                    "lmx::config::inexact_division",
                    format!("`{}` does not divide exactly", crate::text::expr_text(expr)),
                    expr.span,
                    format!("{x} / {y} leaves a remainder"),
                )
                .with_help(format!(
                    "choose values where `{}` is a multiple of `{}`",
                    crate::text::expr_text(ea),
                    crate::text::expr_text(eb)
                )))
            } else {
                x.checked_div(*y).map(Value::Int).ok_or_else(overflow)
            }
        }
        (Rem, Value::Int(x), Value::Int(y)) => x
            .checked_rem(*y)
            .map(Value::Int)
            .ok_or_else(|| bad(expr, "remainder by zero")),
        (Add, Value::Int(x), Value::Int(y)) => {
            x.checked_add(*y).map(Value::Int).ok_or_else(overflow)
        }
        (Sub, Value::Int(x), Value::Int(y)) => {
            x.checked_sub(*y).map(Value::Int).ok_or_else(overflow)
        }
        (Mul, Value::Int(x), Value::Int(y)) => {
            x.checked_mul(*y).map(Value::Int).ok_or_else(overflow)
        }
        (Pow, Value::Int(_), Value::Int(y)) if *y < 0 => Err(Diagnostic::new(
            "lmx::eval",
            format!(
                "`{}` raises an int to a negative power",
                crate::text::expr_text(expr)
            ),
            eb.span,
            format!("the exponent is {y}"),
        )
        .with_help("an int power needs an exponent of at least 0; write the base as a float (`2.0`) for a fraction")),
        (Pow, Value::Int(x), Value::Int(y)) => u32::try_from(*y)
            .ok()
            .and_then(|y| x.checked_pow(y))
            .map(Value::Int)
            .ok_or_else(overflow),
        (Lt | Le | Gt | Ge, Value::Str(x), Value::Str(y)) => Ok(Value::Bool(compare(op, x, y))),
        _ => {
            let (x, y) = a
                .as_f64()
                .zip(b.as_f64())
                .ok_or_else(|| bad(expr, "wrong operand types"))?;
            Ok(match op {
                Add => Value::Float(x + y),
                Sub => Value::Float(x - y),
                Mul => Value::Float(x * y),
                Div => Value::Float(x / y),
                Rem => Value::Float(x % y),
                Pow => Value::Float(x.powf(y)),
                Lt | Le | Gt | Ge => Value::Bool(compare(op, &x, &y)),
                _ => return Err(bad(expr, "wrong operand types")),
            })
        }
    }
}

fn compare<T: PartialOrd + ?Sized>(op: BinaryOp, x: &T, y: &T) -> bool {
    match op {
        BinaryOp::Lt => x < y,
        BinaryOp::Le => x <= y,
        BinaryOp::Gt => x > y,
        _ => x >= y,
    }
}
