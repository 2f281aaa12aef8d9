//! The parameter tree: one struct per block and group, generic over the leaf, each a `Tree`
//! field by field, and its initialisation.

use proc_macro2::{Ident, TokenStream};
use quote::{format_ident, quote};

use super::forward::{cast, is_zero, unsupported, Binding, Fx, SType, Site, Val, R};
use super::names::{camel, fresh, ident};
use super::{field_names, Gen};
use crate::ast::Expr;
use crate::ir::{Init, LayerKind, ParamNode, ParamTree};

/// Every parameter struct with its `Tree` impl and `init`.
pub(crate) fn params(g: &Gen<'_>) -> R<TokenStream> {
    let mut out = TokenStream::new();
    let mut groups: Vec<String> = g.structs.values().cloned().collect();
    groups.extend(["Params", "Config", "Pass"].map(String::from));
    groups.extend(g.enums.iter().map(|(_, n, _)| n.clone()));
    let doc = format!(
        " The parameters of `{}`, with leaves of type `T` (arrays, gradients, optimizer state).",
        g.model.name
    );
    let root = Container {
        name: format_ident!("Params"),
        doc,
        args: Vec::new(),
    };
    container(g, &root, &g.model.params, &mut groups, &mut out)?;
    for b in &g.model.blocks {
        let c = Container {
            name: g.struct_name(&b.name),
            doc: format!(" The parameters of block `{}`.", b.name),
            args: b
                .args
                .iter()
                .enumerate()
                .map(|(i, (n, _, _))| (n.clone(), g.arg_type(&b.name, i)))
                .collect(),
        };
        container(g, &c, &b.params, &mut groups, &mut out)?;
    }
    Ok(out)
}

struct Container {
    name: Ident,
    doc: String,
    /// Static arguments of `init` (a block's arguments).
    args: Vec<(String, SType)>,
}

/// The struct of `tree`, its nested groups' structs, its `Tree` impl and (for blocks and the
/// root) its `init`.
fn container(
    g: &Gen<'_>,
    c: &Container,
    tree: &ParamTree,
    groups: &mut Vec<String>,
    out: &mut TokenStream,
) -> R<()> {
    let group_names = struct_tree(g, &c.name, &c.doc, tree, "", groups, out)?;
    // init
    let mut env = g.globals();
    let mut flags = Vec::new();
    for (name, ty) in &c.args {
        let id = ident(name);
        let b = Binding::new(Val::Static(ty.clone()), quote!(#id));
        flags.push(b.used.clone());
        env.bind(name, b);
    }
    let mut fx = Fx::new(g, Site::Block, env);
    let mut keys_used = false;
    let value = init_struct(&mut fx, &c.name, tree, &group_names, &mut keys_used)?;
    let mut sig = vec![if fx.uses_config {
        quote!(config: &Config)
    } else {
        quote!(_config: &Config)
    }];
    for ((name, ty), used) in c.args.iter().zip(&flags) {
        let id = if used.get() {
            ident(name)
        } else {
            format_ident!("_{}", name)
        };
        let ty = g.stype_tokens(ty);
        sig.push(quote!(#id: #ty));
    }
    sig.push(if keys_used {
        quote!(keys: &mut Keys)
    } else {
        quote!(_keys: &mut Keys)
    });
    let name = &c.name;
    out.extend(quote! {
        impl #name {
            /// Fresh parameters as MLX initialises its layers: linear weights and biases uniform
            /// in `±1/sqrt(input)`, embeddings normal with standard deviation `1/sqrt(dim)`, norms ones (and zeros).
            pub fn init(#(#sig),*) -> Result<Self> {
                Ok(#value)
            }
        }
    });
    Ok(())
}

/// Declares the struct `name` of `tree` and those of its groups; returns the group struct names
/// by entry index.
fn struct_tree(
    g: &Gen<'_>,
    name: &Ident,
    doc: &str,
    tree: &ParamTree,
    path: &str,
    groups: &mut Vec<String>,
    out: &mut TokenStream,
) -> R<Vec<Option<GroupNames>>> {
    let fields = field_names(tree);
    let mut group_names = Vec::new();
    let mut defs = Vec::new();
    for (entry, f) in tree.entries.iter().zip(&fields) {
        let dotted = if path.is_empty() {
            entry.name.clone()
        } else {
            format!("{path}.{}", entry.name)
        };
        let mut group = None;
        let ty = match &entry.node {
            ParamNode::Tied { .. } => {
                group_names.push(None);
                continue;
            }
            ParamNode::Layer { kind, .. } => {
                let t = format_ident!(
                    "{}",
                    match kind {
                        LayerKind::Embedding => "EmbeddingParams",
                        LayerKind::Linear => "LinearParams",
                        LayerKind::LayerNorm => "LayerNormParams",
                        LayerKind::RmsNorm => "RmsNormParams",
                        LayerKind::Experts => "SwitchGluParams",
                    }
                );
                quote!(nn::#t<T>)
            }
            ParamNode::Tensor { .. } => quote!(T),
            ParamNode::Block { block, .. } => {
                let s = g.struct_name(block);
                quote!(#s<T>)
            }
            ParamNode::List { block, .. } => {
                let s = g.struct_name(block);
                quote!(Vec<#s<T>>)
            }
            ParamNode::Group(sub) => {
                let gname = fresh(
                    &format!("{}Group", camel(&dotted.replace('.', "_"))),
                    "Params",
                    groups,
                );
                groups.push(gname.clone());
                let gid = format_ident!("{}", gname);
                let gdoc = format!(" The parameter group `{dotted}`.");
                let nested = struct_tree(g, &gid, &gdoc, sub, &dotted, groups, out)?;
                group = Some(GroupNames {
                    name: gid.clone(),
                    nested,
                });
                quote!(#gid<T>)
            }
        };
        let guarded = entry.guard.is_some();
        let fdoc = format!(
            " `{dotted}`{}",
            if guarded {
                " (present when its guard holds)"
            } else {
                ""
            }
        );
        let full_ty = if guarded { quote!(Option<#ty>) } else { ty };
        // The leaf name is the `.lmx` name, whatever Rust field name it took.
        let rename = (*f != entry.name.as_str()).then(|| {
            let seg = &entry.name;
            quote!(#[lmx(rename = #seg)])
        });
        // A buffer is a leaf of its own role: never trained, decayed or given optimizer state.
        let role = matches!(entry.node, ParamNode::Tensor { buffer: true, .. })
            .then(|| quote!(#[lmx(role = buffer)]));
        // The entry's marks, as a person writes them on a `#[lmx::model]` field.
        let frozen = entry.marks.frozen.then(|| quote!(#[lmx(frozen)]));
        let no_decay = entry.marks.no_decay.then(|| quote!(#[lmx(no_decay)]));
        defs.push(quote!(#[doc = #fdoc] #rename #role #frozen #no_decay pub #f: #full_ty,));
        group_names.push(group);
    }
    if defs.is_empty() {
        return Err(unsupported(
            g.model.ast.header,
            &format!("`{name}` without parameters of its own"),
        ));
    }
    // `Tree` comes from the one generator of tree impls, `#[derive(lmx::Tree)]`, as for
    // `#[lmx::model]` structs and the runtime's layers.
    out.extend(quote! {
        #[doc = #doc]
        #[derive(Clone, Debug, PartialEq, ::lmx::Tree)]
        pub struct #name<T = Array> { #(#defs)* }
    });
    Ok(group_names)
}

/// The Rust struct names of a group and of its nested groups.
struct GroupNames {
    name: Ident,
    nested: Vec<Option<GroupNames>>,
}

/// The struct literal initialising `tree`.
fn init_struct(
    fx: &mut Fx<'_, '_>,
    name: &Ident,
    tree: &ParamTree,
    groups: &[Option<GroupNames>],
    keys_used: &mut bool,
) -> R<TokenStream> {
    let fields = field_names(tree);
    let mut values = Vec::new();
    for ((entry, f), group) in tree.entries.iter().zip(&fields).zip(groups) {
        let span = g_span(fx);
        let value = match &entry.node {
            ParamNode::Tied { .. } => continue,
            ParamNode::Layer { kind, args } => {
                let arg = |n: &str| -> R<Expr> {
                    args.iter()
                        .find(|(a, _)| a == n)
                        .map(|(_, e)| e.clone())
                        .ok_or_else(|| unsupported(span, "a layer without this argument"))
                };
                match kind {
                    LayerKind::Embedding => {
                        let (n, d) = (fx.i32_expr(&arg("count")?)?, fx.i32_expr(&arg("dim")?)?);
                        *keys_used = true;
                        match arg("std") {
                            Ok(std) if !is_zero(&std) => {
                                let std = fx.f32_expr(&std)?;
                                quote!(nn::init::embedding_normal(#n, #d, #std, keys)?)
                            }
                            _ => quote!(nn::init::embedding(#n, #d, keys)?),
                        }
                    }
                    LayerKind::Linear => {
                        let i = fx.i32_expr(&arg("input")?)?;
                        let o = fx.i32_expr(&arg("output")?)?;
                        let b = fx.static_expr(&arg("bias")?)?.0.ts;
                        *keys_used = true;
                        let linear = match arg("std") {
                            Ok(std) if !is_zero(&std) => {
                                let std = fx.f32_expr(&std)?;
                                quote!(nn::init::linear_normal(#i, #o, #b, #std, keys)?)
                            }
                            _ => quote!(nn::init::linear(#i, #o, #b, keys)?),
                        };
                        // Without an adapter the initialisation draws no more keys than before.
                        match arg("lora_rank") {
                            Ok(rank) if !is_zero(&rank) => {
                                let rank = fx.i32_expr(&rank)?;
                                let scale = fx.f32_expr(&arg("lora_scale")?)?;
                                quote!(nn::init::with_adapter(#linear, #rank, #scale, keys)?)
                            }
                            _ => linear,
                        }
                    }
                    LayerKind::LayerNorm => {
                        let d = fx.i32_expr(&arg("dim")?)?;
                        let b = fx.static_expr(&arg("bias")?)?.0.ts;
                        quote!(nn::init::layer_norm(#d, #b)?)
                    }
                    LayerKind::RmsNorm => {
                        let d = fx.i32_expr(&arg("dim")?)?;
                        match arg("offset") {
                            Ok(offset) if !is_zero(&offset) => {
                                let offset = fx.f32_expr(&offset)?;
                                quote!(nn::init::rms_norm_with_offset(#d, #offset)?)
                            }
                            _ => quote!(nn::init::rms_norm(#d)?),
                        }
                    }
                    LayerKind::Experts => {
                        let d = fx.i32_expr(&arg("dim")?)?;
                        let h = fx.i32_expr(&arg("hidden")?)?;
                        let n = fx.i32_expr(&arg("count")?)?;
                        *keys_used = true;
                        quote!(nn::init::experts(#d, #h, #n, keys)?)
                    }
                }
            }
            ParamNode::Tensor { shape, init, .. } => tensor_init(fx, shape, init, keys_used)?,
            ParamNode::Block { block, args } => {
                let call_args = block_args(fx, block, args)?;
                let s = fx.g.struct_name(block);
                *keys_used = true;
                quote!(#s::init(config, #(#call_args,)* keys)?)
            }
            ParamNode::List {
                block,
                args,
                var,
                start,
                end,
            } => {
                let (start, _) = fx.static_expr(start)?;
                let (end, _) = fx.static_expr(end)?;
                fx.env.push();
                let var_used = var.as_ref().map(|v| {
                    let b = Binding::new(Val::Static(SType::Int), {
                        let id = ident(v);
                        quote!(#id)
                    });
                    let used = b.used.clone();
                    fx.env.bind(v, b);
                    used
                });
                let call_args = block_args(fx, block, args);
                fx.env.pop();
                let call_args = call_args?;
                let pat = match (var, var_used) {
                    (Some(v), Some(used)) if used.get() => {
                        let id = ident(v);
                        quote!(#id)
                    }
                    _ => quote!(_),
                };
                let s = fx.g.struct_name(block);
                *keys_used = true;
                let (start, end) = (start.at(7), end.at(7));
                quote!((#start..#end).map(|#pat| #s::init(config, #(#call_args,)* keys)).collect::<Result<_>>()?)
            }
            ParamNode::Group(sub) => {
                let names = group
                    .as_ref()
                    .ok_or_else(|| unsupported(span, "this group"))?;
                init_struct(fx, &names.name, sub, &names.nested, keys_used)?
            }
        };
        let value = match &entry.guard {
            Some(guard) => {
                let c = fx.static_expr(guard)?.0.ts;
                quote!(if #c { Some(#value) } else { None })
            }
            None => value,
        };
        values.push(quote!(#f: #value,));
    }
    Ok(quote!(#name { #(#values)* }))
}

fn g_span(fx: &Fx<'_, '_>) -> crate::span::Span {
    fx.g.model.ast.header
}

/// The arguments of `Block::init`: every block argument, given or defaulted.
fn block_args(fx: &mut Fx<'_, '_>, block: &str, args: &[(String, Expr)]) -> R<Vec<TokenStream>> {
    let span = g_span(fx);
    let ir =
        fx.g.model
            .block(block)
            .ok_or_else(|| unsupported(span, "this block"))?;
    let mut out = Vec::new();
    for (i, (name, _, default)) in ir.args.iter().enumerate() {
        let want = fx.g.arg_type(block, i);
        let (s, ty) = match args.iter().find(|(n, _)| n == name) {
            Some((_, e)) => fx.static_expr(e)?,
            None => {
                let d = default
                    .as_ref()
                    .ok_or_else(|| unsupported(span, "a block argument without a value"))?;
                let globals = fx.g.globals();
                fx.static_in(d, &globals)?
            }
        };
        out.push(match want {
            SType::Str => {
                let s = s.ts;
                quote!(&#s)
            }
            _ => super::forward::convert(&s, &ty, &want),
        });
    }
    Ok(out)
}

/// A raw tensor's initialiser.
fn tensor_init(
    fx: &mut Fx<'_, '_>,
    shape: &[Expr],
    init: &Init,
    keys_used: &mut bool,
) -> R<TokenStream> {
    let dims = shape
        .iter()
        .map(|d| fx.i32_expr(d))
        .collect::<R<Vec<_>>>()?;
    let mut arg = |n: &str, default: f64| -> R<TokenStream> {
        match init.args.iter().find(|(a, _)| a == n) {
            Some((_, e)) => {
                let (s, ty) = fx.static_expr(e)?;
                Ok(cast(&s, &ty, "f32"))
            }
            None => Ok(super::forward::cast(
                &super::forward::S {
                    ts: TokenStream::new(),
                    prec: 10,
                    lit: Some(default),
                },
                &SType::Float,
                "f32",
            )),
        }
    };
    Ok(match init.name.as_str() {
        "zeros" => quote!(nn::init::zeros(&[#(#dims),*])?),
        "ones" => quote!(nn::init::ones(&[#(#dims),*])?),
        "uniform" => {
            let (low, high) = (arg("low", -0.1)?, arg("high", 0.1)?);
            *keys_used = true;
            quote!(::lmx::runtime::mlx_rs::random::uniform::<f32, f32>(#low, #high, &[#(#dims),*], &keys.next()?)?)
        }
        _ => {
            let (std, mean) = (arg("std", 0.02)?, arg("mean", 0.0)?);
            *keys_used = true;
            if mean.to_string() == "0.0" {
                quote!(nn::init::normal(&[#(#dims),*], #std, &keys.next()?)?)
            } else {
                quote!(nn::init::normal(&[#(#dims),*], #std, &keys.next()?)?.add(Array::from_f32(#mean))?)
            }
        }
    })
}
