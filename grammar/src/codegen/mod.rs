//! The code generator: a checked model to a Rust module (quote + prettyplease).
//!
//! Per model `Foo` the module `foo` holds: `Config` (serde, with the declared defaults, derived
//! values as methods, `Config::preset`, `PRESETS`), the parameter tree `Params<T = Array>` with
//! one struct per block and group (each a `Tree`), `init`, `forward`, the unit struct `Foo`
//! implementing `LanguageModel`, and per step a unit struct implementing `TrainingStep` with
//! `TrainState`. Generated code refers to the runtime as `::lmx::runtime`.
//!
//! Anything the checker accepts but this generator cannot translate is reported as an
//! `lmx::codegen::unsupported` diagnostic at the construct, never as Rust that fails to compile.

mod builtin;
mod config;
mod forward;
mod names;
mod params;
mod shared_input;
mod step;

use std::cell::RefCell;
use std::collections::HashMap;

use proc_macro2::TokenStream;
use quote::{format_ident, quote};

use crate::ast::{Expr, ExprKind};
use crate::diag::Diagnostic;
use crate::ir::{CheckedModel, ParamEntry, ParamNode, ParamTree};
use crate::span::Span;
use crate::types::StaticTy;
use forward::{unsupported, Binding, Env, Fx, Module, SType, Site, Val};
use names::{camel, ident, snake};

pub(crate) use builtin::{LowerCx, Lowered};
pub(crate) use forward::R;

/// The Rust type of a model's step in its module (`step dpo` -> `Dpo`).
pub fn step_type_name(step: &str) -> String {
    camel(step)
}

/// The Rust module name of a model (`Gpt2` -> `gpt2`).
pub fn module_name(model: &CheckedModel) -> String {
    snake(&model.name)
}

/// The items of the model's module, formatted.
pub fn generate(model: &CheckedModel) -> Result<String, Vec<Diagnostic>> {
    let items = generate_items(model)?;
    format_tokens(items, model)
}

/// Formats generated items; a token stream that is not valid Rust is a generator bug, reported
/// as a diagnostic rather than a panic.
pub(crate) fn format_tokens(
    items: TokenStream,
    model: &CheckedModel,
) -> Result<String, Vec<Diagnostic>> {
    match syn::parse2::<syn::File>(items) {
        Ok(file) => Ok(prettyplease::unparse(&file)),
        Err(e) => Err(vec![Diagnostic::new(
            "lmx::codegen::internal",
            format!("the code generator produced invalid Rust: {e}"),
            model.ast.header,
            "while generating this model",
        )]),
    }
}

/// The module `pub mod foo { ... }` of a model, with `doc` as its documentation.
pub fn generate_module(model: &CheckedModel, doc: &str) -> Result<TokenStream, Vec<Diagnostic>> {
    let items = generate_items(model)?;
    let name = format_ident!("{}", module_name(model));
    let doc = if doc.is_empty() {
        format!("The `{}` model, compiled from its `.lmx` file.", model.name)
    } else {
        doc.to_string()
    };
    let lines = doc.lines().map(|l| format!(" {l}"));
    // A guarded parameter is the place `(*field.as_ref().ok_or_else(..)?)` (`forward::guarded`),
    // which each use borrows as it borrows an unguarded one: `&(*..)` is then intended, also
    // where a use reads a leaf of a guarded group (`&(*..).weight`).
    Ok(quote! {
        #(#[doc = #lines])*
        #[allow(clippy::borrow_deref_ref, clippy::explicit_auto_deref)]
        pub mod #name { #items }
    })
}

/// The module's items as tokens.
pub fn generate_items(model: &CheckedModel) -> Result<TokenStream, Vec<Diagnostic>> {
    let g = Gen::new(model);
    g.items().map_err(|d| vec![d])
}

/// What a block's forward pass needs from its callers.
#[derive(Debug, Clone)]
pub(crate) struct BlockInfo {
    /// It reads `pass` (configuration, offset, attention, or blocks that do).
    pub needs_pass: bool,
    /// Per block argument, whether its forward pass reads it.
    pub args_used: Vec<bool>,
    /// Whether it reads the configuration.
    pub uses_config: bool,
    /// Whether it uses `pass.positions`.
    pub uses_offset: bool,
    /// Whether it attends.
    pub attends: bool,
    /// Whether it runs a recurrence.
    pub recurs: bool,
    /// Whether it draws dropout masks.
    pub drops: bool,
    /// Whether it applies a linear layer (whose adapter's dropout draws masks).
    pub linears: bool,
    /// Whether it applies a linear layer through `nn::linear_plus_in`, with `pass.ctx`.
    pub linear_plus: bool,
    /// Whether it applies linear layers to one input together (`pass.linears`).
    pub shares_input: bool,
    /// Whether it applies a stacked experts layer (whose adapters' dropout draws masks).
    pub experts: bool,
    /// Whether it gives a buffer its next value.
    pub writes: bool,
    /// Whether its forward pass takes `residual: Option<nn::Residual>`, added to the output of its
    /// last call, a linear layer (`x + block(..)` at a call site).
    pub takes_residual: bool,
    /// The `impl` with its forward method.
    pub code: TokenStream,
}

/// A config enum: the setting's name, the Rust type's name, and the variants (`.lmx` name, Rust
/// name).
pub(crate) type EnumDef = (String, String, Vec<(String, String)>);

/// The generator of one model.
pub(crate) struct Gen<'m> {
    pub model: &'m CheckedModel,
    /// Every identifier of the source, which temporaries avoid.
    pub taken: Vec<String>,
    /// Config enums: setting name, Rust type name, variants (`.lmx` name, Rust name).
    pub enums: Vec<EnumDef>,
    /// Rust struct name per block.
    pub structs: HashMap<String, String>,
    infos: RefCell<HashMap<String, BlockInfo>>,
    /// The first error met while translating a block.
    block_errors: RefCell<Option<Diagnostic>>,
}

impl<'m> Gen<'m> {
    fn new(model: &'m CheckedModel) -> Self {
        let taken = identifiers(model);
        let mut reserved: Vec<String> = [
            "Config",
            "Params",
            "Pass",
            "TrainState",
            "Array",
            "Context",
            "Keys",
            "Result",
            "Error",
            "Option",
            "Vec",
            "Some",
            "None",
            "Ok",
            "Err",
            "String",
            "Box",
            "Default",
            "Tree",
            "Scope",
            "LeafRole",
            "LeafSpec",
            "FieldAttrs",
            "LanguageModel",
            "TrainingStep",
            "StepOptions",
            "PRESETS",
            "Self",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        reserved.push(model.name.clone());
        for s in &model.steps {
            reserved.push(camel(&s.name));
        }
        let mut enums = Vec::new();
        for item in &model.config {
            if let StaticTy::Enum(variants) = &item.ty {
                let name = names::fresh(&camel(&item.name), "Kind", &reserved);
                reserved.push(name.clone());
                let vs = variants.iter().map(|v| (v.clone(), camel(v))).collect();
                enums.push((item.name.clone(), name, vs));
            }
        }
        let mut structs = HashMap::new();
        for b in &model.blocks {
            let name = names::fresh(&camel(&b.name), "Block", &reserved);
            reserved.push(name.clone());
            structs.insert(b.name.clone(), name);
        }
        Gen {
            model,
            taken,
            enums,
            structs,
            infos: RefCell::new(HashMap::new()),
            block_errors: RefCell::new(None),
        }
    }

    fn items(&self) -> R<TokenStream> {
        let config = config::config(self)?;
        for b in &self.model.blocks {
            self.block_info(&b.name);
        }
        if let Some(err) = self.block_errors.borrow_mut().take() {
            return Err(err);
        }
        let params = params::params(self)?;
        let model = self.model_items()?;
        let steps = step::steps(self)?;
        let body = quote! { #config #params #model #steps };
        let imports = imports(&body);
        Ok(quote! { #imports #body })
    }

    /// An enum variant by its `.lmx` name: the enum's Rust type and the variant's path.
    pub fn variant(&self, name: &str) -> Option<(String, TokenStream)> {
        self.enums.iter().find_map(|(_, ty, vs)| {
            vs.iter().find(|(v, _)| v == name).map(|(_, rust)| {
                let (t, v) = (format_ident!("{}", ty), format_ident!("{}", rust));
                (ty.clone(), quote!(#t::#v))
            })
        })
    }

    /// The Rust type of a static type.
    pub fn stype(&self, ty: &StaticTy) -> SType {
        match ty {
            StaticTy::Int(_) => SType::Int,
            StaticTy::Float => SType::Float,
            StaticTy::Bool => SType::Bool,
            StaticTy::Str => SType::Str,
            StaticTy::Enum(variants) => SType::Enum(
                self.enums
                    .iter()
                    .find(|(_, _, vs)| vs.iter().map(|(v, _)| v).eq(variants.iter()))
                    .map(|(_, t, _)| t.clone())
                    .unwrap_or_default(),
            ),
        }
    }

    /// Rust tokens of a static type in a signature.
    pub fn stype_tokens(&self, ty: &SType) -> TokenStream {
        match ty {
            SType::Int => quote!(i64),
            SType::Float => quote!(f64),
            SType::Bool => quote!(bool),
            SType::Str => quote!(&str),
            SType::Enum(name) => {
                let id = format_ident!("{}", name);
                quote!(#id)
            }
        }
    }

    /// The type of argument `i` of `block`.
    pub fn arg_type(&self, block: &str, i: usize) -> SType {
        self.model
            .block(block)
            .and_then(|b| b.args.get(i))
            .map(|(_, ty, _)| self.stype(ty))
            .unwrap_or(SType::Int)
    }

    /// The configuration's names: settings as `config.name`, derived values as `config.name()`.
    pub fn globals(&self) -> Env {
        self.globals_at(quote!(config))
    }

    /// The configuration's names as fields and methods of `recv`.
    pub fn globals_at(&self, recv: TokenStream) -> Env {
        let mut env = Env::new();
        for item in &self.model.config {
            let f = ident(&snake(&item.name));
            let tokens = if item.derived {
                quote!(#recv.#f())
            } else {
                quote!(#recv.#f)
            };
            let mut ty = self.stype(&item.ty);
            if let Some((_, name, _)) = self.enums.iter().find(|(n, _, _)| n == &item.name) {
                ty = SType::Enum(name.clone());
            }
            env.bind(&item.name, Binding::new(Val::Static(ty), tokens));
        }
        env
    }

    /// The Rust struct name of a block.
    pub fn struct_name(&self, block: &str) -> proc_macro2::Ident {
        format_ident!(
            "{}",
            self.structs
                .get(block)
                .cloned()
                .unwrap_or_else(|| camel(block))
        )
    }

    /// The module a parameter entry is, reached at `place`, declared in `decl`.
    pub fn module(
        &self,
        entry: &ParamEntry,
        place: TokenStream,
        decl: &Env,
        span: Span,
    ) -> R<Module> {
        Ok(match &entry.node {
            ParamNode::Layer { kind, args } => Module::Layer {
                kind: *kind,
                tied: false,
                place,
                args: args.clone(),
                decl: decl.clone(),
            },
            ParamNode::Block { block, args } => Module::Block {
                block: block.clone(),
                place,
                args: args.clone(),
                decl: decl.clone(),
            },
            ParamNode::List {
                block,
                args,
                var,
                start,
                ..
            } => Module::List {
                block: block.clone(),
                place,
                args: args.clone(),
                var: var.clone(),
                start: (**start).clone(),
                decl: decl.clone(),
            },
            ParamNode::Group(tree) => Module::Group {
                tree: tree.clone(),
                place,
                decl: decl.clone(),
            },
            ParamNode::Tensor { .. } => return Err(unsupported(span, "calling a raw tensor")),
            ParamNode::Tied { target } => {
                let root = self.tied_root(decl);
                let (tree, root_place) =
                    root.ok_or_else(|| unsupported(span, "this tied weight"))?;
                let (entry, place) = resolve_path(&tree, root_place, target)
                    .ok_or_else(|| unsupported(span, "this tied weight"))?;
                match &entry.node {
                    ParamNode::Layer { kind, args } => Module::Layer {
                        kind: *kind,
                        tied: true,
                        place,
                        args: args.clone(),
                        decl: decl.clone(),
                    },
                    _ => return Err(unsupported(span, "a tied weight of this kind")),
                }
            }
        })
    }

    /// The tree tied paths start from, found through the declaring environment's marker.
    fn tied_root(&self, decl: &Env) -> Option<(ParamTree, TokenStream)> {
        let b = decl.get(TREE_MARKER)?;
        match &b.val {
            Val::Module(m) => match m.as_ref() {
                Module::Group { tree, place, .. } => Some((tree.clone(), place.clone())),
                _ => None,
            },
            _ => None,
        }
    }

    /// The environment of a parameter tree's own names: `globals` plus the entries at `place`.
    pub fn tree_env(&self, base: Env, tree: &ParamTree, place: TokenStream) -> R<Env> {
        let mut env = base;
        env.bind(
            TREE_MARKER,
            Binding::new(
                Val::Module(Box::new(Module::Group {
                    tree: tree.clone(),
                    place: place.clone(),
                    decl: Env::new(),
                })),
                TokenStream::new(),
            ),
        );
        let decl = env.clone();
        let fields = field_names(tree);
        for (entry, f) in tree.entries.iter().zip(&fields) {
            let field_place = if entry.guard.is_some() {
                forward::guarded(quote!(#place.#f), &entry.name)
            } else {
                quote!(#place.#f)
            };
            if matches!(entry.node, ParamNode::Tensor { .. }) {
                env.bind(&entry.name, Binding::new(Val::Tensor, quote!(#place.#f)));
                continue;
            }
            let m = self.module(entry, field_place, &decl, Span::new(0, 0))?;
            env.bind(
                &entry.name,
                Binding::new(Val::Module(Box::new(m)), TokenStream::new()),
            );
        }
        Ok(env)
    }

    /// What a block's forward pass needs (translating it on first use).
    pub fn block_info(&self, block: &str) -> BlockInfo {
        if let Some(info) = self.infos.borrow().get(block) {
            return info.clone();
        }
        let info = match self.block_forward(block) {
            Ok(info) => info,
            Err(d) => {
                let mut errors = self.block_errors.borrow_mut();
                if errors.is_none() {
                    *errors = Some(d);
                }
                BlockInfo {
                    needs_pass: false,
                    args_used: Vec::new(),
                    uses_config: false,
                    uses_offset: false,
                    attends: false,
                    recurs: false,
                    drops: false,
                    linears: false,
                    linear_plus: false,
                    shares_input: false,
                    experts: false,
                    writes: false,
                    takes_residual: false,
                    code: TokenStream::new(),
                }
            }
        };
        self.infos
            .borrow_mut()
            .insert(block.to_string(), info.clone());
        info
    }

    fn block_forward(&self, block: &str) -> R<BlockInfo> {
        let ir = self
            .model
            .block(block)
            .ok_or_else(|| unsupported(self.model.ast.header, "an unknown block"))?;
        let ast = self
            .model
            .ast
            .blocks
            .iter()
            .find(|b| b.name.name == block)
            .ok_or_else(|| unsupported(self.model.ast.header, "an unknown block"))?;
        let mut base = self.globals();
        let mut arg_flags = Vec::new();
        for (i, (name, _, _)) in ir.args.iter().enumerate() {
            let id = ident(name);
            let b = Binding::new(Val::Static(self.arg_type(block, i)), quote!(#id));
            arg_flags.push(b.used.clone());
            base.bind(name, b);
        }
        let env = self.tree_env(base, &ir.params, quote!(self))?;
        let mut fx = Fx::new(self, Site::Block, env);
        fx.residual_tail = forward::residual_tail(&ast.forward.body);
        let (prelude, inputs) = fx.inputs(&ast.forward)?;
        let tail = fx.stmts(&ast.forward.body)?;
        let tail = match tail {
            Some(x) => fx.owned_tensor(x, ast.forward.span)?,
            None => {
                return Err(unsupported(
                    ast.forward.span,
                    "a forward pass without a value",
                ))
            }
        };
        let tail = fx.ok(tail);
        let stmts = forward::render(fx.bodies.pop().unwrap_or_default());
        let name = self.struct_name(block);
        let mut sig = vec![quote!(&self)];
        if fx.uses_config {
            fx.uses_pass = true;
        }
        if fx.uses_pass {
            sig.push(quote!(pass: &mut Pass<'_>));
        }
        let mut args_used = Vec::new();
        for (i, (arg, _, _)) in ir.args.iter().enumerate() {
            let used = arg_flags[i].get();
            args_used.push(used);
            if used {
                let id = ident(arg);
                let ty = self.stype_tokens(&self.arg_type(block, i));
                sig.push(quote!(#id: #ty));
            }
        }
        sig.extend(inputs);
        if fx.takes_residual {
            sig.push(quote!(residual: Option<nn::Residual<'_>>));
        }
        let config = if fx.uses_config {
            quote!(let config = pass.config;)
        } else {
            TokenStream::new()
        };
        let doc = format!(" The forward pass of block `{block}`.");
        let code = quote! {
            impl #name {
                #[doc = #doc]
                pub fn forward(#(#sig),*) -> Result<Array> {
                    #config
                    #prelude
                    #stmts
                    #tail
                }
            }
        };
        Ok(BlockInfo {
            needs_pass: fx.uses_pass,
            args_used,
            uses_config: fx.uses_config,
            uses_offset: fx.uses_offset,
            attends: fx.attends,
            recurs: fx.recurs,
            drops: fx.drops,
            linears: fx.linears,
            linear_plus: fx.linear_plus,
            shares_input: fx.shares_input,
            experts: fx.experts,
            writes: fx.writes,
            takes_residual: fx.takes_residual,
            code,
        })
    }

    /// Whether any forward pass uses `flag`.
    fn any_block(&self, flag: impl Fn(&BlockInfo) -> bool) -> bool {
        self.infos.borrow().values().any(flag)
    }

    fn model_items(&self) -> R<TokenStream> {
        let ast =
            self.model.ast.forward.as_ref().ok_or_else(|| {
                unsupported(self.model.ast.header, "a model without a forward pass")
            })?;
        let env = self.tree_env(self.globals(), &self.model.params, quote!(params))?;
        let mut fx = Fx::new(self, Site::Root, env);
        let (prelude, inputs) = fx.inputs(ast)?;
        let tail = fx.stmts(&ast.body)?;
        let tail = match tail {
            Some(x) => fx.owned_tensor(x, ast.span)?,
            None => return Err(unsupported(ast.span, "a forward pass without a value")),
        };
        let stmts = forward::render(fx.bodies.pop().unwrap_or_default());
        let blocks: Vec<TokenStream> = self
            .model
            .blocks
            .iter()
            .map(|b| self.block_info(&b.name).code)
            .collect();

        let has_config = self.any_block(|b| b.uses_config);
        let has_offset = fx.uses_offset || self.any_block(|b| b.uses_offset);
        let has_attention = fx.attends || self.any_block(|b| b.attends);
        let has_scan = fx.recurs || self.any_block(|b| b.recurs);
        let has_dropout = fx.drops || self.any_block(|b| b.drops);
        let has_linear = fx.linears || self.any_block(|b| b.linears);
        let has_linear_plus = fx.linear_plus || self.any_block(|b| b.linear_plus);
        let has_shared = fx.shares_input || self.any_block(|b| b.shares_input);
        let has_experts = fx.experts || self.any_block(|b| b.experts);
        let has_writes = fx.writes || self.any_block(|b| b.writes);
        let has_ctx = has_attention
            || has_scan
            || has_dropout
            || has_linear
            || has_linear_plus
            || has_shared
            || has_experts
            || has_writes;
        let any_pass = fx.uses_pass || self.any_block(|b| b.needs_pass);
        let first_input = inputs_names(ast).into_iter().next().unwrap_or_default();
        let first = ident(&first_input);
        let advance_on = if has_ctx {
            quote!(pass.ctx)
        } else {
            quote!(ctx)
        };
        let mut pass_fields = Vec::new();
        let mut pass_init = Vec::new();
        if has_config {
            pass_fields.push(quote!(#[doc = " The configuration."] config: &'a Config,));
            pass_init.push(quote!(config,));
        }
        if has_offset {
            pass_fields.push(quote!(#[doc = " Where this call's positions start (an array: a traced decode step reads it as an input) and how many keys its attention sees."] positions: nn::Positions,));
            pass_init.push(quote!(positions: ctx.positions(#first.dim(-1)),));
        }
        if has_ctx {
            let doc = match (
                has_attention || has_scan,
                has_dropout || has_linear || has_shared || has_experts || has_writes,
            ) {
                (true, true) => {
                    " The runtime context: the key-value cache during generation, the dropout key \
                     in training."
                }
                (true, false) => " The runtime context (the key-value cache during generation).",
                _ => " The runtime context (the dropout key in training).",
            };
            pass_fields.push(quote!(#[doc = #doc] ctx: &'a mut Context,));
            pass_init.push(quote!(ctx,));
        }
        if has_attention {
            pass_fields.push(quote!(#[doc = " Attention calls so far: the cache slot of the next one."] attention: usize,));
            pass_init.push(quote!(attention: 0,));
        }
        if has_scan {
            pass_fields.push(quote!(#[doc = " Recurrent calls so far: the cache slot of the next one's state."] recurrent: usize,));
            pass_init.push(quote!(recurrent: 0,));
        }
        let lifetime = if has_config || has_ctx {
            quote!(<'a>)
        } else {
            TokenStream::new()
        };
        let pass_struct = if any_pass {
            let attend = has_attention.then(|| {
                quote! {
                    /// Attention over this call's queries, keys and values, in the next cache slot.
                    fn attend(&mut self, q: &Array, k: &Array, v: &Array, options: nn::AttentionOptions<'_>) -> Result<Array> {
                        let layer = self.attention;
                        self.attention += 1;
                        nn::attend(self.ctx, layer, q, k, v, options)
                    }
                }
            });
            let dropout = has_dropout.then(|| {
                quote! {
                    /// Dropout with probability `p`: on in a training step, off otherwise.
                    fn dropout(&mut self, x: &Array, p: f32) -> Result<Array> {
                        nn::dropout(x, p, self.ctx)
                    }
                }
            });
            let linear = has_linear.then(|| {
                quote! {
                    /// A linear layer, its adapter's dropout on in a training step.
                    fn linear(&mut self, params: &nn::LinearParams, x: &Array) -> Result<Array> {
                        nn::linear_in(params, x, self.ctx)
                    }
                }
            });
            let shared = has_shared.then(|| {
                quote! {
                    /// Linear layers applied to one input, as one product where that pays, their
                    /// adapters' dropout on in a training step.
                    fn linears<const N: usize>(
                        &mut self,
                        params: [&nn::LinearParams; N],
                        x: &Array,
                    ) -> Result<[Array; N]> {
                        nn::linears_in(params, x, self.ctx)
                    }
                }
            });
            let experts = has_experts.then(|| {
                quote! {
                    /// A stacked experts layer, its adapters' dropout on in a training step.
                    fn experts(
                        &mut self,
                        params: &nn::SwitchGluParams,
                        x: &Array,
                        indices: &Array,
                    ) -> Result<Array> {
                        nn::experts_in(params, x, indices, self.ctx)
                    }
                }
            });
            let scan = has_scan.then(|| {
                quote! {
                    /// The runtime context and the next recurrent slot, for a recurrence's call
                    /// (`ssd`, `gated_delta`, `causal_conv1d`) to keep its state in.
                    fn recurrent(&mut self) -> (&mut Context, usize) {
                        self.recurrent += 1;
                        (&mut *self.ctx, self.recurrent - 1)
                    }
                }
            });
            let write = has_writes.then(|| {
                quote! {
                    /// Gives `buffer` its next value, which a training step writes into its
                    /// state after the update (dropped outside a training step).
                    fn write_buffer(&mut self, buffer: &Array, value: &Array) -> Result<()> {
                        self.ctx.write_buffer(buffer, value)
                    }
                }
            });
            let methods = if has_ctx {
                quote!(impl Pass<'_> { #attend #scan #dropout #linear #shared #experts #write })
            } else {
                TokenStream::new()
            };
            // Code outside the module (a `Backbone` that runs the blocks up to the hidden
            // states) starts a pass as `forward` does; the caller advances `ctx` after it.
            let mut new_params = Vec::new();
            if has_config {
                new_params.push(quote!(config: &'a Config));
            }
            if has_ctx {
                new_params.push(quote!(ctx: &'a mut Context));
            } else if has_offset {
                new_params.push(quote!(ctx: &Context));
            }
            if has_offset {
                new_params.push(quote!(#first: &Array));
            }
            quote! {
                /// What a forward pass threads through its blocks.
                pub struct Pass #lifetime { #(#pass_fields)* }
                impl #lifetime Pass #lifetime {
                    /// The state of a forward pass over `tokens`, as `forward` starts it.
                    #[allow(clippy::new_without_default)]
                    pub fn new(#(#new_params),*) -> Self {
                        Pass { #(#pass_init)* }
                    }
                }
                #methods
            }
        } else {
            TokenStream::new()
        };
        let pass_let = if fx.uses_pass || any_pass && fx.pass_mut {
            if fx.pass_mut {
                quote!(let mut pass = Pass { #(#pass_init)* };)
            } else {
                quote!(let pass = Pass { #(#pass_init)* };)
            }
        } else {
            TokenStream::new()
        };
        let advance = if pass_let.is_empty() {
            quote!(ctx.advance(#first.dim(-1));)
        } else {
            quote!(#advance_on.advance(#first.dim(-1));)
        };
        let model = format_ident!("{}", self.model.name);
        let name = module_name(self.model);
        let vocab = self.output_size()?;
        let context = self.context_len();
        let forward_inputs = inputs.clone();
        // Every declared step, by type, for a program to register by name (`--step NAME`).
        let step_types = self
            .model
            .steps
            .iter()
            .map(|step| format_ident!("{}", camel(&step.name)));
        let declared_steps = (!self.model.steps.is_empty()).then(|| {
            quote! {
                fn declared_steps<V: ::lmx::runtime::model::StepVisitor<Self>>(visitor: &mut V) {
                    #(visitor.visit::<#step_types>();)*
                }
            }
        });
        let model_doc = format!(
            " The `{}` model: configuration, parameters, initialisation and forward pass.",
            self.model.name
        );
        Ok(quote! {
            #pass_struct
            #(#blocks)*

            /// Fresh parameters for `config`, drawn from `seed` (MLX's default initialisers);
            /// fails on a configuration that breaks the model's rules (`Config::validate`).
            pub fn init(config: &Config, seed: u64) -> Result<Params> {
                config.validate()?;
                let mut keys = Keys::from_seed(seed)?;
                Params::init(config, &mut keys)
            }

            /// Logits for the tokens; attention reads and extends `ctx`'s cache.
            pub fn forward(params: &Params, config: &Config, #(#forward_inputs,)* ctx: &mut Context) -> Result<Array> {
                #pass_let
                #prelude
                #stmts
                let logits = #tail;
                #advance
                Ok(logits)
            }

            #[doc = #model_doc]
            #[derive(Clone, Copy, Debug, Default)]
            pub struct #model;

            impl LanguageModel for #model {
                type Config = Config;
                type Params = Params;
                const NAME: &'static str = #name;

                fn presets() -> &'static [&'static str] {
                    PRESETS
                }

                fn preset(name: &str) -> Option<Config> {
                    Config::preset(name)
                }

                fn validate(config: &Config) -> Result<()> {
                    config.validate()
                }

                fn init(config: &Config, seed: u64) -> Result<Params> {
                    init(config, seed)
                }

                fn forward(params: &Params, config: &Config, tokens: &Array, ctx: &mut Context) -> Result<Array> {
                    forward(params, config, tokens, ctx)
                }

                fn vocab_size(config: &Config) -> usize {
                    #vocab
                }

                fn context_len(config: &Config) -> usize {
                    #context
                }

                #declared_steps
            }
        })
    }

    /// `vocab_size`: the last dimension of the forward pass's declared output.
    fn output_size(&self) -> R<TokenStream> {
        let out = self
            .model
            .ast
            .forward
            .as_ref()
            .and_then(|f| f.output.as_ref())
            .and_then(|o| o.shape.last().cloned());
        match out {
            Some(e) => {
                let mut fx = Fx::new(self, Site::Root, self.globals());
                let (s, ty) = fx.static_expr(&e)?;
                Ok(forward::cast(&s, &ty, "usize"))
            }
            None => Err(unsupported(
                self.model.ast.header,
                "a forward pass without a declared output",
            )),
        }
    }

    /// `context_len`: the config value named `ctx`, `max_seq_len`, `seq_len` or `context`.
    fn context_len(&self) -> TokenStream {
        ["ctx", "max_seq_len", "seq_len", "context"]
            .iter()
            .find_map(|n| {
                self.model
                    .config
                    .iter()
                    .find(|c| c.name == *n && matches!(c.ty, StaticTy::Int(_)))
            })
            .map(|c| {
                let f = ident(&snake(&c.name));
                if c.derived {
                    quote!(config.#f() as usize)
                } else {
                    quote!(config.#f as usize)
                }
            })
            .unwrap_or_else(|| {
                quote!({
                    let _ = config;
                    usize::MAX
                })
            })
    }
}

/// The name under which a tree environment records its own tree (not a valid `.lmx` name).
const TREE_MARKER: &str = "#tree";

/// The entry at `path` below `tree` (at `place`), and its place.
fn resolve_path(
    tree: &ParamTree,
    place: TokenStream,
    path: &[String],
) -> Option<(ParamEntry, TokenStream)> {
    let (first, rest) = path.split_first()?;
    let fields = field_names(tree);
    let idx = tree.entries.iter().position(|e| &e.name == first)?;
    let entry = &tree.entries[idx];
    let f = &fields[idx];
    let place = quote!(#place.#f);
    if rest.is_empty() {
        return Some((entry.clone(), place));
    }
    match &entry.node {
        ParamNode::Group(sub) => resolve_path(sub, place, rest),
        _ => None,
    }
}

/// The Rust field names of a tree's entries (snake case, unique, keywords escaped); tied
/// entries, which have no field, get a placeholder they never use.
pub(crate) fn field_names(tree: &ParamTree) -> Vec<proc_macro2::Ident> {
    let mut taken: Vec<String> = Vec::new();
    tree.entries
        .iter()
        .map(|e| {
            if matches!(e.node, ParamNode::Tied { .. }) {
                return format_ident!("tied");
            }
            let name = names::fresh(&snake(&e.name), "_", &taken);
            taken.push(name.clone());
            ident(&name)
        })
        .collect()
}

fn inputs_names(f: &crate::ast::Forward) -> Vec<String> {
    f.inputs.iter().map(|i| i.name.name.clone()).collect()
}

/// Every name written in the model's source.
fn identifiers(model: &CheckedModel) -> Vec<String> {
    fn walk(e: &Expr, out: &mut Vec<String>) {
        match &e.kind {
            ExprKind::Name(n) => out.push(n.clone()),
            ExprKind::List(items) => items.iter().for_each(|i| walk(i, out)),
            ExprKind::Unary(_, a) => walk(a, out),
            ExprKind::Binary(_, _, a, b) => {
                walk(a, out);
                walk(b, out);
            }
            ExprKind::Call(c, args) => {
                walk(c, out);
                args.iter().for_each(|a| walk(&a.value, out));
            }
            ExprKind::Member(t, f) => {
                walk(t, out);
                out.push(f.name.clone());
            }
            ExprKind::Index(t, _) => walk(t, out),
            ExprKind::If(c, a, b) => {
                walk(c, out);
                body(a, out);
                if let Some(b) = b {
                    body(b, out);
                }
            }
            _ => {}
        }
    }
    fn body(b: &crate::ast::Body, out: &mut Vec<String>) {
        use crate::ast::StmtKind;
        for s in &b.stmts {
            match &s.kind {
                StmtKind::Let(names, e) => {
                    out.extend(names.iter().map(|n| n.name.clone()));
                    walk(e, out);
                }
                StmtKind::Assign(n, e) => {
                    out.push(n.name.clone());
                    walk(e, out);
                }
                StmtKind::For(vars, r, b) => {
                    out.extend(vars.iter().map(|n| n.name.clone()));
                    walk(&r.start, out);
                    body(b, out);
                }
                StmtKind::Expr(e) | StmtKind::Update(e) => walk(e, out),
                StmtKind::Next(target, e) => {
                    walk(target, out);
                    walk(e, out);
                }
                _ => {}
            }
        }
    }
    let mut out: Vec<String> = vec![
        "config".into(),
        "pass".into(),
        "params".into(),
        "keys".into(),
        "logits".into(),
    ];
    for b in &model.ast.blocks {
        out.extend(b.forward.inputs.iter().map(|i| i.name.name.clone()));
        body(&b.forward.body, &mut out);
        out.extend(b.args.iter().map(|a| a.name.name.clone()));
    }
    if let Some(f) = &model.ast.forward {
        out.extend(f.inputs.iter().map(|i| i.name.name.clone()));
        body(&f.body, &mut out);
    }
    for s in &model.ast.steps {
        out.extend(s.inputs.iter().map(|i| i.name.name.clone()));
        body(&s.body, &mut out);
    }
    out.extend(model.config.iter().map(|c| c.name.clone()));
    out.sort();
    out.dedup();
    out
}

/// `use` lines for the runtime items the generated code mentions.
fn imports(body: &TokenStream) -> TokenStream {
    let text = body.to_string();
    let words: std::collections::HashSet<&str> = text
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .collect();
    let has = |w: &str| words.contains(w);
    let mut out = TokenStream::new();
    let mut mlx = Vec::new();
    if text.contains("ops ::") {
        mlx.push(quote!(ops));
    }
    if has("Array") {
        mlx.push(quote!(Array));
    }
    if !mlx.is_empty() {
        out.extend(quote!(use ::lmx::runtime::mlx_rs::{#(#mlx),*};));
    }
    let used = |names: &[&str]| -> Vec<TokenStream> {
        names
            .iter()
            .filter(|w| has(w))
            .map(|w| {
                let id = format_ident!("{}", w);
                quote!(#id)
            })
            .collect()
    };
    let model = used(&["Context", "LanguageModel", "TrainingStep"]);
    if !model.is_empty() {
        out.extend(quote!(use ::lmx::runtime::model::{#(#model),*};));
    }
    let mut nn = Vec::new();
    if text.contains("nn ::") {
        nn.push(quote!(self));
    }
    if has("Keys") {
        nn.push(quote!(init::Keys));
    }
    if !nn.is_empty() {
        out.extend(quote!(use ::lmx::runtime::nn::{#(#nn),*};));
    }
    let mut tree = used(&["FieldAttrs", "LeafRole", "LeafSpec", "Scope"]);
    // `#[derive(::lmx::Tree)]` names the derive, not the trait.
    if text
        .replace(":: lmx :: Tree", "")
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .any(|w| w == "Tree")
    {
        tree.push(quote!(Tree));
    }
    if !tree.is_empty() {
        out.extend(quote!(use ::lmx::runtime::tree::{#(#tree),*};));
    }
    let mut root = Vec::new();
    if text.contains("optim ::") {
        root.push(quote!(optim));
    }
    if has("StepOptions") {
        root.push(quote!(step::StepOptions));
    }
    if has("Error") {
        root.push(quote!(Error));
    }
    if has("Result") {
        root.push(quote!(Result));
    }
    if !root.is_empty() {
        out.extend(quote!(use ::lmx::runtime::{#(#root),*};));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model whose step declares `optimizer`.
    fn with_optimizer(optimizer: &str) -> String {
        format!(
            "model Tiny {{
                config {{ vocab: int = 16 }}
                params {{ wte: embedding(vocab, 8) proj: linear(8, vocab) }}
                forward(tokens: [B, T] int) -> [B, T, vocab] {{ proj(wte(tokens)) }}
                step train(tokens: [B, T] int, targets: [B, T] int) {{
                    optimizer {optimizer}
                    let loss = cross_entropy(forward(tokens), targets)
                    let grads = grad(loss)
                    update grads
                }}
            }}"
        )
    }

    #[test]
    fn adafactor_settings_reach_the_runtime_optimizer_and_the_rest_keep_mlx_defaults() {
        let source =
            with_optimizer("adafactor(beta1 = 0.9, relative_step = false, clip_threshold = 2.0)");
        let model = crate::compile_str(&source).expect("checks");
        let code: String = generate(&model)
            .expect("generates")
            .split_whitespace()
            .collect();
        let expected = "optim::Adafactor{eps_square:1e-30,eps_scale:0.001,clip_threshold:2.0,\
                        decay_rate:-0.8,beta1:Some(0.9),weight_decay:0.0,scale_parameter:true,\
                        relative_step:false,warmup_init:false,}";
        assert!(code.contains(expected), "{code}");
        let defaults: String =
            generate(&crate::compile_str(&with_optimizer("adafactor()")).unwrap())
                .unwrap()
                .split_whitespace()
                .collect();
        assert!(defaults.contains("beta1:None,"), "{defaults}");
        assert!(defaults.contains("relative_step:true,"), "{defaults}");
    }

    /// Linear layers called on one input, the block's own or a local bound in the body, are
    /// applied together where the first is; one on another input is applied alone.
    #[test]
    fn linear_layers_on_one_input_are_applied_together() {
        let source = "model Par {
            config { vocab: int = 16 }
            block B {
                params { norm: layer_norm(8) q: linear(8, 8) k: linear(8, 4) o: linear(8, 8) }
                forward(x: [B, T, 8]) -> [B, T, 8] {
                    let h = norm(x)
                    let a = q(h)
                    let b = k(h)
                    o(a) + x
                }
            }
            params { wte: embedding(vocab, 8) layers: [B; 2] head: linear(8, vocab) }
            forward(tokens: [B, T] int) -> [B, T, vocab] {
                let x = wte(tokens)
                for layer in layers { x = layer(x) }
                head(x)
            }
        }";
        let code: String = generate(&crate::compile_str(source).expect("checks"))
            .expect("generates")
            .split_whitespace()
            .collect();
        assert!(
            code.contains("let[q_out,k_out]=pass.linears([&self.q,&self.k],&h)?;"),
            "{code}"
        );
        assert!(code.contains("pass.linear(&self.o,"), "{code}");
    }

    #[test]
    fn every_bundled_model_generates_valid_rust() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../models");
        for entry in std::fs::read_dir(dir).expect("models/ exists") {
            let path = entry.expect("readable").path();
            if path.extension().is_some_and(|e| e == "lmx") {
                let source = std::fs::read_to_string(&path).expect("readable");
                let model = crate::compile_str(&source).expect("bundled models check");
                let code = generate(&model).unwrap_or_else(|d| {
                    panic!(
                        "{}",
                        crate::render(&d, &path.display().to_string(), &source)
                    )
                });
                assert!(
                    code.contains("impl LanguageModel for"),
                    "{}",
                    path.display()
                );
            }
        }
    }
}
