//! Helpers of the built-ins' static forms: their types, values and Rust lowering.

use proc_macro2::TokenStream;
use quote::{format_ident, quote};

use super::{StaticArg, StaticForm};
use crate::eval::Value;
use crate::types::StaticTy;

/// One static number to a float.
pub fn number_to_float(t: &[StaticTy]) -> Result<StaticTy, &'static str> {
    match t {
        [StaticTy::Int(_) | StaticTy::Float] => Ok(StaticTy::Float),
        _ => Err("expects a number"),
    }
}

/// The value of one static number as a float.
pub fn float_arg(v: &[Value]) -> Result<f64, &'static str> {
    match v {
        [v] => v.as_f64().ok_or("expects a number"),
        _ => Err("expects one number"),
    }
}

/// A static argument as an `f64` expression, for a function argument's position.
pub fn as_f64(a: &StaticArg) -> TokenStream {
    let ts = &a.ts;
    match a.ty {
        StaticTy::Int(_) => quote!(#ts as f64),
        _ => ts.clone(),
    }
}

/// A static argument as an `f64` operand (parenthesised where it is a cast).
pub fn as_f64_operand(a: &StaticArg) -> TokenStream {
    let ts = &a.ts;
    match a.ty {
        StaticTy::Int(_) => quote!((#ts as f64)),
        _ => ts.clone(),
    }
}

/// `f64::method` of the first argument.
pub fn method(a: &[StaticArg], method: &str) -> TokenStream {
    let x = as_f64(&a[0]);
    let m = format_ident!("{}", method);
    quote!(f64::#m(#x))
}

fn min_max_ty(t: &[StaticTy]) -> Result<StaticTy, &'static str> {
    match t {
        [StaticTy::Int(_), StaticTy::Int(_)] => Ok(StaticTy::Int(None)),
        [StaticTy::Int(_) | StaticTy::Float, StaticTy::Int(_) | StaticTy::Float] => {
            Ok(StaticTy::Float)
        }
        _ => Err("expects two numbers"),
    }
}

/// `min(a, b)` or `max(a, b)` of static numbers: an int when both are ints.
macro_rules! min_max {
    ($form:ident, $f:ident) => {
        pub const $form: StaticForm = StaticForm {
            arity: 2,
            ty: min_max_ty,
            eval: |v| match v {
                [Value::Int(a), Value::Int(b)] => Ok(Value::Int(*a.$f(b))),
                [a, b] => match (a.as_f64(), b.as_f64()) {
                    (Some(a), Some(b)) => Ok(Value::Float(a.$f(b))),
                    _ => Err("expects two numbers"),
                },
                _ => Err("expects two numbers"),
            },
            lower: |a| {
                let ints = a.iter().all(|a| matches!(a.ty, StaticTy::Int(_)));
                let (x, y) = if ints {
                    (a[0].ts.clone(), a[1].ts.clone())
                } else {
                    (as_f64(&a[0]), as_f64(&a[1]))
                };
                if ints {
            quote!(i64::$f(#x, #y))
                } else {
            quote!(f64::$f(#x, #y))
                }
            },
        };
    };
}

min_max!(MIN, min);
min_max!(MAX, max);
