//! The types the checker gives expressions, and the static-versus-tensor rule.
//!
//! Every expression is either **static** (known when the program is built:
//! config values, block arguments, loop variables, shape sizes) or a
//! **tensor** (known only when the graph runs). Control flow (`if`, `for`,
//! indices, shapes) may depend only on static values; a tensor never becomes a
//! host value inside a step or forward pass. [`Ty::kind`] is that rule's input,
//! usable by any front end (the `.lmx` checker, `#[lmx::step]`).

use std::fmt;

use crate::ast::Dtype;
use crate::dim::{shape_text, Dim};
use crate::span::Span;

/// Whether a value is known at build time or only when the graph runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Known at build time: may steer control flow.
    Static,
    /// A graph value: may never steer control flow or be read to the host.
    Tensor,
    /// A parameterised module (layer, block, block list, group): callable or iterable.
    Module,
    /// Anything else (tuples, gradients); never a condition.
    Other,
}

/// A static type.
#[derive(Debug, Clone, PartialEq)]
pub enum StaticTy {
    /// An integer; `Some(dim)` when its symbolic value is known (so it can size a shape).
    Int(Option<Dim>),
    /// A float.
    Float,
    /// A boolean.
    Bool,
    /// A string.
    Str,
    /// One of an enum's variants.
    Enum(Vec<String>),
}

impl StaticTy {
    /// The type's name as written in `.lmx`.
    pub fn name(&self) -> &'static str {
        match self {
            StaticTy::Int(_) => "int",
            StaticTy::Float => "float",
            StaticTy::Bool => "bool",
            StaticTy::Str => "str",
            StaticTy::Enum(_) => "enum",
        }
    }

    /// Whether a value of `other` may be used where `self` is expected.
    pub fn accepts(&self, other: &StaticTy) -> bool {
        match (self, other) {
            (StaticTy::Int(_), StaticTy::Int(_)) => true,
            (StaticTy::Float, StaticTy::Float | StaticTy::Int(_)) => true,
            (StaticTy::Bool, StaticTy::Bool) | (StaticTy::Str, StaticTy::Str) => true,
            (StaticTy::Enum(a), StaticTy::Enum(b)) => a == b,
            _ => false,
        }
    }
}

/// A tensor's type: element type, shape (when known) and where that shape came from.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorTy {
    /// Element type.
    pub dtype: Dtype,
    /// The symbolic shape, `None` when it cannot be known statically.
    pub shape: Option<Vec<Dim>>,
    /// The expression or declaration that gave this tensor its shape.
    pub origin: Span,
}

impl TensorTy {
    /// A tensor of known shape.
    pub fn new(dtype: Dtype, shape: Vec<Dim>, origin: Span) -> Self {
        TensorTy {
            dtype,
            shape: Some(shape),
            origin,
        }
    }

    /// The shape as text, `[?]` when unknown.
    pub fn shape_text(&self) -> String {
        self.shape
            .as_deref()
            .map(shape_text)
            .unwrap_or_else(|| "[?]".to_string())
    }

    /// The rank, when known.
    pub fn rank(&self) -> Option<usize> {
        self.shape.as_ref().map(Vec::len)
    }
}

/// A library layer with its sizes, as declared in `params`.
#[derive(Debug, Clone, PartialEq)]
pub enum LayerTy {
    /// `embedding(n, d)`: `[..] int -> [.., d]`.
    Embedding {
        /// Number of rows.
        count: Dim,
        /// Row width.
        dim: Dim,
    },
    /// `linear(i, o)`: `[.., i] -> [.., o]`.
    Linear {
        /// Input width.
        input: Dim,
        /// Output width.
        output: Dim,
    },
    /// `layer_norm(d)` or `rms_norm(d)`: `[.., d] -> [.., d]`.
    Norm {
        /// Normalised width.
        dim: Dim,
    },
    /// `experts(d, h, n)`: `([.., d], int [.., k]) -> [.., k, d]` (boxed: three sizes would
    /// make every type larger).
    Experts(Box<ExpertsTy>),
}

/// The sizes of an `experts(dim, hidden, count)` layer.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertsTy {
    /// Input and output width.
    pub dim: Dim,
    /// Each expert's hidden width.
    pub hidden: Dim,
    /// The number of experts.
    pub count: Dim,
}

/// A parameterised thing a name refers to.
#[derive(Debug, Clone, PartialEq)]
pub enum ModuleTy {
    /// A library layer.
    Layer(LayerTy),
    /// An instance of a block: callable with the block's forward signature.
    Block(String),
    /// A list of block instances: iterable with `for`.
    BlockList(String),
    /// A group of parameters: its entries are reached with `.name`.
    Group(Vec<(String, Ty)>),
    /// A frozen model a step declares (`frozen reference = policy`): callable with the model's
    /// forward signature, and nothing else.
    Frozen(String),
}

/// The type of an expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Ty {
    /// A build-time value.
    Static(StaticTy),
    /// A graph value.
    Tensor(TensorTy),
    /// A module.
    Module(ModuleTy),
    /// Several values (`split`, `top_k`, `clip_grad_norm`), bound with `let a, b = ...`.
    Tuple(Vec<Ty>),
    /// The gradients of the model's parameters, from `grad(loss)`.
    Grads,
    /// A built-in function name, only callable.
    Function(String),
    /// The type is unknown because of an earlier error (suppresses follow-on errors).
    Unknown,
}

impl Ty {
    /// The static-versus-tensor kind of the type.
    pub fn kind(&self) -> Kind {
        match self {
            Ty::Static(_) => Kind::Static,
            Ty::Tensor(_) => Kind::Tensor,
            Ty::Module(_) => Kind::Module,
            Ty::Tuple(_) | Ty::Grads | Ty::Function(_) | Ty::Unknown => Kind::Other,
        }
    }

    /// A static int of known symbolic value.
    pub fn dim(d: Dim) -> Ty {
        Ty::Static(StaticTy::Int(Some(d)))
    }
}

impl fmt::Display for Ty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ty::Static(s) => write!(f, "static {}", s.name()),
            Ty::Tensor(t) => write!(f, "tensor {}", t.shape_text()),
            Ty::Module(ModuleTy::Layer(_)) => f.write_str("layer"),
            Ty::Module(ModuleTy::Block(b)) => write!(f, "block `{b}`"),
            Ty::Module(ModuleTy::BlockList(b)) => write!(f, "list of `{b}`"),
            Ty::Module(ModuleTy::Group(_)) => f.write_str("parameter group"),
            Ty::Module(ModuleTy::Frozen(n)) => write!(f, "frozen model `{n}`"),
            Ty::Tuple(t) => write!(f, "tuple of {}", t.len()),
            Ty::Grads => f.write_str("gradients"),
            Ty::Function(n) => write!(f, "function `{n}`"),
            Ty::Unknown => f.write_str("unknown"),
        }
    }
}
