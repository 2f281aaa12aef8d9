//! The built-in functions of `.lmx`, one table entry per function.
//!
//! An entry holds everything about its function: the parameters (positional order, keyword
//! names, what each slot accepts, defaults), the shape and dtype rule the checker applies, the
//! lowering to Rust the code generator prints, the static form where the function also computes
//! on build-time values, and the line `docs/language.md` shows. The checker binds a call's
//! arguments to the parameters once ([`crate::check`]'s binder: unknown, repeated, extra and
//! missing arguments are errors, a tensor in a static slot is an error) and records the binding
//! in the typed IR; the code generator reads that binding and calls the entry's lowering.
//!
//! Adding a built-in is one entry in [`table`] plus, when it needs a runtime function, that
//! function in `lmx_runtime::nn`.

mod statics;
mod table;

use proc_macro2::TokenStream;

use crate::check::RuleCx;
use crate::codegen::LowerCx;
use crate::eval::Value;
use crate::types::{StaticTy, Ty};

pub use table::{ACTIVATIONS, TABLE};

/// What an argument slot accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// A tensor.
    Tensor,
    /// A tensor or a static number, broadcast against the call's other operands.
    Operand,
    /// A static int (a size or a count).
    Int,
    /// A static float (an epsilon, a base, a probability).
    Float,
    /// A static bool (a flag).
    Bool,
    /// A static int naming an axis of a tensor argument, checked against its rank.
    Axis,
    /// A literal int count of results (`split`).
    Count,
    /// A list of static ints: a shape such as `[B, T, d_model]`.
    Shape,
    /// A list of literal ints: a permutation of axes.
    Axes,
    /// A list of tensors.
    Tensors,
}

impl Slot {
    /// Whether the slot holds a build-time value.
    pub fn is_static(self) -> bool {
        !matches!(self, Slot::Tensor | Slot::Operand | Slot::Tensors)
    }

    /// The slot's name in documentation and diagnostics.
    pub fn describe(self) -> &'static str {
        match self {
            Slot::Tensor => "a tensor",
            Slot::Operand => "a tensor or a number",
            Slot::Int => "a static int",
            Slot::Float => "a static float",
            Slot::Bool => "a static bool",
            Slot::Axis => "an axis (a static int)",
            Slot::Count => "a literal count",
            Slot::Shape => "a shape such as `[B, T, d]`",
            Slot::Axes => "a list of axes",
            Slot::Tensors => "a list of tensors",
        }
    }
}

/// The value of a parameter left out of a call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Default {
    /// The argument must be given.
    Required,
    /// Absent unless given (the lowering chooses what absence means, e.g. all axes).
    Absent,
    /// An int default.
    Int(i64),
    /// A float default.
    Float(f64),
    /// A bool default.
    Bool(bool),
}

impl Default {
    /// The default as `.lmx` writes it, for the documentation.
    pub fn text(self) -> Option<String> {
        match self {
            Default::Required | Default::Absent => None,
            Default::Int(i) => Some(i.to_string()),
            Default::Float(x) => Some(format!("{x:?}")),
            Default::Bool(b) => Some(b.to_string()),
        }
    }
}

/// One parameter of a built-in.
#[derive(Debug, Clone, Copy)]
pub struct Param {
    /// Its keyword name (also its name in diagnostics).
    pub name: &'static str,
    /// What it accepts.
    pub slot: Slot,
    /// Its value when left out.
    pub default: Default,
}

/// A parameter (a `const fn`, for the tables).
pub const fn param(name: &'static str, slot: Slot, default: Default) -> Param {
    Param {
        name,
        slot,
        default,
    }
}

/// Where a built-in may be called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Site {
    /// In forward passes and steps.
    Anywhere,
    /// In forward passes only (`dropout` draws from the forward pass's random key).
    Forward,
    /// In forward passes only, where a generation cache can hold the call's state between calls
    /// (the recurrences: `ssd`, `causal_conv1d`).
    Recurrent,
}

/// A lowered static argument: a Rust expression (parenthesised where needed) and its type
/// (`i64`, `f64`, `bool` or `String` in Rust).
#[derive(Debug, Clone)]
pub struct StaticArg {
    /// The Rust expression.
    pub ts: TokenStream,
    /// Its `.lmx` type.
    pub ty: StaticTy,
}

/// A built-in's form over build-time values (`sqrt(d_model)`, `max(a, b)`, `int(x)`).
#[derive(Clone, Copy)]
pub struct StaticForm {
    /// The number of arguments (all positional, all static numbers, bools or strings).
    pub arity: usize,
    /// The result type for the arguments' types, or why they do not fit.
    pub ty: fn(&[StaticTy]) -> Result<StaticTy, &'static str>,
    /// The value for the arguments' values (configuration and presets are evaluated with it).
    pub eval: fn(&[Value]) -> Result<Value, &'static str>,
    /// The Rust expression over the lowered arguments.
    pub lower: fn(&[StaticArg]) -> TokenStream,
}

/// A built-in's form over tensors.
#[derive(Clone, Copy)]
pub struct TensorForm {
    /// Its parameters, in positional order.
    pub params: &'static [Param],
    /// The shape and dtype rule, over arguments already bound to the parameters.
    pub(crate) rule: fn(&mut RuleCx<'_, '_>) -> Ty,
    /// The lowering to Rust, over the same binding.
    pub(crate) lower: fn(&mut LowerCx<'_, '_, '_>) -> crate::codegen::R<crate::codegen::Lowered>,
}

/// One built-in function.
#[derive(Clone, Copy)]
pub struct Builtin {
    /// Its name in `.lmx`.
    pub name: &'static str,
    /// Where it may be called.
    pub site: Site,
    /// The form over tensors; `None` for functions of static values only (`int`, `len`).
    pub tensor: Option<TensorForm>,
    /// The form over static values, chosen when every argument is static.
    pub statik: Option<StaticForm>,
    /// The result, in words, for the documentation's table.
    pub result: &'static str,
    /// One line of documentation.
    pub doc: &'static str,
}

impl std::fmt::Debug for Builtin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "builtin `{}`", self.name)
    }
}

impl Builtin {
    /// The signature as the documentation writes it: `softmax(x, axis = -1)`.
    pub fn signature(&self) -> String {
        match &self.tensor {
            Some(tensor) => signature(self.name, tensor.params),
            None => {
                let arity = self.statik.map_or(0, |s| s.arity);
                let args: Vec<&str> = ["x", "y"].into_iter().take(arity).collect();
                format!("{}({})", self.name, args.join(", "))
            }
        }
    }
}

/// `name(params)` with the parameters' defaults, as documentation and help lines write it.
pub fn signature(name: &str, params: &[Param]) -> String {
    let args: Vec<String> = params
        .iter()
        .map(|p| match p.default {
            Default::Required => p.name.to_string(),
            Default::Absent => format!("{} = none", p.name),
            d => format!("{} = {}", p.name, d.text().unwrap_or_default()),
        })
        .collect();
    format!("{name}({})", args.join(", "))
}

/// The parameters of the step-only functions `grad` and `clip_grad_norm` (their rules are the
/// step's: `check/stmts.rs`).
pub const GRAD_PARAMS: &[Param] = &[param("loss", Slot::Tensor, Default::Required)];

/// The parameters of a layer's call (`proj(x)`): one tensor.
pub const LAYER_PARAMS: &[Param] = &[param("x", Slot::Tensor, Default::Required)];

/// The parameters of an `experts` layer's call (`switch_mlp(x, indices)`).
pub const EXPERTS_PARAMS: &[Param] = &[
    param("x", Slot::Tensor, Default::Required),
    param("indices", Slot::Tensor, Default::Required),
];

/// The parameters of `clip_grad_norm`.
pub const CLIP_PARAMS: &[Param] = &[
    param("grads", Slot::Tensor, Default::Required),
    param("max", Slot::Float, Default::Required),
];

/// The built-in called `name`.
pub fn lookup(name: &str) -> Option<&'static Builtin> {
    TABLE.iter().find(|b| b.name == name)
}

/// The built-ins' table as `docs/language.md` shows it (a test keeps the document equal to it).
pub fn markdown_table() -> String {
    let mut out = String::from("| call | result | meaning |\n|---|---|---|\n");
    for b in TABLE {
        let statik = if b.statik.is_some() && b.tensor.is_some() {
            " (also on static numbers)"
        } else {
            ""
        };
        out.push_str(&format!(
            "| `{}` | {} | {}{} |\n",
            b.signature(),
            b.result,
            b.doc,
            statik
        ));
    }
    out
}
