//! The syntax tree of a `.lmx` file, as written, with a [`Span`] on every node.
//!
//! The tree mirrors `grammar/lmx.pest` one rule to one type; it carries no
//! meaning beyond the text. [`crate::check`] gives it meaning.

use crate::span::Span;

/// A name as written, with its location.
#[derive(Debug, Clone, PartialEq)]
pub struct Ident {
    /// The text of the name.
    pub name: String,
    /// Where it was written.
    pub span: Span,
}

/// `model Name { sections }`: the whole file.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    /// The model's name, which names the generated Rust types.
    pub name: Ident,
    /// Entries of every `config { }` section, in order.
    pub config: Vec<ConfigEntry>,
    /// `preset name { overrides }` sections, in order.
    pub presets: Vec<Preset>,
    /// `block Name(args) { params forward }` definitions.
    pub blocks: Vec<Block>,
    /// The model's own `params { }` (the root of the parameter tree).
    pub params: Option<ParamGroup>,
    /// The model's `forward(...)`.
    pub forward: Option<Forward>,
    /// `step name(...) { }` training steps.
    pub steps: Vec<Step>,
    /// The span of the `model` keyword and name, used to report missing sections.
    pub header: Span,
}

/// One entry of `config { }`.
#[derive(Debug, Clone, PartialEq)]
pub enum ConfigEntry {
    /// `name: type = default`: a value a preset may override.
    Setting {
        /// The setting's name.
        name: Ident,
        /// Its declared type.
        ty: StaticType,
        /// Its default value.
        default: Expr,
    },
    /// `name = expression`: a value computed from earlier entries.
    Derived {
        /// The derived value's name.
        name: Ident,
        /// The expression computing it.
        value: Expr,
    },
}

impl ConfigEntry {
    /// The entry's name.
    pub fn name(&self) -> &Ident {
        match self {
            ConfigEntry::Setting { name, .. } | ConfigEntry::Derived { name, .. } => name,
        }
    }
}

/// A static type: the type of a configuration value or block argument.
#[derive(Debug, Clone, PartialEq)]
pub enum StaticType {
    /// `int`: a 64-bit integer.
    Int,
    /// `float`: a 64-bit float.
    Float,
    /// `bool`.
    Bool,
    /// `str`: a string such as a layer pattern.
    Str,
    /// `enum(a, b, c)`: one of the listed names.
    Enum(Vec<Ident>),
}

/// `preset name { setting = value, ... }`.
#[derive(Debug, Clone, PartialEq)]
pub struct Preset {
    /// The preset's name (may start with a digit: `124m`, `7b`).
    pub name: Ident,
    /// The settings it changes.
    pub overrides: Vec<(Ident, Expr)>,
}

/// `block Name(arg: type = default, ...) { params { } forward(...) { } }`.
#[derive(Debug, Clone, PartialEq)]
pub struct Block {
    /// The block's name.
    pub name: Ident,
    /// Static arguments given where the block is instantiated.
    pub args: Vec<BlockArg>,
    /// The block's parameters.
    pub params: Option<ParamGroup>,
    /// The block's forward pass.
    pub forward: Forward,
}

/// A static argument of a block.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockArg {
    /// The argument's name.
    pub name: Ident,
    /// Its type.
    pub ty: StaticType,
    /// Its default, if any.
    pub default: Option<Expr>,
}

/// `{ name: kind, ... }`: a group of named parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamGroup {
    /// The entries in declaration order (which is the traversal order).
    pub entries: Vec<Param>,
    /// The braces.
    pub span: Span,
}

/// `name: kind [if guard]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Param {
    /// The marks written before the name (`frozen`, `no_decay`), in order.
    pub marks: Vec<Mark>,
    /// The parameter's name: one segment of its dotted name.
    pub name: Ident,
    /// What it is.
    pub kind: ParamKind,
    /// A static condition: the parameter exists only where it holds.
    pub guard: Option<Expr>,
    /// The whole entry.
    pub span: Span,
}

/// A mark on a parameter entry, for every leaf below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    /// Which mark.
    pub kind: MarkKind,
    /// The keyword.
    pub span: Span,
}

/// What a [`Mark`] says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkKind {
    /// `frozen`: no gradient, no optimizer state, no update (`#[lmx(frozen)]`).
    Frozen,
    /// `no_decay`: no weight decay (`#[lmx(no_decay)]`).
    NoDecay,
}

impl MarkKind {
    /// The keyword.
    pub fn keyword(self) -> &'static str {
        match self {
            MarkKind::Frozen => "frozen",
            MarkKind::NoDecay => "no_decay",
        }
    }
}

/// What a parameter entry declares.
#[derive(Debug, Clone, PartialEq)]
pub enum ParamKind {
    /// `{ ... }`: a nested group.
    Group(ParamGroup),
    /// `[Block(args); n]` or `[Block(args) for i in a..b]`.
    List {
        /// The element.
        module: ModuleRef,
        /// How many, and the per-element variable if any.
        count: Box<ListCount>,
    },
    /// `tied(path)`: shares the weight of another parameter.
    Tied(Vec<Ident>),
    /// `tensor[dims] = init(args)`: a raw tensor.
    Tensor {
        /// Its shape, static expressions.
        shape: Vec<Expr>,
        /// Its initialiser, if not the default.
        init: Option<Call>,
        /// The `tensor[...]` text.
        span: Span,
        /// Written `buffer[...]`: state that is not trained (no gradient, no optimizer state,
        /// no weight decay), whose next value a training step's forward pass may give (`next`).
        buffer: bool,
    },
    /// `layer(args)` or `Block(args)`.
    Module(ModuleRef),
}

/// A use of a library layer or a block: `linear(d, 4 * d, bias = false)`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModuleRef {
    /// The layer or block name.
    pub name: Ident,
    /// Its static arguments.
    pub args: Vec<Arg>,
    /// The whole reference.
    pub span: Span,
}

/// The length of a block list.
#[derive(Debug, Clone, PartialEq)]
pub enum ListCount {
    /// `; n`: `n` identical elements.
    Repeat(Expr),
    /// `for i in a..b`: one element per `i`, which the element's arguments may use.
    Comprehension {
        /// The element variable.
        var: Ident,
        /// The range.
        range: Range,
    },
}

/// A named call with arguments, such as an initialiser or optimizer.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// The function's name.
    pub name: Ident,
    /// Its arguments.
    pub args: Vec<Arg>,
    /// The whole call.
    pub span: Span,
}

/// `name = value` or `value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Arg {
    /// The keyword, for keyword arguments.
    pub name: Option<Ident>,
    /// The value.
    pub value: Expr,
}

/// `forward(inputs) -> output { body }`.
#[derive(Debug, Clone, PartialEq)]
pub struct Forward {
    /// Tensor inputs.
    pub inputs: Vec<Input>,
    /// The declared output type, checked against the body's value.
    pub output: Option<TensorType>,
    /// The body; its last expression statement is the result.
    pub body: Body,
    /// The `forward` keyword.
    pub span: Span,
}

/// `step name(inputs) { body }`.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// The step's name.
    pub name: Ident,
    /// Batch inputs.
    pub inputs: Vec<Input>,
    /// The body.
    pub body: Body,
}

/// `name: [dims] dtype`.
#[derive(Debug, Clone, PartialEq)]
pub struct Input {
    /// The input's name.
    pub name: Ident,
    /// Its type.
    pub ty: TensorType,
}

/// `[d0, d1, ...] dtype`.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorType {
    /// Dimensions: static expressions or new symbolic sizes (capitalised names).
    pub shape: Vec<Expr>,
    /// Element type (`float` when omitted).
    pub dtype: Dtype,
    /// The whole type.
    pub span: Span,
}

/// Element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// Floating point (the precision is chosen at run time).
    Float,
    /// Integer (token ids, indices).
    Int,
    /// Boolean (masks).
    Bool,
}

impl Dtype {
    /// The dtype's name as written in `.lmx`.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Float => "float",
            Dtype::Int => "int",
            Dtype::Bool => "bool",
        }
    }

    /// The name with its indefinite article (`an int`, `a float`).
    pub fn with_article(self) -> &'static str {
        match self {
            Dtype::Float => "a float",
            Dtype::Int => "an int",
            Dtype::Bool => "a bool",
        }
    }
}

/// `{ statements }`.
#[derive(Debug, Clone, PartialEq)]
pub struct Body {
    /// The statements; a final expression statement is the body's value.
    pub stmts: Vec<Stmt>,
    /// The braces.
    pub span: Span,
}

impl Body {
    /// The body's value: its last statement, when that is an expression.
    pub fn tail(&self) -> Option<&Expr> {
        match self.stmts.last().map(|s| &s.kind) {
            Some(StmtKind::Expr(e)) => Some(e),
            _ => None,
        }
    }
}

/// A statement with its span.
#[derive(Debug, Clone, PartialEq)]
pub struct Stmt {
    /// What it does.
    pub kind: StmtKind,
    /// The whole statement.
    pub span: Span,
}

/// The statements of a body.
#[derive(Debug, Clone, PartialEq)]
pub enum StmtKind {
    /// `let a, b = value`.
    Let(Vec<Ident>, Expr),
    /// `a = value` (rebinds an existing name).
    Assign(Ident, Expr),
    /// `for a, b in range { }`.
    For(Vec<Ident>, Range, Body),
    /// `while cond { }` (always rejected: loops must be static ranges).
    While(Expr, Body),
    /// `optimizer name(args)`.
    Optimizer(Call),
    /// `accumulate n`.
    Accumulate(Expr),
    /// `update grads`.
    Update(Expr),
    /// `metrics a, b`.
    Metrics(Vec<Ident>),
    /// `frozen name = source`: a model the step runs without gradients (`policy`: a copy of the
    /// policy as the run starts).
    Frozen(Ident, Ident),
    /// `next path = value`: the next value of a buffer (a `buffer[..]` of the forward pass's own
    /// parameters), which a training step writes into its state after its update; the pass
    /// itself goes on reading the buffer's value.
    Next(Expr, Expr),
    /// An expression.
    Expr(Expr),
}

/// `a..b`, or an expression to iterate over (a block list).
#[derive(Debug, Clone, PartialEq)]
pub struct Range {
    /// The start, or the iterated expression.
    pub start: Expr,
    /// The exclusive end, for `a..b`.
    pub end: Option<Expr>,
    /// The whole range.
    pub span: Span,
}

/// An expression with its span.
#[derive(Debug, Clone, PartialEq)]
pub struct Expr {
    /// What it is.
    pub kind: ExprKind,
    /// Where it was written.
    pub span: Span,
}

/// Expressions.
#[derive(Debug, Clone, PartialEq)]
pub enum ExprKind {
    /// An integer literal.
    Int(i64),
    /// A float literal.
    Float(f64),
    /// `true` / `false`.
    Bool(bool),
    /// A string literal.
    Str(String),
    /// A name.
    Name(String),
    /// `[a, b, c]`.
    List(Vec<Expr>),
    /// `-a`, `not a`.
    Unary(UnaryOp, Box<Expr>),
    /// `a op b`; the span of the operator is kept for diagnostics.
    Binary(BinaryOp, Span, Box<Expr>, Box<Expr>),
    /// `f(args)`.
    Call(Box<Expr>, Vec<Arg>),
    /// `a.name`.
    Member(Box<Expr>, Ident),
    /// `a[subscripts]`.
    Index(Box<Expr>, Vec<Subscript>),
    /// `if cond { } else { }`.
    If(Box<Expr>, Body, Option<Body>),
}

/// One subscript of an index expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Subscript {
    /// `...`: all remaining leading axes.
    Ellipsis(Span),
    /// `i`: one position (drops the axis).
    Index(Expr),
    /// `a:b`, `:b`, `a:`, `:`.
    Slice(Option<Expr>, Option<Expr>, Span),
}

/// Prefix operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnaryOp {
    /// `-a`.
    Neg,
    /// `not a`.
    Not,
}

/// Infix operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    /// `or`.
    Or,
    /// `and`.
    And,
    /// `==`.
    Eq,
    /// `!=`.
    Ne,
    /// `<`.
    Lt,
    /// `<=`.
    Le,
    /// `>`.
    Gt,
    /// `>=`.
    Ge,
    /// `+`.
    Add,
    /// `-`.
    Sub,
    /// `*`.
    Mul,
    /// `/` (exact for static ints).
    Div,
    /// `%`.
    Rem,
    /// `**`.
    Pow,
    /// `@`.
    MatMul,
}

impl BinaryOp {
    /// The operator as written.
    pub fn symbol(self) -> &'static str {
        match self {
            BinaryOp::Or => "or",
            BinaryOp::And => "and",
            BinaryOp::Eq => "==",
            BinaryOp::Ne => "!=",
            BinaryOp::Lt => "<",
            BinaryOp::Le => "<=",
            BinaryOp::Gt => ">",
            BinaryOp::Ge => ">=",
            BinaryOp::Add => "+",
            BinaryOp::Sub => "-",
            BinaryOp::Mul => "*",
            BinaryOp::Div => "/",
            BinaryOp::Rem => "%",
            BinaryOp::Pow => "**",
            BinaryOp::MatMul => "@",
        }
    }

    /// Whether the operator compares its operands.
    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            BinaryOp::Eq | BinaryOp::Ne | BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge
        )
    }
}
