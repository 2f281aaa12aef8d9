//! Calls of built-ins, printed from the binding the checker recorded (`ir::Typed::calls`): the
//! entry's lowering asks for each parameter's argument in the Rust form its slot needs.

use proc_macro2::TokenStream;
use quote::quote;

use super::forward::{
    cast, float_lit, int_lit, unsupported, Fx, SType, TupleForm, Val, R, S, T, X,
};
use crate::ast::{Arg, Expr, ExprKind};
use crate::builtins::{Default, StaticArg};
use crate::diag::Diagnostic;
use crate::ir::{CallIr, Form};
use crate::span::Span;
use crate::types::StaticTy;

/// A lowered call's value.
pub(crate) type Lowered = X;

/// What a built-in's lowering sees: the translator, the checked call and its arguments.
pub(crate) struct LowerCx<'f, 'g, 'm> {
    fx: &'f mut Fx<'g, 'm>,
    call: &'f CallIr,
    args: &'f [Arg],
    span: Span,
}

impl LowerCx<'_, '_, '_> {
    fn arg(&self, i: usize) -> Option<&Expr> {
        self.call
            .args
            .get(i)
            .copied()
            .flatten()
            .map(|at| &self.args[at].value)
    }

    fn default(&self, i: usize) -> Default {
        self.call
            .builtin
            .tensor
            .map_or(Default::Required, |f| f.params[i].default)
    }

    /// An error for a construct this lowering cannot print (a generator bug, never input's).
    pub fn unsupported(&self, what: &str) -> Diagnostic {
        unsupported(self.span, what)
    }

    /// Whether parameter `i` was given.
    pub fn given(&self, i: usize) -> bool {
        self.arg(i).is_some()
    }

    fn required(&self, i: usize) -> R<Expr> {
        self.arg(i)
            .cloned()
            .ok_or_else(|| self.unsupported("a call without a required argument"))
    }

    fn lower_tensor(&mut self, i: usize) -> R<T> {
        let e = self.required(i)?;
        let x = self.fx.expr(&e)?;
        self.fx.tensor(x, e.span)
    }

    /// Parameter `i` as a `&Array` expression.
    pub fn tensor_ref(&mut self, i: usize) -> R<TokenStream> {
        Ok(self.lower_tensor(i)?.r())
    }

    /// Parameter `i` as an `Array` or `&Array` receiver of a method call.
    pub fn tensor_value(&mut self, i: usize) -> R<TokenStream> {
        Ok(self.lower_tensor(i)?.ts)
    }

    /// Parameter `i` bound to a local first (its expression may borrow what the call borrows).
    pub fn hoisted(&mut self, i: usize, base: &str) -> R<TokenStream> {
        let t = self.lower_tensor(i)?;
        Ok(self.fx.hoist(t, base).r())
    }

    /// The tensors of a list parameter, as `&Array` expressions.
    pub fn tensors(&mut self, i: usize) -> R<Vec<TokenStream>> {
        let e = self.required(i)?;
        let ExprKind::List(items) = &e.kind else {
            return Err(self.unsupported("a tensor list that is not a list"));
        };
        items
            .iter()
            .map(|item| {
                let x = self.fx.expr(item)?;
                Ok(self.fx.tensor(x, item.span)?.r())
            })
            .collect()
    }

    /// Operands that broadcast together: a static one becomes a scalar of the first tensor
    /// operand's precision.
    pub fn operands<const N: usize>(&mut self, params: [usize; N]) -> R<[TokenStream; N]> {
        let mut xs = Vec::with_capacity(N);
        for i in params {
            let e = self.required(i)?;
            xs.push(self.fx.expr(&e)?);
        }
        let like = xs.iter().position(|x| matches!(x, X::Tensor(_)));
        let like = match like {
            Some(at) => {
                let X::Tensor(t) = xs[at].clone() else {
                    unreachable!("position found a tensor")
                };
                let t = self.fx.hoist(t, "value");
                xs[at] = X::Tensor(t.clone());
                Some(t)
            }
            None => None,
        };
        let mut out = Vec::with_capacity(N);
        for x in xs {
            out.push(match (x, &like) {
                (X::Tensor(t), _) => t.r(),
                (X::Static(s, ty), Some(like)) => {
                    let v = cast(&s, &ty, "f64");
                    let r = like.r();
                    quote!(&nn::literal(#v, #r)?)
                }
                (X::Static(s, ty), None) => {
                    let v = cast(&s, &ty, "f32");
                    quote!(&Array::from_f32(#v))
                }
                _ => return Err(self.unsupported("this operand")),
            });
        }
        out.try_into()
            .map_err(|_| self.unsupported("an operand count"))
    }

    fn static_param(&mut self, i: usize, to: &str) -> R<TokenStream> {
        match self.arg(i).cloned() {
            Some(e) => {
                let (s, ty) = self.fx.static_expr(&e)?;
                // A bool is a bool: only numbers are converted.
                Ok(if ty == SType::Bool {
                    s.ts
                } else {
                    cast(&s, &ty, to)
                })
            }
            // A default is typed as the parameter: an unsuffixed float would be inferred as
            // `f64` where a lowering widens it (`f64::from(1.0)`, a useless conversion).
            None => match self.default(i) {
                Default::Int(n) if to == "f32" => Ok(f32_lit(n as f32)),
                Default::Int(n) => Ok(int_lit(n).ts),
                Default::Float(x) if to == "f32" => Ok(f32_lit(x as f32)),
                Default::Float(x) => Ok(float_lit(x).ts),
                Default::Bool(b) => Ok(quote!(#b)),
                Default::Required | Default::Absent => {
                    Err(self.unsupported("a call without a required argument"))
                }
            },
        }
    }

    /// An int parameter as `i32` (its default when left out).
    pub fn i32(&mut self, i: usize) -> R<TokenStream> {
        self.static_param(i, "i32")
    }

    /// A float parameter as `f32`.
    pub fn f32(&mut self, i: usize) -> R<TokenStream> {
        self.static_param(i, "f32")
    }

    /// A bool parameter.
    pub fn bool(&mut self, i: usize) -> R<TokenStream> {
        self.static_param(i, "bool")
    }

    /// A list of sizes as `&[i32]`.
    pub fn shape(&mut self, i: usize) -> R<TokenStream> {
        let e = self.required(i)?;
        let ExprKind::List(dims) = &e.kind else {
            return Err(self.unsupported("a shape that is not a list"));
        };
        let dims = dims
            .iter()
            .map(|d| self.fx.i32_expr(d))
            .collect::<R<Vec<_>>>()?;
        Ok(quote!(&[#(#dims),*]))
    }

    /// A literal count.
    pub fn count(&self, i: usize) -> usize {
        match self.arg(i).map(|e| &e.kind) {
            Some(ExprKind::Int(n)) => usize::try_from(*n).unwrap_or(0),
            _ => 0,
        }
    }

    /// Where positions over parameter `i`'s length start (an `Option<&nn::Positions>`): after
    /// the KV cache when the length is a sequence-length symbol (`T`), else at 0 (`None`).
    pub fn positions_start(&mut self, i: usize) -> TokenStream {
        let size_symbol = matches!(
            self.arg(i).map(|e| &e.kind),
            Some(ExprKind::Name(n)) if n.chars().next().is_some_and(char::is_uppercase)
        );
        if size_symbol {
            let positions = self.fx.positions();
            quote!(Some(#positions))
        } else {
            quote!(None)
        }
    }

    /// Where this forward pass's positions start, as an int32 scalar (`&Array`).
    pub fn offset(&mut self) -> TokenStream {
        self.fx.offset()
    }

    /// The forward pass's state, through which dropout draws its masks.
    pub fn drop_pass(&mut self) -> TokenStream {
        self.fx.uses_pass = true;
        self.fx.pass_mut = true;
        self.fx.drops = true;
        quote!(pass)
    }

    /// The forward pass's state, through which attention reads and extends the KV cache.
    pub fn attend_pass(&mut self) -> TokenStream {
        self.fx.uses_pass = true;
        self.fx.pass_mut = true;
        self.fx.attends = true;
        quote!(pass)
    }

    /// The forward pass's state, through which a recurrence reads and replaces its state in the
    /// generation cache.
    pub fn scan_pass(&mut self) -> TokenStream {
        self.fx.uses_pass = true;
        self.fx.pass_mut = true;
        self.fx.recurs = true;
        quote!(pass)
    }

    /// A tensor-valued result.
    pub fn tensor(&self, ts: TokenStream) -> X {
        X::Tensor(T::owned(ts))
    }

    /// `n` tensors as an array (`split`).
    pub fn array_tuple(&self, ts: TokenStream, n: usize) -> X {
        X::Tuple(ts, vec![Val::Tensor; n], TupleForm::Array)
    }

    /// Two tensors as a tuple (`top_k`).
    pub fn pair(&self, ts: TokenStream) -> X {
        X::Tuple(ts, vec![Val::Tensor, Val::Tensor], TupleForm::Tuple)
    }
}

impl Fx<'_, '_> {
    /// A call of a built-in, printed from the checker's binding.
    pub(crate) fn builtin_call(&mut self, call: &CallIr, args: &[Arg], span: Span) -> R<X> {
        match call.form {
            Form::Static => self.static_builtin(call, args, span),
            Form::Tensor => {
                let Some(form) = call.builtin.tensor else {
                    return Err(unsupported(span, "a static function over tensors"));
                };
                let mut cx = LowerCx {
                    fx: self,
                    call,
                    args,
                    span,
                };
                (form.lower)(&mut cx)
            }
        }
    }

    fn static_builtin(&mut self, call: &CallIr, args: &[Arg], span: Span) -> R<X> {
        let Some(form) = call.builtin.statik else {
            return Err(unsupported(span, "a tensor function over static values"));
        };
        let mut lowered = Vec::with_capacity(args.len());
        let mut types = Vec::with_capacity(args.len());
        for a in args {
            let (s, ty) = self.static_expr(&a.value)?;
            let st = match &ty {
                SType::Int => StaticTy::Int(None),
                SType::Float => StaticTy::Float,
                SType::Bool => StaticTy::Bool,
                SType::Str => StaticTy::Str,
                SType::Enum(_) => return Err(unsupported(a.value.span, "an enum argument")),
            };
            lowered.push(StaticArg {
                ts: s.at(10),
                ty: st.clone(),
            });
            types.push(st);
        }
        let ty = (form.ty)(&types).map_err(|why| unsupported(span, why))?;
        let ts = (form.lower)(&lowered);
        let ty = self.g.stype(&ty);
        Ok(X::Static(
            S {
                ts,
                prec: 10,
                lit: None,
            },
            ty,
        ))
    }
}

/// `x` as an `f32` literal (`1.0f32`, `-0.5f32`).
fn f32_lit(x: f32) -> TokenStream {
    let lit = proc_macro2::Literal::f32_suffixed(x.abs());
    if x < 0.0 {
        quote!((-#lit))
    } else {
        quote!(#lit)
    }
}
