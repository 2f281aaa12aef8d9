//! Forward passes and step losses: `.lmx` statements and expressions to Rust over mlx-rs.
//!
//! Static values become plain Rust values computed from the configuration (`i64`, `f64`, `bool`,
//! `String`, enums); tensors become `Array`s. Static loops and branches stay Rust loops and
//! branches over those values; calls of blocks become method calls on the parameter structs.

use std::cell::Cell;
use std::collections::HashMap;
use std::rc::Rc;

use proc_macro2::{Literal, TokenStream};
use quote::{format_ident, quote};

use super::names::{ident, snake};
use super::shared_input::{self, Call, CallKind};
use super::Gen;
use crate::ast::{Arg, BinaryOp, Body, Expr, ExprKind, StmtKind, Subscript, UnaryOp};
use crate::builtins::ACTIVATIONS;
use crate::diag::Diagnostic;
use crate::ir::{Form, LayerKind, ParamNode, ParamTree, Typed};
use crate::span::Span;

pub(crate) type R<T> = Result<T, Diagnostic>;

/// A diagnostic for a construct the checker accepts but the code generator cannot translate.
pub(crate) fn unsupported(span: Span, what: &str) -> Diagnostic {
    Diagnostic::new(
        "lmx::codegen::unsupported",
        format!("{what} cannot be compiled to Rust yet"),
        span,
        "not supported by the code generator",
    )
}

/// The Rust type of a static value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum SType {
    Int,
    Float,
    Bool,
    Str,
    /// A config enum: its Rust type name.
    Enum(String),
}

/// How a tuple value is destructured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum TupleForm {
    /// `[a, b, c]` (from `split`).
    Array,
    /// `(a, b)` (from `top_k`).
    Tuple,
}

/// What a parameter entry is when a forward pass uses it.
#[derive(Debug, Clone)]
pub(crate) enum Module {
    /// A library layer (or a tied use of one).
    Layer {
        kind: LayerKind,
        tied: bool,
        place: TokenStream,
        args: Vec<(String, Expr)>,
        decl: Env,
    },
    /// One block instance.
    Block {
        block: String,
        place: TokenStream,
        args: Vec<(String, Expr)>,
        decl: Env,
    },
    /// A list of block instances.
    List {
        block: String,
        place: TokenStream,
        args: Vec<(String, Expr)>,
        var: Option<String>,
        start: Expr,
        decl: Env,
    },
    /// A nested group.
    Group {
        tree: ParamTree,
        place: TokenStream,
        decl: Env,
    },
}

/// The translated kind of a value.
#[derive(Debug, Clone)]
pub(crate) enum Val {
    Static(SType),
    Tensor,
    Module(Box<Module>),
}

/// A name in scope: what it is, its Rust expression, and how it was used.
#[derive(Debug, Clone)]
pub(crate) struct Binding {
    pub val: Val,
    pub tokens: TokenStream,
    /// The Rust value is a `&Array` (an input), not an owned `Array`.
    pub is_ref: bool,
    pub used: Rc<Cell<bool>>,
    pub mutable: Rc<Cell<bool>>,
}

impl Binding {
    pub fn new(val: Val, tokens: TokenStream) -> Binding {
        Binding {
            val,
            tokens,
            is_ref: false,
            used: Rc::default(),
            mutable: Rc::default(),
        }
    }
}

/// Names in scope, innermost frame last.
#[derive(Debug, Clone, Default)]
pub(crate) struct Env {
    frames: Vec<HashMap<String, Binding>>,
}

impl Env {
    pub fn new() -> Env {
        Env {
            frames: vec![HashMap::new()],
        }
    }

    pub fn push(&mut self) {
        self.frames.push(HashMap::new());
    }

    pub fn pop(&mut self) {
        self.frames.pop();
    }

    pub fn bind(&mut self, name: &str, binding: Binding) {
        if let Some(frame) = self.frames.last_mut() {
            frame.insert(name.to_string(), binding);
        }
    }

    pub fn get(&self, name: &str) -> Option<&Binding> {
        self.frames.iter().rev().find_map(|f| f.get(name))
    }
}

/// A Rust expression with its precedence (10 = postfix or atom), so operands get parentheses
/// only where Rust needs them.
#[derive(Debug, Clone)]
pub(crate) struct S {
    pub ts: TokenStream,
    pub prec: u8,
    /// The value when the expression is a literal.
    pub lit: Option<f64>,
}

impl S {
    fn atom(ts: TokenStream) -> S {
        S {
            ts,
            prec: 10,
            lit: None,
        }
    }

    /// The expression, parenthesised when its precedence is below `min`.
    pub fn at(&self, min: u8) -> TokenStream {
        let ts = &self.ts;
        if self.prec < min {
            quote!((#ts))
        } else {
            ts.clone()
        }
    }
}

pub(crate) fn int_lit(i: i64) -> S {
    let lit = Literal::i64_unsuffixed(i.unsigned_abs() as i64);
    if i < 0 {
        S {
            ts: quote!(-#lit),
            prec: 9,
            lit: Some(i as f64),
        }
    } else {
        S {
            ts: quote!(#lit),
            prec: 10,
            lit: Some(i as f64),
        }
    }
}

pub(crate) fn float_lit(x: f64) -> S {
    let lit = Literal::f64_unsuffixed(x.abs());
    if x < 0.0 {
        S {
            ts: quote!(-#lit),
            prec: 9,
            lit: Some(x),
        }
    } else {
        S {
            ts: quote!(#lit),
            prec: 10,
            lit: Some(x),
        }
    }
}

/// A tensor expression: an `Array`, or a `&Array` when `is_ref`.
#[derive(Debug, Clone)]
pub(crate) struct T {
    pub ts: TokenStream,
    pub is_ref: bool,
    /// A plain local name (cheap to mention twice).
    pub simple: bool,
}

impl T {
    pub(crate) fn owned(ts: TokenStream) -> T {
        T {
            ts,
            is_ref: false,
            simple: false,
        }
    }

    /// The expression as a `&Array`.
    pub fn r(&self) -> TokenStream {
        let ts = &self.ts;
        if self.is_ref {
            ts.clone()
        } else {
            quote!(&#ts)
        }
    }
}

/// A translated expression.
#[derive(Debug, Clone)]
pub(crate) enum X {
    Static(S, SType),
    Tensor(T),
    Tuple(TokenStream, Vec<Val>, TupleForm),
    Module(Box<Module>),
}

/// A flag shared between a binding and the `let` that declares it (read, reassigned).
pub(crate) type Flag = Rc<Cell<bool>>;

/// One statement of a body being built; `let`s are rendered once the body's names are settled.
pub(crate) enum GenStmt {
    Let {
        names: Vec<(String, Flag, Flag)>,
        form: Option<TupleForm>,
        value: TokenStream,
        /// Left out when its single name is never read (size bindings).
        optional: bool,
    },
    Raw(TokenStream),
}

/// Renders statements, naming unread bindings `_name` and reassigned ones `mut name`.
pub(crate) fn render(stmts: Vec<GenStmt>) -> TokenStream {
    let mut out = TokenStream::new();
    for stmt in stmts {
        match stmt {
            GenStmt::Raw(ts) => out.extend(ts),
            GenStmt::Let {
                names,
                form,
                value,
                optional,
            } => {
                if optional && names.iter().all(|(_, used, _)| !used.get()) {
                    continue;
                }
                let pats: Vec<TokenStream> = names
                    .iter()
                    .map(|(name, used, mutable)| {
                        let id = if used.get() {
                            ident(name)
                        } else {
                            format_ident!("_{}", name)
                        };
                        if mutable.get() {
                            quote!(mut #id)
                        } else {
                            quote!(#id)
                        }
                    })
                    .collect();
                let pat = match form {
                    None => quote!(#(#pats)*),
                    Some(TupleForm::Array) => quote!([#(#pats),*]),
                    Some(TupleForm::Tuple) => quote!((#(#pats),*)),
                };
                out.extend(quote!(let #pat = #value;));
            }
        }
    }
    out
}

/// Linear layers a body applies to one input (`shared_input`): their calls, the layers' names
/// and places, and the names of their outputs once the group's product is emitted.
#[derive(Debug, Clone)]
pub(crate) struct Shared {
    calls: Vec<Span>,
    layers: Vec<String>,
    places: Vec<TokenStream>,
    outputs: Option<Vec<proc_macro2::Ident>>,
}

/// Where a body is translated: a block's method, the model's forward, or a step's loss.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Site {
    Block,
    Root,
    Step,
}

/// The translator of one function body.
pub(crate) struct Fx<'g, 'm> {
    pub g: &'g Gen<'m>,
    pub site: Site,
    pub env: Env,
    /// Statements of the body being built, innermost last.
    pub bodies: Vec<Vec<GenStmt>>,
    /// Whether the function reads `pass` (config, offset, attention, or blocks that need it).
    pub uses_pass: bool,
    /// Whether it needs `pass` mutably (attention, block calls).
    pub pass_mut: bool,
    /// Whether it reads the configuration.
    pub uses_config: bool,
    /// Whether it reads `pass.positions`.
    pub uses_offset: bool,
    /// Whether it attends.
    pub attends: bool,
    /// Whether it runs a recurrence (`ssd`, `causal_conv1d`), whose state the cache holds.
    pub recurs: bool,
    /// Whether it draws dropout masks (from `pass.ctx`'s key).
    pub drops: bool,
    /// Whether it applies a linear layer, whose adapter may draw dropout masks (`pass.linear`).
    pub linears: bool,
    /// Whether it applies a linear layer through `nn::linear_plus_in` (an activated or gated
    /// input, or a residual added), with `pass.ctx`.
    pub linear_plus: bool,
    /// Whether it applies linear layers to one input together (`pass.linears`).
    pub shares_input: bool,
    /// The groups of linear layers applied to one input in the bodies translated so far.
    pub shared: Vec<Shared>,
    /// Whether it applies a stacked experts layer, whose adapters may draw dropout masks
    /// (`pass.experts`).
    pub experts: bool,
    /// Whether it gives a buffer its next value (`pass.write_buffer`).
    pub writes: bool,
    /// In a step: the context its `forward(..)` calls share (one dropout key stream per step).
    pub step_ctx: Option<String>,
    /// In a step: its frozen models, each `.lmx` name with the Rust local of its parameters.
    pub frozen: Vec<(String, String)>,
    /// Names that cannot be used for temporaries.
    pub taken: Vec<String>,
    /// In a block: the span of its last expression where that is a call, which, a linear
    /// layer's, adds the forward pass's `residual` to its output ([`residual_tail`]).
    pub residual_tail: Option<Span>,
    /// Whether the block's last call took `residual`.
    pub takes_residual: bool,
    /// The residual of the block call being lowered (`x + block(..)`), taken by that call.
    pub pending_residual: Option<TokenStream>,
}

/// The span of `body`'s last expression where it is a call: a linear layer's call there can add
/// a residual to its output as it writes it (`nn::linear_plus_in`).
pub(crate) fn residual_tail(body: &crate::ast::Body) -> Option<Span> {
    match &body.stmts.last()?.kind {
        StmtKind::Expr(e) if matches!(e.kind, ExprKind::Call(..)) => Some(e.span),
        _ => None,
    }
}

impl<'g, 'm> Fx<'g, 'm> {
    pub fn new(g: &'g Gen<'m>, site: Site, env: Env) -> Self {
        Fx {
            g,
            site,
            env,
            bodies: vec![Vec::new()],
            uses_pass: false,
            pass_mut: false,
            uses_config: false,
            uses_offset: false,
            attends: false,
            recurs: false,
            drops: false,
            linears: false,
            linear_plus: false,
            shares_input: false,
            shared: Vec::new(),
            experts: false,
            writes: false,
            step_ctx: None,
            frozen: Vec::new(),
            taken: g.taken.clone(),
            residual_tail: None,
            takes_residual: false,
            pending_residual: None,
        }
    }

    fn emit(&mut self, stmt: GenStmt) {
        if let Some(body) = self.bodies.last_mut() {
            body.push(stmt);
        }
    }

    /// A fresh name for a temporary: `base` itself while it is free, then `base2`, `base3`, ...
    pub(crate) fn temp(&mut self, base: &str) -> String {
        let name = std::iter::once(base.to_string())
            .chain((2..).map(|n| format!("{base}{n}")))
            .find(|name| !self.taken.contains(name))
            .expect("an unbounded sequence of names has a free one");
        self.taken.push(name.clone());
        name
    }

    fn lookup(&mut self, name: &str, span: Span) -> R<Binding> {
        let b = self
            .env
            .get(name)
            .cloned()
            .ok_or_else(|| unsupported(span, &format!("the name `{name}` in this position")))?;
        b.used.set(true);
        if b.tokens.to_string().starts_with("config") {
            self.uses_config = true;
        }
        Ok(b)
    }

    fn config_place(&mut self) -> TokenStream {
        self.uses_config = true;
        quote!(config)
    }

    /// Where positions start (`&nn::Positions`): after the KV cache's filled slots.
    pub(crate) fn positions(&mut self) -> TokenStream {
        self.uses_pass = true;
        self.uses_offset = true;
        quote!(&pass.positions)
    }

    /// The position of the call's first token, an int32 scalar (`&Array`).
    pub(crate) fn offset(&mut self) -> TokenStream {
        self.uses_pass = true;
        self.uses_offset = true;
        quote!(&pass.positions.offset)
    }

    /// Binds a function's tensor inputs and their size symbols; returns the prelude (copies of
    /// inputs the body reassigns, sizes) and the signature's input parameters.
    pub fn inputs(&mut self, f: &crate::ast::Forward) -> R<(TokenStream, Vec<TokenStream>)> {
        let inputs: Vec<(String, Vec<Expr>)> = f
            .inputs
            .iter()
            .map(|i| (i.name.name.clone(), i.ty.shape.clone()))
            .collect();
        self.inputs_of(&inputs, &f.body)
    }

    /// [`Fx::inputs`] for named inputs with shapes.
    pub fn inputs_of(
        &mut self,
        inputs: &[(String, Vec<Expr>)],
        body: &Body,
    ) -> R<(TokenStream, Vec<TokenStream>)> {
        let mut assigned = Vec::new();
        assigned_names(body, &mut assigned);
        let mut sig = Vec::new();
        let mut prelude = TokenStream::new();
        for (name, _) in inputs {
            let id = ident(name);
            sig.push(quote!(#id: &Array));
            let mut b = Binding::new(Val::Tensor, quote!(#id));
            if assigned.contains(name) {
                b.mutable.set(true);
                prelude.extend(quote!(let mut #id = #id.clone();));
            } else {
                b.is_ref = true;
            }
            self.env.bind(name, b);
        }
        for (name, shape) in inputs {
            let id = ident(name);
            for (axis, dim) in shape.iter().enumerate() {
                let ExprKind::Name(sym) = &dim.kind else {
                    continue;
                };
                if !sym.chars().next().is_some_and(char::is_uppercase)
                    || self.env.get(sym).is_some()
                {
                    continue;
                }
                let local = {
                    let lower = snake(sym);
                    if self.taken.contains(&lower) {
                        self.temp(&format!("{lower}_len"))
                    } else {
                        self.taken.push(lower.clone());
                        lower
                    }
                };
                let b = Binding::new(
                    Val::Static(SType::Int),
                    ident(&local).into_token_stream_plain(),
                );
                let axis = Literal::usize_unsuffixed(axis);
                self.emit(GenStmt::Let {
                    names: vec![(local, b.used.clone(), b.mutable.clone())],
                    form: None,
                    value: quote!(i64::from(#id.dim(#axis))),
                    optional: true,
                });
                self.env.bind(sym, b);
            }
        }
        Ok((prelude, sig))
    }

    /// A translated value as an owned `Array` expression (a function's result).
    pub fn owned_tensor(&mut self, x: X, span: Span) -> R<TokenStream> {
        let t = self.tensor(x, span)?;
        Ok(if t.is_ref { owned(t) } else { t.ts })
    }

    /// A function's `Ok(value)`, or the call itself when it already returns the runtime's
    /// `Result` (`nn::f(..)?`, `layer.forward(..)?`, `pass.attend(..)?`, `pass.dropout(..)?`).
    pub fn ok(&self, value: TokenStream) -> TokenStream {
        use proc_macro2::{Delimiter, TokenTree};
        let tokens: Vec<TokenTree> = value.clone().into_iter().collect();
        let n = tokens.len();
        let single_call = n >= 3
            && matches!(&tokens[n - 1], TokenTree::Punct(p) if p.as_char() == '?')
            && matches!(&tokens[n - 2], TokenTree::Group(g) if g.delimiter() == Delimiter::Parenthesis)
            && tokens[..n - 2].iter().all(|t| {
                !matches!(t, TokenTree::Group(_))
                    && !matches!(t, TokenTree::Punct(p) if p.as_char() == '?')
            });
        let runtime = match (&tokens.first(), &tokens.get(n.wrapping_sub(3))) {
            (Some(TokenTree::Ident(first)), _) if first == "nn" => true,
            (_, Some(TokenTree::Ident(last))) => {
                last == "forward" || last == "attend" || last == "dropout" || last == "linear"
            }
            _ => false,
        };
        if single_call && runtime {
            tokens[..n - 1].iter().cloned().collect()
        } else {
            quote!(Ok(#value))
        }
    }

    // ---------------------------------------------------------------- statements

    /// Translates `body` in a new scope; returns its statements and the translated tail.
    pub fn body(&mut self, body: &Body) -> R<(TokenStream, Option<X>)> {
        self.env.push();
        self.bodies.push(Vec::new());
        let result = self.stmts(body);
        let stmts = self.bodies.pop().unwrap_or_default();
        self.env.pop();
        let tail = result?;
        Ok((render(stmts), tail))
    }

    /// Translates the statements of `body` into the current scope; returns the tail value.
    pub fn stmts(&mut self, body: &Body) -> R<Option<X>> {
        if self.site != Site::Step {
            self.find_shared_inputs(body);
        }
        let last = body.stmts.len().saturating_sub(1);
        let mut tail = None;
        for (i, stmt) in body.stmts.iter().enumerate() {
            match &stmt.kind {
                StmtKind::Expr(e) if i == last && has_value(e) => tail = Some(self.expr(e)?),
                _ => self.stmt(stmt)?,
            }
        }
        Ok(tail)
    }

    pub fn stmt(&mut self, stmt: &crate::ast::Stmt) -> R<()> {
        match &stmt.kind {
            StmtKind::Let(names, value) => {
                // `let lo, hi = [0, 2]`: one binding per item.
                if let ExprKind::List(items) = &value.kind {
                    if items.len() == names.len() && names.len() > 1 {
                        for (name, item) in names.iter().zip(items) {
                            let x = self.expr(item)?;
                            self.let_names(vec![name.name.as_str()], x, stmt.span)?;
                        }
                        return Ok(());
                    }
                }
                let x = self.expr(value)?;
                self.let_names(
                    names.iter().map(|n| n.name.as_str()).collect(),
                    x,
                    stmt.span,
                )
            }
            StmtKind::Assign(name, value) => {
                let x = self.expr(value)?;
                let b = self
                    .env
                    .get(&name.name)
                    .cloned()
                    .ok_or_else(|| unsupported(name.span, "assigning this name"))?;
                b.mutable.set(true);
                let target = ident(&name.name);
                let value = match (&b.val, x) {
                    (Val::Tensor, x) => self.tensor(x, name.span)?.ts,
                    (Val::Static(ty), X::Static(s, from)) => convert(&s, &from, ty),
                    _ => return Err(unsupported(stmt.span, "this assignment")),
                };
                self.emit(GenStmt::Raw(quote!(#target = #value;)));
                Ok(())
            }
            StmtKind::For(vars, range, body) => self.for_loop(vars, range, body),
            StmtKind::Expr(e) => {
                if let ExprKind::If(cond, then, otherwise) = &e.kind {
                    let ts = self.if_stmt(cond, then, otherwise.as_ref())?;
                    self.emit(GenStmt::Raw(ts));
                    return Ok(());
                }
                let x = self.expr(e)?;
                if let X::Tensor(t) = x {
                    let ts = t.ts;
                    self.emit(GenStmt::Raw(quote!(#ts;)));
                }
                Ok(())
            }
            StmtKind::Next(target, value) => {
                // The buffer's place in the parameters (the checker found it a buffer of this
                // pass's own), whose address keys the write.
                let place = match self.expr(target)? {
                    X::Tensor(t) => t.r(),
                    _ => return Err(unsupported(target.span, "this buffer")),
                };
                let value = self.tensor_expr(value)?.r();
                self.uses_pass = true;
                self.pass_mut = true;
                self.writes = true;
                self.emit(GenStmt::Raw(quote!(pass.write_buffer(#place, #value)?;)));
                Ok(())
            }
            StmtKind::While(..) => Err(unsupported(stmt.span, "`while`")),
            StmtKind::Optimizer(_)
            | StmtKind::Accumulate(_)
            | StmtKind::Update(_)
            | StmtKind::Metrics(_)
            | StmtKind::Frozen(..) => Ok(()),
        }
    }

    /// Records the groups of linear layers `body` applies to one input (`shared_input`).
    fn find_shared_inputs(&mut self, body: &Body) {
        let mut kind = |call: &Call| {
            let Call { callee, args, span } = *call;
            if let Some(call) = self.g.model.typed.call(span) {
                return if call.builtin.name == "dropout" {
                    CallKind::Barrier
                } else {
                    CallKind::Pure
                };
            }
            let Some(Val::Module(module)) =
                callee.and_then(|name| self.env.get(name)).map(|b| &b.val)
            else {
                return CallKind::Barrier;
            };
            // A name the checker let a linear layer read is a tensor, bound before the body or
            // in it.
            let one_name = matches!(
                args,
                [Arg {
                    name: None,
                    value: Expr {
                        kind: ExprKind::Name(_),
                        ..
                    },
                }]
            );
            match (&**module, one_name) {
                (
                    Module::Layer {
                        kind: LayerKind::Linear,
                        tied: false,
                        ..
                    },
                    true,
                ) => CallKind::Linear,
                // Norms and embeddings draw nothing.
                (
                    Module::Layer {
                        kind: LayerKind::RmsNorm | LayerKind::LayerNorm | LayerKind::Embedding,
                        ..
                    },
                    _,
                ) => CallKind::Pure,
                _ => CallKind::Barrier,
            }
        };
        let groups = shared_input::groups(body, &mut kind);
        for group in groups {
            let places = group
                .iter()
                .map(|member| match self.env.get(&member.layer).map(|b| &b.val) {
                    Some(Val::Module(module)) => match &**module {
                        Module::Layer { place, .. } => Some(place.clone()),
                        _ => None,
                    },
                    _ => None,
                })
                .collect::<Option<Vec<_>>>();
            if let Some(places) = places {
                self.shared.push(Shared {
                    calls: group.iter().map(|member| member.call).collect(),
                    layers: group.iter().map(|member| member.layer.clone()).collect(),
                    places,
                    outputs: None,
                });
            }
        }
    }

    /// The output of the linear layer called at `span` when it is a member of a group: the
    /// group's product is emitted at its first member met, over `input`.
    fn shared_output(&mut self, span: Span, input: &T) -> Option<X> {
        let group = self.shared.iter().position(|g| g.calls.contains(&span))?;
        let index = self.shared[group].calls.iter().position(|&c| c == span)?;
        if self.shared[group].outputs.is_none() {
            let bases: Vec<String> = self.shared[group]
                .layers
                .iter()
                .map(|layer| format!("{}_out", snake(layer)))
                .collect();
            let outputs: Vec<proc_macro2::Ident> =
                bases.iter().map(|base| ident(&self.temp(base))).collect();
            let places = &self.shared[group].places;
            let x = input.r();
            self.emit(GenStmt::Raw(
                quote!(let [#(#outputs),*] = pass.linears([#(&#places),*], #x)?;),
            ));
            self.uses_pass = true;
            self.pass_mut = true;
            self.shares_input = true;
            self.shared[group].outputs = Some(outputs);
        }
        let output = self.shared[group].outputs.as_ref()?[index].clone();
        Some(X::Tensor(T::owned(quote!(#output))))
    }

    /// Binds `names` to `x` with a `let`.
    pub fn let_names(&mut self, names: Vec<&str>, x: X, span: Span) -> R<()> {
        let (value, vals, form) = match x {
            X::Static(s, ty) => (s.ts, vec![Val::Static(ty)], None),
            X::Tensor(t) => {
                let ts = if t.is_ref {
                    let ts = t.ts;
                    quote!(#ts.clone())
                } else {
                    t.ts
                };
                (ts, vec![Val::Tensor], None)
            }
            X::Tuple(ts, vals, form) => (ts, vals, Some(form)),
            X::Module(m) => {
                // A module alias: no Rust binding, the name refers to the same parameters.
                if let [name] = names.as_slice() {
                    self.env
                        .bind(name, Binding::new(Val::Module(m), TokenStream::new()));
                    return Ok(());
                }
                return Err(unsupported(span, "binding a module to several names"));
            }
        };
        if vals.len() != names.len() {
            return Err(unsupported(span, "this destructuring"));
        }
        let mut pats = Vec::new();
        for (name, val) in names.iter().zip(vals) {
            let b = Binding::new(val, ident(name).into_token_stream_plain());
            pats.push((name.to_string(), b.used.clone(), b.mutable.clone()));
            self.env.bind(name, b);
        }
        let form = if pats.len() == 1 { None } else { form };
        self.emit(GenStmt::Let {
            names: pats,
            form,
            value,
            optional: false,
        });
        Ok(())
    }

    fn if_stmt(&mut self, cond: &Expr, then: &Body, otherwise: Option<&Body>) -> R<TokenStream> {
        let c = self.static_expr(cond)?;
        let c = c.0.ts;
        let (then_ts, then_tail) = self.body(then)?;
        let then_tail = self.discard(then_tail)?;
        let else_ts = match otherwise {
            Some(b) => {
                let (ts, tail) = self.body(b)?;
                let tail = self.discard(tail)?;
                quote!(else { #ts #tail })
            }
            None => TokenStream::new(),
        };
        Ok(quote!(if #c { #then_ts #then_tail } #else_ts))
    }

    /// A tail value in statement position: its side effects only.
    fn discard(&mut self, tail: Option<X>) -> R<TokenStream> {
        Ok(match tail {
            Some(X::Tensor(t)) if !t.simple => {
                let ts = t.ts;
                quote!(#ts;)
            }
            _ => TokenStream::new(),
        })
    }

    fn for_loop(
        &mut self,
        vars: &[crate::ast::Ident],
        range: &crate::ast::Range,
        body: &Body,
    ) -> R<()> {
        if let Some(end) = &range.end {
            let (start, _) = self.static_expr(&range.start)?;
            let (end, _) = self.static_expr(end)?;
            let [var] = vars else {
                return Err(unsupported(range.span, "several variables over a range"));
            };
            self.env.push();
            let b = Binding::new(
                Val::Static(SType::Int),
                ident(&var.name).into_token_stream_plain(),
            );
            let used = b.used.clone();
            self.env.bind(&var.name, b);
            let result = self.body(body);
            self.env.pop();
            let (ts, tail) = result?;
            let tail = self.discard(tail)?;
            let var_id = if used.get() {
                ident(&var.name)
            } else {
                format_ident!("_{}", var.name)
            };
            let (start, end) = (start.at(7), end.at(7));
            self.emit(GenStmt::Raw(
                quote!(for #var_id in #start..#end { #ts #tail }),
            ));
            return Ok(());
        }
        let list = match self.expr(&range.start)? {
            X::Module(m) => *m,
            _ => return Err(unsupported(range.span, "a loop over this value")),
        };
        let Module::List {
            block,
            place,
            args,
            var,
            start,
            decl,
        } = list
        else {
            return Err(unsupported(range.span, "a loop over this value"));
        };
        let (index_name, elem) = match vars {
            [elem] => (None, &elem.name),
            [index, elem] => (Some(index.name.clone()), &elem.name),
            _ => return Err(unsupported(range.span, "this loop pattern")),
        };
        let index_name = match (&index_name, &var) {
            (Some(n), _) => Some(n.clone()),
            (None, Some(_)) => Some(self.temp(&format!("{}_index", snake(elem)))),
            (None, None) => None,
        };
        self.env.push();
        let mut index_used = None;
        let mut decl = decl;
        if let Some(index) = &index_name {
            let b = Binding::new(
                Val::Static(SType::Int),
                ident(index).into_token_stream_plain(),
            );
            index_used = Some(b.used.clone());
            if vars.len() == 2 {
                self.env.bind(index, b.clone());
            }
            if let Some(v) = &var {
                // The list's element variable counts from the list's start.
                let offset = self.static_in(&start, &decl.clone())?;
                let index_id = ident(index);
                let tokens = if offset.0.lit == Some(0.0) {
                    quote!(#index_id)
                } else {
                    let o = offset.0.at(7);
                    quote!((#o + #index_id))
                };
                decl.push();
                decl.bind(
                    v,
                    Binding {
                        used: b.used.clone(),
                        ..Binding::new(Val::Static(SType::Int), tokens)
                    },
                );
            }
        }
        let elem_binding = Binding::new(
            Val::Module(Box::new(Module::Block {
                block,
                place: ident(elem).into_token_stream_plain(),
                args,
                decl,
            })),
            ident(elem).into_token_stream_plain(),
        );
        let elem_used = elem_binding.used.clone();
        self.env.bind(elem, elem_binding);
        let result = self.body(body);
        self.env.pop();
        let (ts, tail) = result?;
        let tail = self.discard(tail)?;
        let elem_id = if elem_used.get() {
            ident(elem)
        } else {
            format_ident!("_{}", elem)
        };
        let header = match (index_name, index_used) {
            (Some(index), Some(used)) if used.get() => {
                let index_id = ident(&index);
                quote!((#index_id, #elem_id) in (0_i64..).zip(&#place))
            }
            _ => quote!(#elem_id in &#place),
        };
        self.emit(GenStmt::Raw(quote!(for #header { #ts #tail })));
        Ok(())
    }

    // ---------------------------------------------------------------- expressions

    /// A static expression and its type.
    pub fn static_expr(&mut self, e: &Expr) -> R<(S, SType)> {
        match self.expr(e)? {
            X::Static(s, ty) => Ok((s, ty)),
            _ => Err(unsupported(
                e.span,
                "a tensor where a static value is needed",
            )),
        }
    }

    /// A static expression evaluated in another environment (where a parameter was declared).
    pub fn static_in(&mut self, e: &Expr, env: &Env) -> R<(S, SType)> {
        let saved = std::mem::replace(&mut self.env, env.clone());
        let result = self.static_expr(e);
        self.env = saved;
        result
    }

    /// A static expression as `i32` (sizes, axes).
    pub fn i32_expr(&mut self, e: &Expr) -> R<TokenStream> {
        let (s, ty) = self.static_expr(e)?;
        Ok(cast(&s, &ty, "i32"))
    }

    /// A static expression as `f32` (a layer's float argument).
    pub fn f32_expr(&mut self, e: &Expr) -> R<TokenStream> {
        let (s, ty) = self.static_expr(e)?;
        Ok(cast(&s, &ty, "f32"))
    }

    /// A tensor from a translated expression (statics become scalars of float32).
    pub(crate) fn tensor(&mut self, x: X, span: Span) -> R<T> {
        match x {
            X::Tensor(t) => Ok(t),
            X::Static(s, ty) => {
                let v = cast(&s, &ty, "f32");
                Ok(T::owned(quote!(Array::from_f32(#v))))
            }
            _ => Err(unsupported(span, "this value as a tensor")),
        }
    }

    fn tensor_expr(&mut self, e: &Expr) -> R<T> {
        let x = self.expr(e)?;
        self.tensor(x, e.span)
    }

    /// `t` as a simple name, hoisting it into a `let` when it is a larger expression.
    pub(crate) fn hoist(&mut self, t: T, base: &str) -> T {
        if t.simple {
            return t;
        }
        let name = self.temp(base);
        let id = ident(&name);
        let value = t.ts;
        self.emit(GenStmt::Raw(quote!(let #id = #value;)));
        T {
            ts: quote!(#id),
            is_ref: t.is_ref,
            simple: true,
        }
    }

    /// A static operand as a scalar array with the precision of `like`.
    fn scalar_like(&mut self, s: &S, ty: &SType, like: &T) -> T {
        let v = cast(s, ty, "f64");
        let r = like.r();
        T::owned(quote!(nn::literal(#v, #r)?))
    }

    pub fn expr(&mut self, e: &Expr) -> R<X> {
        match &e.kind {
            ExprKind::Int(i) => Ok(X::Static(int_lit(*i), SType::Int)),
            ExprKind::Float(x) => Ok(X::Static(float_lit(*x), SType::Float)),
            ExprKind::Bool(b) => Ok(X::Static(S::atom(quote!(#b)), SType::Bool)),
            ExprKind::Str(s) => Ok(X::Static(S::atom(quote!(#s)), SType::Str)),
            ExprKind::Name(n) => {
                if self.env.get(n).is_none() {
                    if let Some((ty, variant)) = self.g.variant(n) {
                        return Ok(X::Static(S::atom(variant), SType::Enum(ty)));
                    }
                }
                let b = self.lookup(n, e.span)?;
                Ok(match b.val {
                    Val::Static(ty) => X::Static(S::atom(b.tokens), ty),
                    Val::Tensor => X::Tensor(T {
                        ts: b.tokens,
                        is_ref: b.is_ref,
                        simple: true,
                    }),
                    Val::Module(m) => X::Module(m),
                })
            }
            ExprKind::List(_) => Err(unsupported(e.span, "a list outside a shape")),
            ExprKind::Unary(op, inner) => match (op, self.expr(inner)?) {
                (UnaryOp::Neg, X::Static(s, ty)) => {
                    let inner = s.at(9);
                    Ok(X::Static(
                        S {
                            ts: quote!(-#inner),
                            prec: 9,
                            lit: s.lit.map(|x| -x),
                        },
                        ty,
                    ))
                }
                (UnaryOp::Not, X::Static(s, ty)) => {
                    let inner = s.at(9);
                    Ok(X::Static(
                        S {
                            ts: quote!(!#inner),
                            prec: 9,
                            lit: None,
                        },
                        ty,
                    ))
                }
                (UnaryOp::Neg, X::Tensor(t)) => {
                    let ts = t.ts;
                    Ok(X::Tensor(T::owned(quote!(#ts.negative()?))))
                }
                _ => Err(unsupported(e.span, "this operator")),
            },
            ExprKind::Binary(op, _, a, b) => self.binary(*op, a, b, e.span),
            ExprKind::Call(callee, args) => self.call(callee, args, e.span),
            ExprKind::Member(target, field) => self.member(target, field, e.span),
            ExprKind::Index(target, subs) => self.index(target, subs, e.span),
            ExprKind::If(cond, then, otherwise) => {
                let (c, _) = self.static_expr(cond)?;
                let c = c.ts;
                let Some(otherwise) = otherwise else {
                    return Err(unsupported(e.span, "an `if` value without `else`"));
                };
                let (then_ts, then_tail) = self.body(then)?;
                let (else_ts, else_tail) = self.body(otherwise)?;
                let (Some(a), Some(b)) = (then_tail, else_tail) else {
                    return Err(unsupported(e.span, "an `if` branch without a value"));
                };
                match (a, b) {
                    (X::Static(sa, ta), X::Static(sb, tb)) => {
                        let ty = if ta == SType::Float || tb == SType::Float {
                            SType::Float
                        } else {
                            ta.clone()
                        };
                        let (a, b) = (convert(&sa, &ta, &ty), convert(&sb, &tb, &ty));
                        Ok(X::Static(
                            S {
                                ts: quote!(if #c { #then_ts #a } else { #else_ts #b }),
                                prec: 10,
                                lit: None,
                            },
                            ty,
                        ))
                    }
                    (a, b) => {
                        let a = self.tensor(a, then.span)?;
                        let b = self.tensor(b, otherwise.span)?;
                        let (a, b) = (owned(a), owned(b));
                        Ok(X::Tensor(T::owned(
                            quote!(if #c { #then_ts #a } else { #else_ts #b }),
                        )))
                    }
                }
            }
        }
    }

    /// `group.entry`: a module of a parameter group, or one of its raw tensors. (Apart from
    /// `expr`, whose frame every level of a deeply nested expression pays for.)
    #[inline(never)]
    fn member(&mut self, target: &Expr, field: &crate::ast::Ident, span: Span) -> R<X> {
        match self.expr(target)? {
            X::Module(m) => match *m {
                Module::Group { tree, place, decl } => {
                    let idx = tree
                        .entries
                        .iter()
                        .position(|en| en.name == field.name)
                        .ok_or_else(|| unsupported(field.span, "this member"))?;
                    let fields = super::field_names(&tree);
                    let f = &fields[idx];
                    let entry = &tree.entries[idx];
                    let place = if entry.guard.is_some() {
                        guarded(quote!(#place.#f), &entry.name)
                    } else {
                        quote!(#place.#f)
                    };
                    // A raw tensor of a group (`conv1d.weight`): the leaf itself.
                    if matches!(entry.node, ParamNode::Tensor { .. }) {
                        return Ok(X::Tensor(T {
                            ts: place,
                            is_ref: false,
                            simple: true,
                        }));
                    }
                    Ok(X::Module(Box::new(
                        self.g.module(entry, place, &decl, span)?,
                    )))
                }
                // A projection of an `experts` layer: a group of its stacked `weight`.
                Module::Layer {
                    kind: LayerKind::Experts,
                    place,
                    decl,
                    ..
                } => {
                    let f = format_ident!("{}", field.name);
                    let weight = crate::ir::ParamEntry {
                        name: "weight".to_owned(),
                        guard: None,
                        marks: crate::ir::Marks::default(),
                        node: ParamNode::Tensor {
                            shape: Vec::new(),
                            init: crate::ir::Init {
                                name: "uniform".to_owned(),
                                args: Vec::new(),
                            },
                            buffer: false,
                        },
                    };
                    Ok(X::Module(Box::new(Module::Group {
                        tree: ParamTree {
                            entries: vec![weight],
                        },
                        place: quote!(#place.#f),
                        decl,
                    })))
                }
                _ => Err(unsupported(span, "this member access")),
            },
            _ => Err(unsupported(span, "this member access")),
        }
    }

    fn binary(&mut self, op: BinaryOp, a: &Expr, b: &Expr, span: Span) -> R<X> {
        if op == BinaryOp::Mul {
            if let Some(x) = self.gated_product(a, b, span)? {
                return Ok(x);
            }
        }
        if op == BinaryOp::Add && self.site != Site::Step {
            if let Some(x) = self.residual_sum(a, b)? {
                return Ok(x);
            }
        }
        let xa = self.expr(a)?;
        let xb = self.expr(b)?;
        self.binary_values(op, xa, xb, span)
    }

    /// `silu(gate) * up` or `up * silu(gate)`, `silu` the built-in, as one gated product
    /// (`nn::swiglu`, which picks lmx's kernels or the two operations at run time). `None` for
    /// any other product. A static `up` takes the two operations.
    fn gated_product(&mut self, a: &Expr, b: &Expr, span: Span) -> R<Option<X>> {
        let Some((activation, gate, up)) = self.gate_and_up(a, b, |f| f == "Silu")? else {
            return Ok(None);
        };
        self.gated_value(activation, gate, up, span).map(Some)
    }

    /// The `nn::Activation` variant and the factors of `f(gate) * up` or `up * f(gate)`, `f` a
    /// built-in activation ([`ACTIVATIONS`]) whose variant `wanted` accepts, each factor bound
    /// before the next is lowered, so that what they draw from the step's key (an adapter's
    /// dropout) they draw in the order written. `None` for any other product.
    fn gate_and_up(
        &mut self,
        a: &Expr,
        b: &Expr,
        wanted: impl Fn(&str) -> bool,
    ) -> R<Option<(&'static str, T, X)>> {
        let typed = &self.g.model.typed;
        let gate_of = |e| activation_input(typed, e).filter(|(f, _)| wanted(f));
        Ok(Some(match (gate_of(a), gate_of(b)) {
            (Some((activation, gate)), _) => {
                let gate = self.tensor_expr(gate)?;
                let gate = self.hoist(gate, "gate");
                (activation, gate, self.expr(b)?)
            }
            (None, Some((activation, gate))) => {
                let up = match self.expr(a)? {
                    X::Tensor(up) => X::Tensor(self.hoist(up, "value")),
                    up => up,
                };
                (activation, self.tensor_expr(gate)?, up)
            }
            (None, None) => return Ok(None),
        }))
    }

    /// `f(gate) * up` of lowered factors, `f` the `nn::Activation` variant `activation`: one
    /// gated product (`nn::swiglu`) for SiLU over a tensor `up`, else the activation, then the
    /// product.
    fn gated_value(&mut self, activation: &str, gate: T, up: X, span: Span) -> R<X> {
        let gate = gate.r();
        match (activation, up) {
            ("Silu", X::Tensor(up)) => {
                let up = up.r();
                Ok(X::Tensor(T::owned(quote!(nn::swiglu(#gate, #up)?))))
            }
            (activation, up) => {
                let activated = match activation {
                    "Silu" => quote!(nn::silu(#gate)?),
                    other => {
                        let other = format_ident!("{}", other);
                        quote!(nn::Activation::#other.of(#gate)?)
                    }
                };
                self.binary_values(BinaryOp::Mul, X::Tensor(T::owned(activated)), up, span)
            }
        }
    }

    /// A linear layer at `place` of `f(x)`, `f` a built-in activation ([`ACTIVATIONS`]), or of
    /// `silu(gate) * up`, as one call that activates the layer's input as it reads it in
    /// decoding (`nn::activated_linear_in`, `nn::gated_linear_in`); through the pass, as
    /// `pass.linear`. `Err(input)` with the layer's input lowered for any other input (and for a
    /// static `up`, whose product is two operations).
    fn activated_linear(&mut self, place: &TokenStream, x: &Expr, span: Span) -> R<Result<X, T>> {
        let typed = &self.g.model.typed;
        let input = match &x.kind {
            ExprKind::Binary(BinaryOp::Mul, _, a, b) => match self.gate_and_up(a, b, |_| true)? {
                Some((activation, gate, X::Tensor(up))) => {
                    let up = self.hoist(up, "up");
                    let (gate, up) = (gate.r(), up.r());
                    let activation = format_ident!("{}", activation);
                    quote!(nn::LayerInput::Gated(nn::Activation::#activation, #gate, #up))
                }
                Some((activation, gate, up)) => {
                    let product = self.gated_value(activation, gate, up, span)?;
                    return Ok(Err(self.tensor(product, x.span)?));
                }
                None => return Ok(Err(self.tensor_expr(x)?)),
            },
            _ => match activation_input(typed, x) {
                Some((activation, input)) => {
                    let input = self.tensor_expr(input)?;
                    let input = self.hoist(input, "activated").r();
                    let activation = format_ident!("{}", activation);
                    quote!(nn::LayerInput::Activated(nn::Activation::#activation, #input))
                }
                None => return Ok(Err(self.tensor_expr(x)?)),
            },
        };
        let residual = self.residual_at(span).unwrap_or(quote!(None));
        self.uses_pass = true;
        self.pass_mut = true;
        self.linear_plus = true;
        Ok(Ok(X::Tensor(T::owned(
            quote!(nn::linear_plus_in(&#place, #input, #residual, pass.ctx)?),
        ))))
    }

    /// `residual` where the call at `span` is the block's last expression, which then takes
    /// the forward pass's residual.
    fn residual_at(&mut self, span: Span) -> Option<TokenStream> {
        (self.residual_tail == Some(span)).then(|| {
            self.takes_residual = true;
            quote!(residual)
        })
    }

    /// `x + block(..)` or `block(..) + x`, `x` a tensor variable and `block` one whose last call
    /// is a linear layer, the block's output possibly through dropout (`x + dropout(block(..),
    /// p)`): the block call with `x` (and `p`) as its residual, which that layer adds as it writes
    /// its output (one launch in decoding). `None` for any other sum.
    fn residual_sum(&mut self, a: &Expr, b: &Expr) -> R<Option<X>> {
        let is_tensor_name = |fx: &Self, e: &Expr| match &e.kind {
            ExprKind::Name(name) => {
                matches!(fx.env.get(name).map(|b| &b.val), Some(Val::Tensor))
            }
            _ => false,
        };
        for (x, other) in [(a, b), (b, a)] {
            if is_tensor_name(self, x) {
                if let Some(found) = self.residual_call(other) {
                    return self.residual_sum_of(x, found).map(Some);
                }
            }
        }
        Ok(None)
    }

    /// The block call `call` with `x` as its residual, `dropout`'s probability applied to the
    /// block's output first.
    fn residual_sum_of(&mut self, x: &Expr, (call, dropout): (&Expr, Option<&Expr>)) -> R<X> {
        let residual = self.tensor_expr(x)?.r();
        let p = match dropout {
            Some(p) => {
                let (s, ty) = self.static_expr(p)?;
                cast(&s, &ty, "f32")
            }
            None => quote!(0.0),
        };
        self.pending_residual = Some(quote!(Some(nn::Residual::new(#residual, #p))));
        let sum = self.expr(call)?;
        self.pending_residual = None;
        Ok(sum)
    }

    /// `e` as a call of a block that takes a residual, with the dropout probability applied to
    /// its output where `e` is `dropout(call, p)`.
    fn residual_call<'e>(&self, e: &'e Expr) -> Option<(&'e Expr, Option<&'e Expr>)> {
        let ExprKind::Call(callee, args) = &e.kind else {
            return None;
        };
        if let Some(call) = self.g.model.typed.call(e.span) {
            if call.builtin.name != "dropout" {
                return None;
            }
            let inner = self.arg(args, 0, "x")?;
            let p = self.arg(args, 1, "p")?;
            return self
                .residual_call(inner)
                .filter(|(_, dropout)| dropout.is_none())
                .map(|(call, _)| (call, Some(p)));
        }
        let ExprKind::Name(name) = &callee.kind else {
            return None;
        };
        match self.env.get(name).map(|b| &b.val) {
            Some(Val::Module(module)) => match &**module {
                Module::Block { block, .. } if self.g.block_info(block).takes_residual => {
                    Some((e, None))
                }
                _ => None,
            },
            _ => None,
        }
    }

    /// `op` of two lowered operands.
    fn binary_values(&mut self, op: BinaryOp, xa: X, xb: X, span: Span) -> R<X> {
        match (xa, xb) {
            (X::Static(sa, ta), X::Static(sb, tb)) => static_binary(op, sa, ta, sb, tb, span),
            (xa, xb) => {
                let method = match op {
                    BinaryOp::Add => "add",
                    BinaryOp::Sub => "subtract",
                    BinaryOp::Mul => "multiply",
                    BinaryOp::Div => "divide",
                    BinaryOp::Rem => "remainder",
                    BinaryOp::Pow => "power",
                    BinaryOp::MatMul => "matmul",
                    BinaryOp::Eq => "eq",
                    BinaryOp::Ne => "ne",
                    BinaryOp::Lt => "lt",
                    BinaryOp::Le => "le",
                    BinaryOp::Gt => "gt",
                    BinaryOp::Ge => "ge",
                    BinaryOp::And | BinaryOp::Or => {
                        return Err(unsupported(span, "`and`/`or` on tensors"))
                    }
                };
                let method = format_ident!("{}", method);
                let (ta, tb) = self.operands(xa, xb, span)?;
                let (recv, arg) = (ta.ts, tb.r());
                Ok(X::Tensor(T::owned(quote!(#recv.#method(#arg)?))))
            }
        }
    }

    /// Two operands as tensors, a static one taking the other's precision.
    fn operands(&mut self, xa: X, xb: X, span: Span) -> R<(T, T)> {
        Ok(match (xa, xb) {
            (X::Tensor(ta), X::Static(s, ty)) => {
                let ta = self.hoist(ta, "value");
                let tb = self.scalar_like(&s, &ty, &ta);
                (ta, tb)
            }
            (X::Static(s, ty), X::Tensor(tb)) => {
                let tb = self.hoist(tb, "value");
                let ta = self.scalar_like(&s, &ty, &tb);
                (ta, tb)
            }
            (xa, xb) => (self.tensor(xa, span)?, self.tensor(xb, span)?),
        })
    }

    fn index(&mut self, target: &Expr, subs: &[Subscript], span: Span) -> R<X> {
        match self.expr(target)? {
            X::Static(s, SType::Str) => {
                let [Subscript::Index(i)] = subs else {
                    return Err(unsupported(span, "this string index"));
                };
                let (i, ity) = self.static_expr(i)?;
                let i = cast(&i, &ity, "usize");
                let s = s.at(10);
                Ok(X::Static(
                    S::atom(quote!(#s.chars().nth(#i).map(String::from).unwrap_or_default())),
                    SType::Str,
                ))
            }
            X::Tensor(t) => {
                let mut items = Vec::new();
                for sub in subs {
                    items.push(match sub {
                        Subscript::Ellipsis(_) => quote!(nn::Subscript::Ellipsis),
                        Subscript::Index(i) => {
                            let i = self.i32_expr(i)?;
                            quote!(nn::Subscript::At(#i))
                        }
                        Subscript::Slice(a, b, _) => {
                            let a = match a {
                                Some(a) => {
                                    let a = self.i32_expr(a)?;
                                    quote!(Some(#a))
                                }
                                None => quote!(None),
                            };
                            let b = match b {
                                Some(b) => {
                                    let b = self.i32_expr(b)?;
                                    quote!(Some(#b))
                                }
                                None => quote!(None),
                            };
                            quote!(nn::Subscript::Range(#a, #b))
                        }
                    });
                }
                let r = t.r();
                Ok(X::Tensor(T::owned(quote!(nn::index(#r, &[#(#items),*])?))))
            }
            X::Module(m) => self.index_list(*m, target, subs, span),
            _ => Err(unsupported(span, "indexing this value")),
        }
    }

    /// `h[i]`: one block of a list. Apart from [`Fx::index`], whose frame is on the path of
    /// every nested expression.
    #[inline(never)]
    fn index_list(&mut self, m: Module, target: &Expr, subs: &[Subscript], span: Span) -> R<X> {
        match m {
            Module::List {
                block,
                place,
                args,
                var,
                start,
                mut decl,
            } => {
                let [Subscript::Index(i)] = subs else {
                    return Err(unsupported(span, "this index of a block list"));
                };
                let (i, ity) = self.static_expr(i)?;
                let index = cast(&i, &ity, "i64");
                let name = self.temp("element");
                let id = ident(&name);
                let message = format!(
                    "index {{}} is outside the block list `{}` of {{}}",
                    crate::text::expr_text(target)
                );
                self.emit(GenStmt::Raw(quote!(
                    let #id = usize::try_from(#index)
                        .ok()
                        .and_then(|at| #place.get(at))
                        .ok_or_else(|| Error::Layout(format!(#message, #index, #place.len())))?;
                )));
                if let Some(v) = &var {
                    // The list's element variable counts from the list's start.
                    let offset = self.static_in(&start, &decl.clone())?;
                    let o = offset.0.at(7);
                    let tokens = quote!((#o + #index));
                    decl.push();
                    decl.bind(v, Binding::new(Val::Static(SType::Int), tokens));
                }
                Ok(X::Module(Box::new(Module::Block {
                    block,
                    place: quote!(#id),
                    args,
                    decl,
                })))
            }
            _ => Err(unsupported(span, "indexing this value")),
        }
    }

    // ---------------------------------------------------------------- calls

    fn call(&mut self, callee: &Expr, args: &[Arg], span: Span) -> R<X> {
        let g = self.g;
        if let Some(call) = g.model.typed.call(span) {
            return self.builtin_call(call, args, span);
        }
        if let ExprKind::Name(name) = &callee.kind {
            if self.site == Site::Step && self.env.get(name).is_none() {
                if name == "forward" {
                    return self.model_forward(args, span, None);
                }
                let frozen = self.frozen.iter().find(|(n, _)| n == name);
                if let Some((_, local)) = frozen.cloned() {
                    return self.model_forward(args, span, Some(&local));
                }
            }
        }
        match self.expr(callee)? {
            X::Module(m) => self.module_call(*m, args, span),
            _ => Err(unsupported(span, "calling this value")),
        }
    }

    fn module_call(&mut self, m: Module, args: &[Arg], span: Span) -> R<X> {
        match m {
            Module::Layer {
                kind,
                tied,
                place,
                args: layer_args,
                decl,
            } => {
                // A linear layer of an activated input, unless its input is shared with others.
                let shared = self.shared.iter().any(|g| g.calls.contains(&span));
                let input = match self.arg(args, 0, "x") {
                    Some(x) if kind == LayerKind::Linear && !tied && !shared => {
                        match self.activated_linear(&place, x, span)? {
                            Ok(output) => return Ok(output),
                            Err(input) => input,
                        }
                    }
                    _ => self.arg_tensor(args, 0, "x", span)?,
                };
                if kind == LayerKind::Experts {
                    // Through the pass, as a linear layer: its adapters' dropout draws from the
                    // step's key.
                    self.uses_pass = true;
                    self.pass_mut = true;
                    self.experts = true;
                    let x = self.hoist(input, "experts_in").r();
                    let idx = self.arg_tensor(args, 1, "indices", span)?;
                    let idx = self.hoist(idx, "experts_idx").r();
                    return Ok(X::Tensor(T::owned(
                        quote!(pass.experts(&#place, #x, #idx)?),
                    )));
                }
                if kind == LayerKind::Linear && !tied {
                    if let Some(output) = self.shared_output(span, &input) {
                        return Ok(output);
                    }
                }
                let x = input.r();
                let arg = |name: &str| layer_args.iter().find(|(n, _)| n == name).map(|(_, e)| e);
                // A float argument of the layer, evaluated where the layer was declared.
                let float = |fx: &mut Self, e: &Expr| -> R<TokenStream> {
                    let (s, ty) = fx.static_in(e, &decl)?;
                    Ok(cast(&s, &ty, "f32"))
                };
                let eps = |fx: &mut Self| -> R<TokenStream> {
                    let e = arg("eps").ok_or_else(|| unsupported(span, "a norm without `eps`"))?;
                    float(fx, e)
                };
                let ts = match (kind, tied) {
                    (LayerKind::Embedding, false) => quote!(nn::embedding(&#place, #x)?),
                    (LayerKind::Embedding, true) => quote!(nn::embedding_as_linear(&#place, #x)?),
                    (LayerKind::Linear, _) => {
                        // Through the pass: an adapter's dropout draws from the step's key. The
                        // input is computed first, as it may itself borrow the pass.
                        self.uses_pass = true;
                        self.pass_mut = true;
                        let x = self.hoist(input, "linear_in").r();
                        match self.residual_at(span) {
                            Some(residual) => {
                                self.linear_plus = true;
                                quote!(nn::linear_plus_in(&#place, nn::LayerInput::Plain(#x), #residual, pass.ctx)?)
                            }
                            None => {
                                self.linears = true;
                                quote!(pass.linear(&#place, #x)?)
                            }
                        }
                    }
                    (LayerKind::LayerNorm, _) => {
                        let eps = eps(self)?;
                        quote!(nn::layer_norm(&#place, #x, #eps)?)
                    }
                    (LayerKind::Experts, _) => {
                        return Err(unsupported(
                            span,
                            "an `experts` layer called with one input",
                        ))
                    }
                    (LayerKind::RmsNorm, _) => {
                        let eps = eps(self)?;
                        match arg("offset") {
                            Some(offset) if !is_zero(offset) => {
                                let offset = float(self, offset)?;
                                quote!(nn::rms_norm_with_offset(&#place, #x, #eps, #offset)?)
                            }
                            _ => quote!(nn::rms_norm(&#place, #x, #eps)?),
                        }
                    }
                };
                Ok(X::Tensor(T::owned(ts)))
            }
            Module::Block {
                block,
                place,
                args: block_args,
                decl,
            } => {
                // Taken before the arguments are lowered: a block call among them is not the
                // one the residual is for.
                let residual = self.pending_residual.take();
                let info = self.g.block_info(&block);
                let mut call_args = Vec::new();
                if info.needs_pass {
                    self.uses_pass = true;
                    self.pass_mut = true;
                    call_args.push(if self.site == Site::Root {
                        quote!(&mut pass)
                    } else {
                        quote!(pass)
                    });
                }
                let ir = self
                    .g
                    .model
                    .block(&block)
                    .ok_or_else(|| unsupported(span, "this block"))?;
                for (i, (name, _, default)) in ir.args.iter().enumerate() {
                    if !info.args_used.get(i).copied().unwrap_or(true) {
                        continue;
                    }
                    let want = self.g.arg_type(&block, i);
                    let (s, ty) = match block_args.iter().find(|(n, _)| n == name) {
                        Some((_, e)) => self.static_in(e, &decl)?,
                        None => {
                            let d = default.as_ref().ok_or_else(|| {
                                unsupported(span, "a block argument without a value")
                            })?;
                            let globals = self.g.globals();
                            self.static_in(d, &globals)?
                        }
                    };
                    call_args.push(match want {
                        SType::Str => {
                            let s = s.at(9);
                            quote!(&#s)
                        }
                        _ => convert(&s, &ty, &want),
                    });
                }
                let inputs = &ir.forward.inputs;
                for i in 0..inputs.len() {
                    let t = self.arg_tensor(args, i, "", span)?;
                    call_args.push(t.r());
                }
                if info.takes_residual {
                    call_args.push(residual.unwrap_or(quote!(None)));
                }
                Ok(X::Tensor(T::owned(
                    quote!(#place.forward(#(#call_args),*)?),
                )))
            }
            _ => Err(unsupported(span, "calling this parameter group")),
        }
    }

    fn arg<'a>(&self, args: &'a [Arg], pos: usize, name: &str) -> Option<&'a Expr> {
        args.iter()
            .find(|a| a.name.as_ref().is_some_and(|n| n.name == name))
            .or_else(|| args.iter().filter(|a| a.name.is_none()).nth(pos))
            .map(|a| &a.value)
    }

    fn arg_tensor(&mut self, args: &[Arg], pos: usize, name: &str, span: Span) -> R<T> {
        let e = self
            .arg(args, pos, name)
            .ok_or_else(|| unsupported(span, "a call without this argument"))?;
        self.tensor_expr(e)
    }

    /// `forward(..)` in a step: the model's forward pass, with one context for the whole step.
    /// `forward(..)` of the trained parameters, or of the frozen model whose parameters are
    /// the local `frozen` (without dropout: a frozen model is evaluated, never trained).
    fn model_forward(&mut self, args: &[Arg], span: Span, frozen: Option<&str>) -> R<X> {
        let n = self.g.model.forward.inputs.len();
        if args.len() != n {
            return Err(unsupported(span, "a `forward` call of another arity"));
        }
        let mut inputs = Vec::new();
        for a in args {
            let x = self.expr(&a.value)?;
            inputs.push(self.tensor(x, a.value.span)?.r());
        }
        let config = self.config_place();
        if let Some(local) = frozen {
            let local = ident(local);
            return Ok(X::Tensor(T::owned(quote!(
                forward(#local, #config, #(#inputs,)* &mut Context::evaluation())?
            ))));
        }
        let ctx = match &self.step_ctx {
            Some(name) => name.clone(),
            None => {
                let name = self.temp("context");
                self.step_ctx = Some(name.clone());
                name
            }
        };
        let ctx = ident(&ctx);
        Ok(X::Tensor(T::owned(
            quote!(forward(params, #config, #(#inputs,)* &mut #ctx)?),
        )))
    }
}

/// Whether an expression in a body's last place gives the body a value: anything but an `if`
/// whose branches end in statements (or that has no `else`), which is a statement.
fn has_value(e: &Expr) -> bool {
    match &e.kind {
        ExprKind::If(_, then, Some(otherwise)) => body_has_value(then) && body_has_value(otherwise),
        ExprKind::If(_, _, None) => false,
        _ => true,
    }
}

fn body_has_value(body: &Body) -> bool {
    match body.stmts.last().map(|s| &s.kind) {
        Some(StmtKind::Expr(e)) => has_value(e),
        _ => false,
    }
}

/// Names a body (and its nested bodies) assigns with `a = ..`.
fn assigned_names(body: &Body, out: &mut Vec<String>) {
    for s in &body.stmts {
        match &s.kind {
            StmtKind::Assign(n, _) => out.push(n.name.clone()),
            StmtKind::For(_, _, b) | StmtKind::While(_, b) => assigned_names(b, out),
            StmtKind::Expr(Expr {
                kind: ExprKind::If(_, a, b),
                ..
            }) => {
                assigned_names(a, out);
                if let Some(b) = b {
                    assigned_names(b, out);
                }
            }
            _ => {}
        }
    }
}

/// Access to a guarded parameter: an error, never a panic, when its guard did not hold.
pub(crate) fn guarded(place: TokenStream, name: &str) -> TokenStream {
    let message = format!("`{name}` exists only when its guard holds for this configuration");
    quote!((*#place.as_ref().ok_or_else(|| Error::Config(#message.into()))?))
}

/// An owned `Array` from a tensor expression.
fn owned(t: T) -> TokenStream {
    let ts = t.ts;
    if t.is_ref || t.simple {
        quote!(#ts.clone())
    } else {
        ts
    }
}

/// Whether `e` is a literal zero, such as a layer argument left at its default.
pub fn is_zero(e: &Expr) -> bool {
    matches!(e.kind, ExprKind::Float(v) if v == 0.0) || matches!(e.kind, ExprKind::Int(0))
}

/// `s` (of type `from`) as the Rust type `to` (`i32`, `i64`, `usize`, `f32`, `f64`).
pub(crate) fn cast(s: &S, from: &SType, to: &str) -> TokenStream {
    if let Some(x) = s.lit {
        let float = to.starts_with('f');
        if float {
            return float_lit(x).ts;
        }
        if x.fract() == 0.0 {
            return int_lit(x as i64).ts;
        }
    }
    let natural = match from {
        SType::Int => "i64",
        SType::Float => "f64",
        _ => "",
    };
    if natural == to {
        return s.ts.clone();
    }
    let inner = s.at(8);
    let to = format_ident!("{}", to);
    quote!(#inner as #to)
}

/// `s` converted between static types (ints widen to floats).
pub(crate) fn convert(s: &S, from: &SType, to: &SType) -> TokenStream {
    match (from, to) {
        (SType::Int, SType::Float) => cast(s, from, "f64"),
        _ => s.ts.clone(),
    }
}

/// The `nn::Activation` variant and the input of `f(x)`, `f` a built-in activation
/// ([`ACTIVATIONS`]) applied to a tensor.
fn activation_input<'e>(typed: &Typed, e: &'e Expr) -> Option<(&'static str, &'e Expr)> {
    let ExprKind::Call(_, args) = &e.kind else {
        return None;
    };
    let call = typed.call(e.span)?;
    let (_, activation) = ACTIVATIONS
        .iter()
        .find(|(name, _)| *name == call.builtin.name)?;
    if call.form != Form::Tensor {
        return None;
    }
    let input = args.get((*call.args.first()?)?).map(|arg| &arg.value)?;
    Some((activation, input))
}

fn static_binary(op: BinaryOp, sa: S, ta: SType, sb: S, tb: SType, span: Span) -> R<X> {
    use BinaryOp::*;
    let float = ta == SType::Float || tb == SType::Float;
    let numeric = |t: &SType| matches!(t, SType::Int | SType::Float);
    let (sa, sb) = if float && numeric(&ta) && numeric(&tb) {
        let fa = S {
            ts: cast(&sa, &ta, "f64"),
            prec: if sa.lit.is_some() { sa.prec } else { 8 },
            lit: sa.lit,
        };
        let fb = S {
            ts: cast(&sb, &tb, "f64"),
            prec: if sb.lit.is_some() { sb.prec } else { 8 },
            lit: sb.lit,
        };
        (fa, fb)
    } else {
        (sa, sb)
    };
    let num_ty = if float { SType::Float } else { ta.clone() };
    let (prec, sym, ty) = match op {
        Or => (2, quote!(||), SType::Bool),
        And => (3, quote!(&&), SType::Bool),
        Eq => (4, quote!(==), SType::Bool),
        Ne => (4, quote!(!=), SType::Bool),
        Lt => (4, quote!(<), SType::Bool),
        Le => (4, quote!(<=), SType::Bool),
        Gt => (4, quote!(>), SType::Bool),
        Ge => (4, quote!(>=), SType::Bool),
        Add => (6, quote!(+), num_ty),
        Sub => (6, quote!(-), num_ty),
        Mul => (7, quote!(*), num_ty),
        Div => (7, quote!(/), num_ty),
        Rem => (7, quote!(%), num_ty),
        Pow => {
            let (base, e) = (sa.ts, sb.ts.clone());
            let ts = if float {
                quote!(f64::powf(#base, #e))
            } else {
                let e = cast(&sb, &tb, "u32");
                quote!(i64::pow(#base, #e))
            };
            return Ok(X::Static(S::atom(ts), num_ty));
        }
        MatMul => return Err(unsupported(span, "`@` of static values")),
    };
    if matches!(ty, SType::Str) || matches!(ty, SType::Enum(_)) && prec > 4 {
        return Err(unsupported(span, "arithmetic on strings or enums"));
    }
    let left_min = if prec == 4 { 5 } else { prec };
    let (a, b) = (sa.at(left_min), sb.at(prec + 1));
    // A config string is a `String`, a literal a `&str`: compare them as `str`s.
    let (a, b) = if ta == SType::Str && prec == 4 {
        let (a, b) = (sa.at(10), sb.at(10));
        (quote!(#a[..]), quote!(#b[..]))
    } else {
        (a, b)
    };
    Ok(X::Static(
        S {
            ts: quote!(#a #sym #b),
            prec,
            lit: None,
        },
        ty,
    ))
}

/// Token streams of plain identifiers.
pub(crate) trait PlainTokens {
    fn into_token_stream_plain(self) -> TokenStream;
}

impl PlainTokens for proc_macro2::Ident {
    fn into_token_stream_plain(self) -> TokenStream {
        quote!(#self)
    }
}
