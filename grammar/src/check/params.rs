//! `params { }`: layers, raw tensors, blocks, block lists, groups, tied weights, guards.

use std::collections::HashMap;

use super::scope::Scope;
use super::{BlockInfo, Checker, Context, Signature};
use crate::ast::{self, ListCount, ParamGroup, ParamKind};
use crate::diag::Diagnostic;
use crate::dim::Dim;
use crate::ir::{ArgTy, Init, LayerKind, Marks, ParamEntry, ParamNode, ParamTree};
use crate::span::Span;
use crate::text::expr_text;
use crate::types::{ExpertsTy, LayerTy, ModuleTy, StaticTy, TensorTy, Ty};

/// Initialisers of raw tensors, with their arguments and defaults.
pub const INITS: [(&str, &[(&str, f64)]); 4] = [
    ("normal", &[("std", 0.02), ("mean", 0.0)]),
    ("uniform", &[("low", -0.1), ("high", 0.1)]),
    ("zeros", &[]),
    ("ones", &[]),
];

/// Arguments matched to a signature: `(name, value)` pairs and their types, in signature order.
type BoundArgs = (Vec<(String, ast::Expr)>, Vec<Ty>);

impl Checker<'_> {
    /// Collects every block's signature and parameters, so forward passes can call them.
    pub(crate) fn collect_blocks(&mut self) {
        let model = self.model;
        for block in &model.blocks {
            if LayerKind::from_name(&block.name.name).is_some()
                || self.blocks.contains_key(&block.name.name)
            {
                self.error(Diagnostic::new(
                    "lmx::name::duplicate",
                    format!(
                        "block `{}` is declared twice or shadows a library layer",
                        block.name.name
                    ),
                    block.name.span,
                    "this name is already taken",
                ));
                continue;
            }
            let info = BlockInfo {
                sig: Signature {
                    inputs: Vec::new(),
                    free: Vec::new(),
                    output: None,
                },
                params: Ty::Unknown,
                tree: ParamTree::default(),
            };
            self.blocks.insert(block.name.name.clone(), info);
        }
        self.reject_recursion();
        for block in &model.blocks {
            let mut scope = self.block_scope(block);
            let (tree, params) = match &block.params {
                Some(g) => self.check_group(g, &mut scope, &[]),
                None => (
                    ParamTree::default(),
                    Ty::Module(ModuleTy::Group(Vec::new())),
                ),
            };
            let (inputs, free) = self.resolve_inputs(&block.forward.inputs, &mut scope);
            let output = block
                .forward
                .output
                .as_ref()
                .and_then(|o| self.resolve_type(o, &mut scope, &mut Vec::new()));
            if let Some(info) = self.blocks.get_mut(&block.name.name) {
                *info = BlockInfo {
                    sig: Signature {
                        inputs,
                        free,
                        output,
                    },
                    params,
                    tree,
                };
            }
        }
    }

    /// The scope inside a block: config values and the block's static arguments.
    pub(crate) fn block_scope(&mut self, block: &ast::Block) -> Scope {
        let mut scope = self.globals.clone();
        scope.push();
        for arg in &block.args {
            let ty = match super::config::static_ty(&arg.ty) {
                StaticTy::Int(_) => StaticTy::Int(Some(Dim::symbol_as(
                    &format!("{}.{}", block.name.name, arg.name.name),
                    &arg.name.name,
                ))),
                other => other,
            };
            if let Some(d) = &arg.default {
                let found = self.infer(d, &mut scope.clone(), Context::Forward);
                self.expect_static(&found, &ty, d.span, "a block argument default");
            }
            scope.bind(&arg.name.name, Ty::Static(ty), arg.name.span);
        }
        scope
    }

    fn reject_recursion(&mut self) {
        let model = self.model;
        let mut uses: HashMap<&str, Vec<(&str, Span)>> = HashMap::new();
        for b in &model.blocks {
            let mut out = Vec::new();
            if let Some(g) = &b.params {
                collect_uses(g, &mut out);
            }
            uses.insert(&b.name.name, out);
        }
        for b in &model.blocks {
            let mut stack = vec![b.name.name.as_str()];
            let mut seen = vec![];
            while let Some(cur) = stack.pop() {
                for (next, span) in uses.get(cur).into_iter().flatten() {
                    if *next == b.name.name {
                        self.error(Diagnostic::new(
                            "lmx::params::recursive",
                            format!("block `{}` contains itself", b.name.name),
                            *span,
                            format!("`{next}` is used inside `{}`", b.name.name),
                        ).with_help("a parameter tree must be finite; use a list `[Block; n]` to repeat a block"));
                        if let Some(info) = self.blocks.get_mut(&b.name.name) {
                            info.params = Ty::Unknown;
                        }
                        return;
                    }
                    if !seen.contains(next) {
                        seen.push(next);
                        stack.push(next);
                    }
                }
            }
        }
    }

    /// The masks an entry's marks set. A mark written twice, or on an entry with no leaves of
    /// its own to mark (a buffer, never trained or decayed; a tied entry, whose weight is its
    /// target's), is an error, reported once.
    fn check_marks(&mut self, p: &ast::Param) -> Marks {
        let mut marks = Marks::default();
        let mut seen: Vec<&ast::Mark> = Vec::new();
        for mark in &p.marks {
            let keyword = mark.kind.keyword();
            if let Some(first) = seen.iter().find(|m| m.kind == mark.kind) {
                self.error(
                    Diagnostic::new(
                        "lmx::params::duplicate_mark",
                        format!("`{}` is marked `{keyword}` twice", p.name.name),
                        mark.span,
                        "marked again here",
                    )
                    .with_label(first.span, "first marked here")
                    .with_help("remove one of them"),
                );
                continue;
            }
            seen.push(mark);
            let nothing = match &p.kind {
                ParamKind::Tensor { buffer: true, .. } => Some((
                    "a buffer, which is never trained or decayed",
                    "remove the mark: a buffer has no gradient, optimizer state or weight decay",
                )),
                ParamKind::Tied(_) => Some((
                    "tied: its weight is the target's",
                    "mark the entry it is tied to instead",
                )),
                _ => None,
            };
            if let Some((what, help)) = nothing {
                self.error(
                    Diagnostic::new(
                        "lmx::params::mark",
                        format!("`{keyword}` has nothing to mark on `{}`", p.name.name),
                        mark.span,
                        format!("`{}` is {what}", p.name.name),
                    )
                    .with_help(help),
                );
                continue;
            }
            match mark.kind {
                ast::MarkKind::Frozen => marks.frozen = true,
                ast::MarkKind::NoDecay => marks.no_decay = true,
            }
        }
        marks
    }

    /// Checks the model's root parameter group.
    pub(crate) fn check_root_params(&mut self, g: &ParamGroup) -> (ParamTree, Ty) {
        let mut scope = self.globals.clone();
        self.check_group(g, &mut scope, &[])
    }

    fn check_group(
        &mut self,
        g: &ParamGroup,
        scope: &mut Scope,
        path: &[String],
    ) -> (ParamTree, Ty) {
        let mut tree = ParamTree::default();
        let mut types: Vec<(String, Ty)> = Vec::new();
        let mut spans: HashMap<String, Span> = HashMap::new();
        for p in &g.entries {
            if let Some(prev) = spans.get(&p.name.name) {
                self.error(
                    Diagnostic::new(
                        "lmx::name::duplicate",
                        format!("parameter `{}` is declared twice", p.name.name),
                        p.name.span,
                        "declared again here",
                    )
                    .with_label(*prev, "first declared here"),
                );
                continue;
            }
            spans.insert(p.name.name.clone(), p.name.span);
            let guard = p.guard.as_ref().map(|e| {
                let t = self.infer(e, scope, Context::Forward);
                self.expect_static(&t, &StaticTy::Bool, e.span, "a parameter's condition");
                e.clone()
            });
            let mut sub = path.to_vec();
            sub.push(p.name.name.clone());
            let (node, ty) = match &p.kind {
                ParamKind::Group(inner) => {
                    let (t, ty) = self.check_group(inner, scope, &sub);
                    (ParamNode::Group(t), ty)
                }
                ParamKind::Module(m) => self.check_module(m, scope),
                ParamKind::List { module, count } => self.check_list(module, count, scope),
                ParamKind::Tensor {
                    shape,
                    init,
                    span,
                    buffer,
                } => self.check_tensor(shape, init.as_ref(), *span, *buffer, scope),
                ParamKind::Tied(target) => self.check_tied(target, &types),
            };
            let marks = self.check_marks(p);
            tree.entries.push(ParamEntry {
                name: p.name.name.clone(),
                guard,
                node,
                marks,
            });
            types.push((p.name.name.clone(), ty));
        }
        (tree, Ty::Module(ModuleTy::Group(types)))
    }

    /// Binds a group's entries as names in a forward pass's scope.
    pub(crate) fn bind_params(&mut self, group: &ParamGroup, ty: &Ty, scope: &mut Scope) {
        let Ty::Module(ModuleTy::Group(entries)) = ty else {
            return;
        };
        for p in &group.entries {
            if let Some((_, t)) = entries.iter().find(|(n, _)| *n == p.name.name) {
                let guard = p.guard.as_ref().map(expr_text);
                scope.bind_guarded(&p.name.name, t.clone(), p.name.span, guard);
            }
        }
    }

    fn static_args(&mut self, args: &[ast::Arg], scope: &mut Scope) -> Vec<Ty> {
        args.iter()
            .map(|a| self.infer(&a.value, scope, Context::Forward))
            .collect()
    }

    /// Matches arguments to a signature: `(name, type, default)`; returns them in signature order.
    fn bind_args(
        &mut self,
        callee: &ast::Ident,
        args: &[ast::Arg],
        tys: &[Ty],
        sig: &[(String, StaticTy, Option<ast::Expr>)],
        call: Span,
    ) -> Option<BoundArgs> {
        let mut slots: Vec<Option<(ast::Expr, Ty)>> = vec![None; sig.len()];
        let mut ok = true;
        // An unknown or misplaced argument is most likely the required one it stands for: that
        // one's "missing" is not reported as well.
        let mut misplaced = false;
        let mut positional = 0;
        let mut keyword_seen = false;
        for (a, t) in args.iter().zip(tys) {
            let idx = match &a.name {
                Some(n) => match sig.iter().position(|(s, _, _)| *s == n.name) {
                    Some(i) => {
                        keyword_seen = true;
                        i
                    }
                    None => {
                        let names: Vec<&str> = sig.iter().map(|(s, _, _)| s.as_str()).collect();
                        let help = match super::suggest::closest(&n.name, names.iter().copied()) {
                            Some(s) => format!("did you mean `{s}`?"),
                            None => format!("its arguments are: {}", names.join(", ")),
                        };
                        self.error(
                            Diagnostic::new(
                                "lmx::call::unknown_argument",
                                format!("`{}` has no argument `{}`", callee.name, n.name),
                                n.span,
                                "unknown argument",
                            )
                            .with_help(help),
                        );
                        ok = false;
                        misplaced = true;
                        continue;
                    }
                },
                None if keyword_seen => {
                    self.error(
                        Diagnostic::new(
                            "lmx::call::positional_after_keyword",
                            format!(
                                "a positional argument of `{}` follows a named one",
                                callee.name
                            ),
                            a.value.span,
                            "positional argument after a named one",
                        )
                        .with_help("write positional arguments first, or name this one"),
                    );
                    ok = false;
                    misplaced = true;
                    continue;
                }
                None => {
                    positional += 1;
                    positional - 1
                }
            };
            if let (Some(Some((first, _))), Some((name, _, _))) = (slots.get(idx), sig.get(idx)) {
                self.error(
                    Diagnostic::new(
                        "lmx::call::duplicate_argument",
                        format!("`{name}` of `{}` is given twice", callee.name),
                        a.name.as_ref().map_or(a.value.span, |n| n.span),
                        "given again here",
                    )
                    .with_label(first.span, "first given here")
                    .with_help("keep one of them"),
                );
                ok = false;
                continue;
            }
            let Some((name, want, _)) = sig.get(idx) else {
                self.error(Diagnostic::new(
                    "lmx::call::arity",
                    format!("`{}` takes {} arguments", callee.name, sig.len()),
                    a.value.span,
                    "one too many",
                ));
                ok = false;
                continue;
            };
            if !self.expect_static(
                t,
                want,
                a.value.span,
                &format!("`{name}` of `{}`", callee.name),
            ) {
                ok = false;
            }
            slots[idx] = Some((a.value.clone(), t.clone()));
        }
        let mut out = Vec::new();
        let mut out_tys = Vec::new();
        for ((name, ty, default), slot) in sig.iter().zip(slots) {
            match (slot, default) {
                (Some((e, t)), _) => {
                    out.push((name.clone(), e));
                    out_tys.push(t);
                }
                (None, Some(d)) => {
                    out.push((name.clone(), d.clone()));
                    out_tys.push(Ty::Static(ty.clone()));
                }
                (None, None) if misplaced => ok = false,
                (None, None) => {
                    self.error(Diagnostic::new(
                        "lmx::call::missing_argument",
                        format!("`{}` is missing its argument `{name}`", callee.name),
                        call,
                        format!("`{name}` is required"),
                    ));
                    ok = false;
                }
            }
        }
        ok.then_some((out, out_tys))
    }

    fn layer_signature(kind: LayerKind) -> Vec<(String, StaticTy, Option<ast::Expr>)> {
        kind.signature()
            .iter()
            .map(|(n, t, d)| {
                let ty = match t {
                    ArgTy::Int => StaticTy::Int(None),
                    ArgTy::Float => StaticTy::Float,
                    ArgTy::Bool => StaticTy::Bool,
                };
                let default = d.map(|text| {
                    let kind = match text {
                        "true" => ast::ExprKind::Bool(true),
                        int if *t == ArgTy::Int => ast::ExprKind::Int(int.parse().unwrap_or(0)),
                        other => ast::ExprKind::Float(other.parse().unwrap_or(0.0)),
                    };
                    ast::Expr {
                        kind,
                        span: Span::default(),
                    }
                });
                (n.to_string(), ty, default)
            })
            .collect()
    }

    fn check_module(&mut self, m: &ast::ModuleRef, scope: &mut Scope) -> (ParamNode, Ty) {
        let tys = self.static_args(&m.args, scope);
        if let Some(kind) = LayerKind::from_name(&m.name.name) {
            let sig = Self::layer_signature(kind);
            let Some((args, tys)) = self.bind_args(&m.name, &m.args, &tys, &sig, m.span) else {
                return (ParamNode::Group(ParamTree::default()), Ty::Unknown);
            };
            let dim = |i: usize| match tys.get(i) {
                Some(Ty::Static(StaticTy::Int(Some(d)))) => d.clone(),
                _ => Dim::opaque(&args.get(i).map(|(_, e)| expr_text(e)).unwrap_or_default()),
            };
            let layer = match kind {
                LayerKind::Embedding => LayerTy::Embedding {
                    count: dim(0),
                    dim: dim(1),
                },
                LayerKind::Linear => LayerTy::Linear {
                    input: dim(0),
                    output: dim(1),
                },
                LayerKind::LayerNorm | LayerKind::RmsNorm => LayerTy::Norm { dim: dim(0) },
                LayerKind::Experts => LayerTy::Experts(Box::new(ExpertsTy {
                    dim: dim(0),
                    hidden: dim(1),
                    count: dim(2),
                })),
            };
            return (
                ParamNode::Layer { kind, args },
                Ty::Module(ModuleTy::Layer(layer)),
            );
        }
        match self.block_args(m, &tys) {
            Some(args) => (
                ParamNode::Block {
                    block: m.name.name.clone(),
                    args,
                },
                Ty::Module(ModuleTy::Block(m.name.name.clone())),
            ),
            None => (ParamNode::Group(ParamTree::default()), Ty::Unknown),
        }
    }

    fn block_args(&mut self, m: &ast::ModuleRef, tys: &[Ty]) -> Option<Vec<(String, ast::Expr)>> {
        let model = self.model;
        let Some(block) = model.blocks.iter().find(|b| b.name.name == m.name.name) else {
            let mut d = Diagnostic::new(
                "lmx::params::unknown_layer",
                format!("`{}` is neither a library layer nor a block", m.name.name),
                m.name.span,
                "unknown layer",
            );
            let candidates = ["embedding", "linear", "layer_norm", "rms_norm"]
                .into_iter()
                .chain(model.blocks.iter().map(|b| b.name.name.as_str()));
            d = match super::suggest::closest(&m.name.name, candidates) {
                Some(s) => d.with_help(format!("did you mean `{s}`?")),
                None => d.with_help("library layers are embedding, linear, layer_norm and rms_norm; blocks are declared with `block Name { }`"),
            };
            self.error(d);
            return None;
        };
        let sig: Vec<_> = block
            .args
            .iter()
            .map(|a| {
                (
                    a.name.name.clone(),
                    super::config::static_ty(&a.ty),
                    a.default.clone(),
                )
            })
            .collect();
        self.bind_args(&m.name, &m.args, tys, &sig, m.span)
            .map(|(a, _)| a)
    }

    fn check_list(
        &mut self,
        module: &ast::ModuleRef,
        count: &ListCount,
        scope: &mut Scope,
    ) -> (ParamNode, Ty) {
        scope.push();
        let (var, start, end) = match count {
            ListCount::Repeat(n) => {
                let t = self.infer(n, scope, Context::Forward);
                self.expect_static(
                    &t,
                    &StaticTy::Int(None),
                    n.span,
                    "the length of a block list",
                );
                let zero = ast::Expr {
                    kind: ast::ExprKind::Int(0),
                    span: n.span,
                };
                (None, zero, n.clone())
            }
            ListCount::Comprehension { var, range } => {
                let start = range.start.clone();
                let end = match &range.end {
                    Some(e) => e.clone(),
                    None => {
                        self.error(Diagnostic::new(
                            "lmx::params::list_range",
                            "a block list needs a range such as `0..n_layers`",
                            range.span,
                            "not a range",
                        ));
                        range.start.clone()
                    }
                };
                for e in [&start, &end] {
                    let t = self.infer(e, scope, Context::Forward);
                    self.expect_static(&t, &StaticTy::Int(None), e.span, "a block list bound");
                }
                scope.bind(&var.name, Ty::Static(StaticTy::Int(None)), var.span);
                (Some(var.name.clone()), start, end)
            }
        };
        let tys = self.static_args(&module.args, scope);
        scope.pop();
        if LayerKind::from_name(&module.name.name).is_some() {
            self.error(
                Diagnostic::new(
                    "lmx::params::layer_list",
                    "lists hold blocks, not library layers",
                    module.name.span,
                    "a library layer",
                )
                .with_help("wrap the layer in a `block` to repeat it"),
            );
            return (ParamNode::Group(ParamTree::default()), Ty::Unknown);
        }
        match self.block_args(module, &tys) {
            Some(args) => (
                ParamNode::List {
                    block: module.name.name.clone(),
                    args,
                    var,
                    start: Box::new(start),
                    end: Box::new(end),
                },
                Ty::Module(ModuleTy::BlockList(module.name.name.clone())),
            ),
            None => (ParamNode::Group(ParamTree::default()), Ty::Unknown),
        }
    }

    fn check_tensor(
        &mut self,
        shape: &[ast::Expr],
        init: Option<&ast::Call>,
        span: Span,
        buffer: bool,
        scope: &mut Scope,
    ) -> (ParamNode, Ty) {
        let mut dims = Vec::new();
        for d in shape {
            match self.infer(d, scope, Context::Forward) {
                Ty::Static(StaticTy::Int(Some(dim))) => dims.push(dim),
                t => {
                    self.expect_static(&t, &StaticTy::Int(None), d.span, "a tensor size");
                    dims.push(Dim::opaque(&expr_text(d)));
                }
            }
        }
        let init = match init {
            None => Init {
                name: "normal".to_string(),
                args: Vec::new(),
            },
            Some(call) => match INITS.iter().find(|(n, _)| *n == call.name.name) {
                Some((name, params)) => {
                    let tys = self.static_args(&call.args, scope);
                    let sig: Vec<_> = params
                        .iter()
                        .map(|(n, v)| {
                            (
                                n.to_string(),
                                StaticTy::Float,
                                Some(ast::Expr {
                                    kind: ast::ExprKind::Float(*v),
                                    span: call.span,
                                }),
                            )
                        })
                        .collect();
                    let args = self
                        .bind_args(&call.name, &call.args, &tys, &sig, call.span)
                        .map(|(a, _)| a)
                        .unwrap_or_default();
                    Init {
                        name: name.to_string(),
                        args,
                    }
                }
                None => {
                    self.error(
                        Diagnostic::new(
                            "lmx::params::unknown_init",
                            format!("unknown initialiser `{}`", call.name.name),
                            call.name.span,
                            "not an initialiser",
                        )
                        .with_help("initialisers are normal(std, mean), uniform(low, high), zeros(), ones()"),
                    );
                    Init {
                        name: "normal".to_string(),
                        args: Vec::new(),
                    }
                }
            },
        };
        (
            ParamNode::Tensor {
                shape: shape.to_vec(),
                init,
                buffer,
            },
            Ty::Tensor(TensorTy::new(crate::ast::Dtype::Float, dims, span)),
        )
    }

    /// Whether `path` names an entry of the parameter group `types`, whatever its type.
    fn declared_path(&self, path: &[String], types: &[(String, Ty)]) -> bool {
        let mut entries = types;
        for (i, seg) in path.iter().enumerate() {
            match entries.iter().find(|(n, _)| n == seg) {
                None => return false,
                Some((_, Ty::Module(ModuleTy::Group(inner)))) => entries = inner,
                Some(_) => return i + 1 == path.len(),
            }
        }
        true
    }

    fn check_tied(&mut self, target: &[ast::Ident], types: &[(String, Ty)]) -> (ParamNode, Ty) {
        let path: Vec<String> = target.iter().map(|i| i.name.clone()).collect();
        let span = target
            .first()
            .map(|f| f.span)
            .unwrap_or_default()
            .join(target.last().map(|l| l.span).unwrap_or_default());
        let mut ty = Ty::Module(ModuleTy::Group(types.to_vec()));
        for seg in &path {
            ty = match ty {
                Ty::Module(ModuleTy::Group(entries)) => entries
                    .iter()
                    .find(|(n, _)| n == seg)
                    .map(|(_, t)| t.clone())
                    .unwrap_or(Ty::Unknown),
                _ => Ty::Unknown,
            };
        }
        let layer = match ty {
            // The target exists but its own declaration was reported: nothing to add.
            Ty::Unknown if self.declared_path(&path, types) => {
                return (ParamNode::Tied { target: path }, Ty::Unknown);
            }
            Ty::Module(ModuleTy::Layer(LayerTy::Embedding { count, dim })) => {
                Some(LayerTy::Linear {
                    input: dim,
                    output: count,
                })
            }
            Ty::Module(ModuleTy::Layer(LayerTy::Linear { input, output })) => {
                Some(LayerTy::Linear { input, output })
            }
            _ => None,
        };
        match layer {
            Some(l) => (
                ParamNode::Tied { target: path },
                Ty::Module(ModuleTy::Layer(l)),
            ),
            None => {
                self.error(
                    Diagnostic::new(
                        "lmx::params::tied",
                        format!("`tied({})` must name an embedding or linear layer declared before it", path.join(".")),
                        span,
                        "not an earlier embedding or linear",
                    )
                    .with_help("declare the shared layer first, e.g. `wte: embedding(vocab, d_model)` then `lm_head: tied(wte)`"),
                );
                (ParamNode::Tied { target: path }, Ty::Unknown)
            }
        }
    }

    /// Resolves forward inputs; capitalised unknown names in shapes become new sizes.
    pub(crate) fn resolve_inputs(
        &mut self,
        inputs: &[ast::Input],
        scope: &mut Scope,
    ) -> (Vec<(String, TensorTy)>, Vec<String>) {
        let mut free = Vec::new();
        let mut out = Vec::new();
        for i in inputs {
            // An input whose shape was reported as wrong is still an input, of unknown shape:
            // callers then pass the right number of arguments without a second error.
            let t = self
                .resolve_type(&i.ty, scope, &mut free)
                .unwrap_or(TensorTy {
                    dtype: i.ty.dtype,
                    shape: None,
                    origin: i.ty.span,
                });
            out.push((i.name.name.clone(), t));
        }
        (out, free)
    }

    /// Resolves a tensor type: `[B, T, d_model] float`.
    pub(crate) fn resolve_type(
        &mut self,
        t: &ast::TensorType,
        scope: &mut Scope,
        free: &mut Vec<String>,
    ) -> Option<TensorTy> {
        let mut dims = Vec::new();
        for d in &t.shape {
            if let ast::ExprKind::Name(n) = &d.kind {
                if scope.get(n).is_none() && n.starts_with(|c: char| c.is_ascii_uppercase()) {
                    scope.bind(n, Ty::dim(Dim::symbol(n)), d.span);
                    free.push(n.clone());
                }
            }
            match self.infer(d, scope, Context::Forward) {
                Ty::Static(StaticTy::Int(Some(dim))) => dims.push(dim),
                Ty::Unknown => return None,
                other => {
                    self.expect_static(&other, &StaticTy::Int(None), d.span, "a dimension");
                    return None;
                }
            }
        }
        Some(TensorTy::new(t.dtype, dims, t.span))
    }
}

fn collect_uses<'a>(g: &'a ParamGroup, out: &mut Vec<(&'a str, Span)>) {
    for p in &g.entries {
        match &p.kind {
            ParamKind::Group(inner) => collect_uses(inner, out),
            ParamKind::Module(m) | ParamKind::List { module: m, .. } => {
                out.push((&m.name.name, m.name.span))
            }
            _ => {}
        }
    }
}
