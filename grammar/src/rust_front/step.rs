//! `#[lmx::step]`: a loss function over tensors becomes a training step over a declared state.
//!
//! The function reads the parameter tree with `Tensor` leaves (`&Llama<Tensor>`), the batch
//! (`&Tensor` arguments, in order), static configuration (any other argument) and, optionally,
//! the forward pass's context (`ctx: &mut Context`: attention, positions, dropout drawing from
//! the step's key), and returns its loss. Its body is checked by
//! [`taint::check`](super::taint::check).
//!
//! With `optimizer = O` the step is a training step: a unit struct implementing the runtime's
//! `TrainingStep` for the model the tree implements `LanguageModel` for, exactly as a `.lmx`
//! file's `step` does, so `Trainer`, checkpoints and the CLI run it. Its configuration argument,
//! if any, is the model's `Config`. Without an optimizer it is an evaluation step: a unit struct
//! whose `call` runs the function on arrays.

use super::options::{self, take_lmx_attrs, Optimizer};
use super::taint;
use proc_macro2::TokenStream;
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Expr, FnArg, Ident, ItemFn, Pat, PathArguments, Type, TypePath};

/// What `#[lmx::step(...)]` says.
struct StepArgs {
    krate: syn::Path,
    optimizer: Option<Optimizer>,
    clip_norm: Option<Expr>,
    accumulate: Option<Expr>,
    /// `frozen(reference = policy, ..)`: the frozen models, each a copy of the policy.
    frozen: Vec<Ident>,
    /// `metrics(kl, ..)`: the step's own metrics, which the function returns after its loss.
    metrics: Vec<Ident>,
    /// `buffers`: the step's forward passes write the model's buffers
    /// (`Context::write_buffer`), which the compiled step writes into its state.
    buffers: Option<Ident>,
}

impl StepArgs {
    fn parse(args: TokenStream, attrs: &mut Vec<syn::Attribute>) -> syn::Result<StepArgs> {
        let mut out = StepArgs {
            krate: options::default_krate(),
            optimizer: None,
            clip_norm: None,
            accumulate: None,
            frozen: Vec::new(),
            metrics: Vec::new(),
            buffers: None,
        };
        options::parse(args, attrs, |meta| {
            if meta.path.is_ident("crate") {
                out.krate = options::krate(&meta)?;
            } else if meta.path.is_ident("optimizer") {
                out.optimizer = Some(Optimizer::parse(&meta)?);
            } else if meta.path.is_ident("clip_norm") {
                out.clip_norm = Some(meta.value()?.parse()?);
            } else if meta.path.is_ident("accumulate") {
                out.accumulate = Some(meta.value()?.parse()?);
            } else if meta.path.is_ident("frozen") {
                meta.parse_nested_meta(|model| {
                    let name = model.path.require_ident()?.clone();
                    let source: Ident = model.value()?.parse()?;
                    if source != "policy" {
                        return Err(syn::Error::new(
                            source.span(),
                            format!(
                                "a frozen model is a copy of the policy: `frozen({name} = policy)`; \
                                 a teacher is given to `lmx train --teacher DIR`"
                            ),
                        ));
                    }
                    if out.frozen.contains(&name) {
                        return Err(syn::Error::new(
                            name.span(),
                            format!("frozen model `{name}` is declared twice"),
                        ));
                    }
                    out.frozen.push(name);
                    Ok(())
                })?;
            } else if meta.path.is_ident("buffers") {
                out.buffers = meta.path.get_ident().cloned();
            } else if meta.path.is_ident("metrics") {
                meta.parse_nested_meta(|metric| {
                    let name = metric.path.require_ident()?.clone();
                    if name == "loss" || out.metrics.contains(&name) {
                        return Err(syn::Error::new(
                            name.span(),
                            format!(
                                "metric `{name}` is declared twice (the loss is always reported)"
                            ),
                        ));
                    }
                    out.metrics.push(name);
                    Ok(())
                })?;
            } else {
                return Err(meta.error(
                    "expected `crate = \"path\"`, `optimizer = Type`, `clip_norm = number`, `accumulate = count`, \
                     `frozen(name = policy)`, `metrics(name, ..)` or `buffers`",
                ));
            }
            Ok(())
        })?;
        if out.optimizer.is_none() {
            if let Some(frozen) = out.frozen.first() {
                return Err(syn::Error::new(
                    frozen.span(),
                    "frozen models belong to a training step: name its `optimizer`",
                ));
            }
            if let Some(metric) = out.metrics.first() {
                return Err(syn::Error::new(
                    metric.span(),
                    "metrics belong to a training step: name its `optimizer`",
                ));
            }
            if let Some(buffers) = &out.buffers {
                return Err(syn::Error::new(
                    buffers.span(),
                    "buffers are written by a training step: name its `optimizer`",
                ));
            }
            if let Some(setting) = out.clip_norm.as_ref().or(out.accumulate.as_ref()) {
                return Err(syn::Error::new_spanned(
                    setting,
                    "`clip_norm` and `accumulate` belong to a training step: name its `optimizer`",
                ));
            }
        }
        Ok(out)
    }
}

/// Expands `#[lmx::step(args)]` on `item`.
pub fn expand(args: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let mut item: ItemFn = syn::parse2(item)?;
    let args = StepArgs::parse(args, &mut item.attrs)?;
    let signature = Signature::analyze(&mut item, args.optimizer.is_some(), &args.frozen)?;
    let mut tensors = vec![signature.params.ident.clone()];
    tensors.extend(signature.frozen.iter().map(|arg| arg.ident.clone()));
    tensors.extend(signature.batch.iter().map(|arg| arg.ident.clone()));
    let errors = taint::check(&tensors, &item.block);
    if let Some(err) = errors.into_iter().reduce(|mut all, err| {
        all.combine(err);
        all
    }) {
        return Err(err);
    }
    Ok(signature.generate(&item, &args))
}

/// One argument of the step.
struct Arg {
    ident: Ident,
    /// The type with the outer reference removed.
    ty: Type,
    by_ref: bool,
}

/// The step's arguments, by what they are.
struct Signature {
    /// The parameter tree, and its type with `Array` leaves (`Llama` for `&Llama<Tensor>`).
    params: Arg,
    params_ty: Type,
    batch: Vec<Arg>,
    config: Vec<Arg>,
    /// The frozen models, in the order `frozen(..)` declares them.
    frozen: Vec<Arg>,
    /// The forward pass's context, `ctx: &mut Context`.
    context: Option<Ident>,
}

impl Signature {
    fn analyze(item: &mut ItemFn, training: bool, frozen: &[Ident]) -> syn::Result<Signature> {
        let sig = &mut item.sig;
        if !sig.generics.params.is_empty() {
            return Err(syn::Error::new(
                sig.generics.span(),
                "a step takes no generic parameters",
            ));
        }
        let mut args = Vec::new();
        let mut context = None;
        let mut errors = Vec::new();
        for input in &mut sig.inputs {
            let FnArg::Typed(arg) = input else {
                errors.push(syn::Error::new(
                    input.span(),
                    "a step is a free function, not a method",
                ));
                continue;
            };
            for attr in take_lmx_attrs(&mut arg.attrs) {
                errors.push(syn::Error::new_spanned(
                    attr,
                    "a step's arguments take no `#[lmx(...)]` attributes: dropout draws from the step's key through `ctx: &mut Context`",
                ));
            }
            let Pat::Ident(pat) = &*arg.pat else {
                errors.push(syn::Error::new(
                    arg.pat.span(),
                    "a step's arguments are plain names",
                ));
                continue;
            };
            let (ty, by_ref) = match &*arg.ty {
                Type::Reference(reference)
                    if reference.mutability.is_some() && is_named(&reference.elem, "Context") =>
                {
                    if context.is_some() {
                        errors.push(syn::Error::new(pat.ident.span(), "a step has one context"));
                    }
                    context = Some(pat.ident.clone());
                    continue;
                }
                Type::Reference(reference) if reference.mutability.is_some() => {
                    errors.push(syn::Error::new_spanned(
                        reference,
                        format!(
                            "a step cannot mutate `{}`: what a step changes is its compiled state, which the macro \
                             declares (parameters, the optimizer's state for every trainable parameter, step count, \
                             random key), and a step only returns its loss\nhelp: read the parameters as \
                             `&Params<Tensor>` and name the optimizer with `#[lmx::step(optimizer = ...)]`",
                            pat.ident
                        ),
                    ));
                    continue;
                }
                Type::Reference(reference) => ((*reference.elem).clone(), true),
                ty => (ty.clone(), false),
            };
            args.push(Arg {
                ident: pat.ident.clone(),
                ty,
                by_ref,
            });
        }
        if let Some(err) = errors.into_iter().reduce(|mut all, err| {
            all.combine(err);
            all
        }) {
            return Err(err);
        }

        let mut args = args.into_iter();
        let params_error = || {
            syn::Error::new(
                sig.inputs.span(),
                "the first argument of a step is its parameter tree, e.g. `params: &Llama<Tensor>`",
            )
        };
        let params = args.next().ok_or_else(params_error)?;
        let params_ty = array_leaves(&params.ty)
            .filter(|_| params.by_ref)
            .ok_or_else(params_error)?;
        let mut signature = Signature {
            params,
            params_ty,
            batch: Vec::new(),
            config: Vec::new(),
            frozen: Vec::new(),
            context,
        };
        for arg in args {
            // A second parameter tree is in the step's state only as a declared frozen model.
            if array_leaves(&arg.ty).is_some() {
                if !frozen.contains(&arg.ident) {
                    return Err(syn::Error::new(
                        arg.ident.span(),
                        format!(
                            "`{0}` is a second parameter tree, which the step's declared state does not \
                             hold: a step trains one tree, its first argument\nhelp: declare a frozen copy \
                             of the policy, read without gradients or optimizer state: \
                             `#[lmx::step(frozen({0} = policy), ..)]`",
                            arg.ident
                        ),
                    ));
                }
                if !arg.by_ref || arg.ty != signature.params.ty {
                    let (params, ty) = (&signature.params.ty, &arg.ty);
                    return Err(syn::Error::new(
                        arg.ty.span(),
                        format!(
                            "a frozen copy of the policy is read as the policy is: `&{}`, not `{}{}`",
                            quote!(#params),
                            if arg.by_ref { "&" } else { "" },
                            quote!(#ty)
                        ),
                    ));
                }
                signature.frozen.push(arg);
                continue;
            }
            match (is_named(&arg.ty, "Tensor"), arg.by_ref) {
                (true, true) => signature.batch.push(arg),
                (true, false) => {
                    return Err(syn::Error::new(
                        arg.ty.span(),
                        "a step reads tensors by reference: `&Tensor`",
                    ))
                }
                (false, by_ref) if training && (!by_ref || !signature.config.is_empty()) => {
                    return Err(syn::Error::new(
                        arg.ty.span(),
                        "a training step's configuration is one argument, its model's configuration by \
                         reference (`config: &LlamaConfig`), which the trainer passes",
                    ))
                }
                (false, _) => signature.config.push(arg),
            }
        }
        if let Some(missing) = frozen
            .iter()
            .find(|name| !signature.frozen.iter().any(|arg| arg.ident == **name))
        {
            return Err(syn::Error::new(
                missing.span(),
                format!(
                    "frozen model `{missing}` is declared but the step takes no argument `{missing}`\n\
                     help: read it beside the policy: `{missing}: &{}`",
                    {
                        let ty = &signature.params.ty;
                        quote!(#ty)
                    }
                ),
            ));
        }
        // In the order of the declaration, which is the order of the step's state.
        signature
            .frozen
            .sort_by_key(|arg| frozen.iter().position(|name| *name == arg.ident));
        Ok(signature)
    }

    fn generate(&self, item: &ItemFn, args: &StepArgs) -> TokenStream {
        let krate = &args.krate;
        let rt = quote!(#krate::runtime);
        let vis = &item.vis;
        let function = &item.sig.ident;
        let function_name = function.to_string();
        let name = format_ident!("{}", camel_case(&function_name), span = function.span());
        let params_ty = &self.params_ty;
        let batch: Vec<&Ident> = self.batch.iter().map(|arg| &arg.ident).collect();
        let batch_len = proc_macro2::Literal::usize_unsuffixed(batch.len());
        // The user's function takes its arguments in its own order.
        let call_args: Vec<TokenStream> = item
            .sig
            .inputs
            .iter()
            .enumerate()
            .map(|(index, input)| {
                let FnArg::Typed(arg) = input else {
                    unreachable!("methods were rejected")
                };
                let Pat::Ident(pat) = &*arg.pat else {
                    unreachable!("patterns were rejected")
                };
                let ident = &pat.ident;
                if index == 0 || self.frozen.iter().any(|arg| arg.ident == *ident) {
                    quote!(#ident)
                } else if self.context.as_ref() == Some(ident) {
                    quote!(ctx)
                } else if let Some(config) = self.config.iter().find(|c| c.ident == *ident) {
                    if config.by_ref {
                        quote!(#ident)
                    } else {
                        quote!(::std::clone::Clone::clone(#ident))
                    }
                } else {
                    quote!(&#ident)
                }
            })
            .collect();
        let params = &self.params.ident;
        let ctx = match self.context {
            Some(_) => quote!(ctx),
            None => quote!(_),
        };
        let frozen: Vec<&Ident> = self.frozen.iter().map(|arg| &arg.ident).collect();
        let mut call = quote!(#function(#(#call_args),*));
        if !frozen.is_empty() {
            // The frozen trees reach the function over tensors, as the policy does.
            call = quote!({
                #(let #frozen = &#rt::tensor::graph(#frozen);)*
                #call
            });
        }
        let run = if let Some(buffers) = &args.buffers {
            // The function returns `(loss, metric, ..)` or the loss alone; the buffers' next
            // values follow, from its forward passes' writes.
            let metrics = &args.metrics;
            let tuple = match metrics.is_empty() {
                true => quote_spanned!(buffers.span()=> __loss),
                false => quote_spanned!(item.sig.output.span()=> (__loss, #(#metrics),*)),
            };
            quote! {
                #rt::tensor::host::loss_metrics_and_buffers::<_, #batch_len>(
                    #function_name,
                    #params,
                    batch,
                    key,
                    |#params, [#(#batch),*], #ctx| {
                        let #tuple = #call?;
                        ::std::result::Result::Ok(::std::vec![__loss, #(#metrics),*])
                    },
                )
            }
        } else if args.metrics.is_empty() {
            quote! {
                #rt::tensor::host::loss::<_, #batch_len>(
                    #function_name,
                    #params,
                    batch,
                    key,
                    |#params, [#(#batch),*], #ctx| #call,
                )
            }
        } else {
            // The function returns `(loss, metric, ..)`, in the declared order.
            let metrics = &args.metrics;
            let tuple = quote_spanned! {item.sig.output.span()=>
                (__loss, #(#metrics),*)
            };
            quote! {
                #rt::tensor::host::loss_and_metrics::<_, #batch_len>(
                    #function_name,
                    #params,
                    batch,
                    key,
                    |#params, [#(#batch),*], #ctx| {
                        let #tuple = #call?;
                        ::std::result::Result::Ok(::std::vec![__loss, #(#metrics),*])
                    },
                )
            }
        };

        let mut fn_item = item.clone();
        fn_item.attrs.retain(|attr| !attr.path().is_ident("lmx"));

        let Some(optimizer) = &args.optimizer else {
            let config: Vec<&Ident> = self.config.iter().map(|arg| &arg.ident).collect();
            let config_tys: Vec<&Type> = self.config.iter().map(|arg| &arg.ty).collect();
            let (key_arg, key_doc) = match self.context {
                Some(_) => (
                    quote!(key: ::std::option::Option<&#rt::Array>,),
                    " Dropout draws from `key`, and is off when it is `None`.",
                ),
                None => (quote!(), ""),
            };
            let key_value = match self.context {
                Some(_) => quote!(),
                None => quote!(let key = ::std::option::Option::None;),
            };
            let doc = format!("The evaluation step [`{function}`] at the host boundary.");
            let call_doc = format!(
                "[`{function}`] run on arrays, eagerly or inside a `TrainStep`'s loss.{key_doc}"
            );
            return quote! {
                #fn_item

                #[doc = #doc]
                #vis struct #name;

                impl #name {
                    #[doc = #call_doc]
                    #vis fn call(
                        #params: &#params_ty,
                        #(#batch: &#rt::Array,)*
                        #(#config: &#config_tys,)*
                        #key_arg
                    ) -> #rt::Result<#rt::Array> {
                        let batch = &[#(::std::clone::Clone::clone(#batch)),*];
                        #key_value
                        #run
                    }
                }
            };
        };

        let Optimizer {
            ty: optimizer_ty,
            value: optimizer_value,
        } = optimizer;
        let config_binding = match self.config.first() {
            Some(arg) => {
                let ident = &arg.ident;
                quote!(#ident)
            }
            None => quote!(_config),
        };
        let clip = match &args.clip_norm {
            Some(clip) => quote!(::std::option::Option::Some(#clip)),
            None => quote!(::std::option::Option::None),
        };
        let accumulation = match &args.accumulate {
            Some(count) => quote!(#count),
            None => quote!(1),
        };
        let doc = format!(
            "The training step [`{function}`]: its loss, gradients of the trainable parameters, \
             clipping and the `{}` update, compiled over `TrainState<{}, {}>`.",
            quote!(#optimizer_ty),
            quote!(#params_ty),
            quote!(#optimizer_ty),
        );
        let assert_optimizer = quote_spanned! {optimizer_ty.span()=>
            const _: () = {
                #[diagnostic::on_unimplemented(
                    message = "`{Self}` is not an lmx optimizer: its state would live outside the compiled step",
                    label = "this optimizer's state is not part of the step's declared state",
                    note = "a compiled step carries the optimizer state of every trainable parameter in its state \
                            (`TrainState::opt`); an optimizer that keeps its own state (as mlx-rs optimizers do) \
                            would be captured as constants and never updated",
                    note = "use an optimizer of `lmx::runtime::optim` or implement `Optimizer` for this type"
                )]
                trait DeclaresItsState {}
                impl<O: #rt::optim::Optimizer> DeclaresItsState for O {}
                fn declares_its_state<O: DeclaresItsState>() {}
                let _ = declares_its_state::<#optimizer_ty>;
            };
        };

        let config_ty = quote!(<#params_ty as #rt::model::LanguageModel>::Config);
        let frozen_message = format!(
            "step `{function_name}` declares {} frozen models, got {{}}",
            frozen.len()
        );
        let take_frozen = (!frozen.is_empty()).then(|| {
            quote! {
                let [#(#frozen),*] = frozen else {
                    return ::std::result::Result::Err(#rt::Error::Layout(
                        ::std::format!(#frozen_message, frozen.len()),
                    ));
                };
            }
        });
        let values = args.metrics.is_empty() && args.buffers.is_none();
        let mut loss_fns = match (frozen.is_empty(), values) {
            (true, true) => quote! {
                fn loss(
                    #params: &#params_ty,
                    #config_binding: &#config_ty,
                    batch: &[#rt::Array],
                    key: ::std::option::Option<&#rt::Array>,
                ) -> #rt::Result<#rt::Array> {
                    #run
                }
            },
            (false, true) => quote! {
                fn frozen_loss(
                    #params: &#params_ty,
                    #config_binding: &#config_ty,
                    frozen: &[#params_ty],
                    batch: &[#rt::Array],
                    key: ::std::option::Option<&#rt::Array>,
                ) -> #rt::Result<#rt::Array> {
                    #take_frozen
                    #run
                }
            },
            (_, false) => {
                let names: Vec<String> = args.metrics.iter().map(|m| m.to_string()).collect();
                let frozen_arg = if frozen.is_empty() {
                    quote!(_)
                } else {
                    quote!(frozen)
                };
                // The loss alone is the first value; MLX computes nothing of the metrics that
                // nobody evaluates (validation).
                let loss_alone = if frozen.is_empty() {
                    quote! {
                        fn loss(
                            params: &#params_ty,
                            config: &#config_ty,
                            batch: &[#rt::Array],
                            key: ::std::option::Option<&#rt::Array>,
                        ) -> #rt::Result<#rt::Array> {
                            ::std::result::Result::Ok(
                                Self::loss_and_metrics(params, config, &[], batch, key)?.swap_remove(0),
                            )
                        }
                    }
                } else {
                    quote! {
                        fn frozen_loss(
                            params: &#params_ty,
                            config: &#config_ty,
                            frozen: &[#params_ty],
                            batch: &[#rt::Array],
                            key: ::std::option::Option<&#rt::Array>,
                        ) -> #rt::Result<#rt::Array> {
                            ::std::result::Result::Ok(
                                Self::loss_and_metrics(params, config, frozen, batch, key)?.swap_remove(0),
                            )
                        }
                    }
                };
                let declared = match (names.is_empty(), args.buffers.is_some()) {
                    (false, false) => {
                        quote!(const METRICS: &'static [&'static str] = &[#(#names),*];)
                    }
                    (true, _) => quote!(
                        const WRITES_BUFFERS: bool = true;
                    ),
                    (false, true) => quote! {
                        const METRICS: &'static [&'static str] = &[#(#names),*];
                        const WRITES_BUFFERS: bool = true;
                    },
                };
                quote! {
                    #declared

                    fn loss_and_metrics(
                        #params: &#params_ty,
                        #config_binding: &#config_ty,
                        #frozen_arg: &[#params_ty],
                        batch: &[#rt::Array],
                        key: ::std::option::Option<&#rt::Array>,
                    ) -> #rt::Result<::std::vec::Vec<#rt::Array>> {
                        #take_frozen
                        #run
                    }

                    #loss_alone
                }
            }
        };
        if let Some(first) = frozen.first() {
            let first = first.to_string();
            let names: Vec<String> = frozen.iter().map(|name| name.to_string()).collect();
            loss_fns.extend(quote! {
                const FROZEN: &'static [#rt::model::Frozen] = &[#(#rt::model::Frozen {
                    name: #names,
                    source: #rt::model::FrozenSource::Policy,
                }),*];

                fn loss(
                    _: &#params_ty,
                    _: &#config_ty,
                    _: &[#rt::Array],
                    _: ::std::option::Option<&#rt::Array>,
                ) -> #rt::Result<#rt::Array> {
                    ::std::result::Result::Err(#rt::Error::FrozenModelsMissing {
                        step: #function_name,
                        name: #first,
                    })
                }
            });
        }

        quote! {
            #fn_item

            #assert_optimizer

            #[doc = #doc]
            #[derive(Clone, Copy, Debug, Default)]
            #vis struct #name;

            impl #rt::model::TrainingStep for #name {
                type Model = #params_ty;
                type Optimizer = #optimizer_ty;

                const NAME: &'static str = #function_name;

                fn optimizer() -> #optimizer_ty {
                    #optimizer_value
                }

                fn options() -> #rt::step::StepOptions {
                    #rt::step::StepOptions {
                        clip_norm: #clip,
                        compile: true,
                        accumulation: #accumulation,
                        ..#rt::step::StepOptions::default()
                    }
                }

                #loss_fns
            }
        }
    }
}

/// `Llama` for `Llama<Tensor>`: the tree type with its default `Array` leaves.
fn array_leaves(ty: &Type) -> Option<Type> {
    let Type::Path(TypePath { qself: None, path }) = ty else {
        return None;
    };
    let mut path = path.clone();
    let last = path.segments.last_mut()?;
    match &last.arguments {
        PathArguments::AngleBracketed(args) if args.args.len() == 1 => {
            let syn::GenericArgument::Type(leaf) = args.args.first()? else {
                return None;
            };
            if !is_named(leaf, "Tensor") {
                return None;
            }
        }
        _ => return None,
    }
    last.arguments = PathArguments::None;
    Some(Type::Path(TypePath { qself: None, path }))
}

/// Whether `ty` is a path ending in `name` with no generic arguments (`Tensor`, `Context`).
fn is_named(ty: &Type, name: &str) -> bool {
    matches!(ty, Type::Path(TypePath { qself: None, path })
        if path.segments.last().is_some_and(|s| s.ident == name && s.arguments.is_empty()))
}

/// `train_loss` as `TrainLoss`.
fn camel_case(name: &str) -> String {
    name.split('_')
        .filter(|part| !part.is_empty())
        .map(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .map(|c| c.to_ascii_uppercase())
                .into_iter()
                .chain(chars)
                .collect::<String>()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand_str(args: TokenStream, item: &str) -> syn::Result<String> {
        let tokens = expand(args, item.parse().unwrap())?;
        Ok(prettyplease::unparse(&syn::parse2(tokens).unwrap()))
    }

    const LOSS: &str = "pub fn train_loss(params: &Mlp<Tensor>, x: &Tensor, config: &Config, \
                        ctx: &mut Context) -> Result<Tensor> { todo(params, x, config, ctx) }";

    #[test]
    fn a_training_step_implements_training_step() {
        let out = expand_str(
            quote!(
                optimizer = AdamW {
                    weight_decay: 0.1,
                    ..AdamW::default()
                },
                clip_norm = 1.0
            ),
            LOSS,
        )
        .unwrap();
        assert!(out.contains("pub struct TrainLoss;"), "{out}");
        assert!(
            out.contains("impl ::lmx::runtime::model::TrainingStep for TrainLoss"),
            "{out}"
        );
        assert!(out.contains("type Model = Mlp;"), "{out}");
        assert!(out.contains("type Optimizer = AdamW;"), "{out}");
        assert!(
            out.contains("const NAME: &'static str = \"train_loss\";"),
            "{out}"
        );
        assert!(out.contains("weight_decay: 0.1"), "{out}");
        assert!(
            out.contains("clip_norm: ::std::option::Option::Some(1.0)"),
            "{out}"
        );
        assert!(
            out.contains("config: &<Mlp as ::lmx::runtime::model::LanguageModel>::Config"),
            "{out}"
        );
        assert!(
            out.contains("|params, [x], ctx| train_loss(params, &x, config, ctx)"),
            "{out}"
        );
        assert!(!out.contains("#[lmx"), "{out}");
    }

    #[test]
    fn an_evaluation_step_runs_on_arrays() {
        let out = expand_str(
            quote!(crate = "my::lmx"),
            "fn eval(params: &Mlp<Tensor>, x: &Tensor, depth: usize) -> Result<Tensor> { x }",
        )
        .unwrap();
        assert!(!out.contains("TrainingStep"), "{out}");
        assert!(out.contains("struct Eval;"), "{out}");
        assert!(out.contains("depth: &usize,"), "{out}");
        assert!(
            out.contains("my::lmx::runtime::tensor::host::loss::<"),
            "{out}"
        );
        assert!(out.contains("::std::clone::Clone::clone(depth)"), "{out}");
    }

    #[test]
    fn a_training_step_reads_one_configuration_by_reference() {
        let err = expand_str(
            quote!(optimizer = AdamW),
            "fn s(params: &Mlp<Tensor>, x: &Tensor, config: &Config, clip: f32) -> Result<Tensor> { x }",
        )
        .err()
        .unwrap();
        assert!(err
            .to_string()
            .starts_with("a training step's configuration is one argument"));
    }

    #[test]
    fn mutable_arguments_are_rejected() {
        let err = expand_str(
            quote!(optimizer = AdamW),
            "fn s(params: &Mlp<Tensor>, moments: &mut Mlp<Tensor>) -> Result<Tensor> { x }",
        )
        .err()
        .unwrap();
        assert!(err
            .to_string()
            .starts_with("a step cannot mutate `moments`"));
    }

    #[test]
    fn settings_of_a_training_step_need_its_optimizer() {
        let err = expand_str(
            quote!(clip_norm = 1.0),
            "fn s(params: &Mlp<Tensor>) -> Result<Tensor> { x }",
        )
        .err()
        .unwrap();
        assert!(err.to_string().contains("name its `optimizer`"), "{err}");
    }

    #[test]
    fn the_first_argument_is_the_tree() {
        let err = expand_str(
            TokenStream::new(),
            "fn s(x: &Tensor) -> Result<Tensor> { x }",
        )
        .err()
        .unwrap();
        assert!(err.to_string().contains("parameter tree"));
    }

    const FROZEN: &str = "fn dpo(params: &Mlp<Tensor>, reference: &Mlp<Tensor>, x: &Tensor, \
                          config: &Config) -> Result<Tensor> { x }";

    #[test]
    fn a_frozen_copy_of_the_policy_is_in_the_declared_state() {
        let out = expand_str(
            quote!(optimizer = AdamW, frozen(reference = policy)),
            FROZEN,
        )
        .unwrap();
        assert!(
            out.contains("const FROZEN: &'static [::lmx::runtime::model::Frozen]"),
            "{out}"
        );
        assert!(out.contains("name: \"reference\""), "{out}");
        assert!(out.contains("fn frozen_loss("), "{out}");
        assert!(out.contains("let [reference] = frozen else"), "{out}");
        assert!(out.contains("FrozenModelsMissing"), "{out}");
        assert!(out.contains("dpo(params, reference, &x, config)"), "{out}");
    }

    #[test]
    fn frozen_models_are_declared_and_read_as_declared() {
        let error =
            |args: TokenStream, item: &str| expand_str(args, item).err().unwrap().to_string();
        let undeclared = error(quote!(optimizer = AdamW), FROZEN);
        assert!(
            undeclared.starts_with("`reference` is a second parameter tree, which the step's declared state does not hold"),
            "{undeclared}"
        );
        assert!(
            undeclared.contains("`#[lmx::step(frozen(reference = policy), ..)]`"),
            "{undeclared}"
        );
        let missing = error(
            quote!(optimizer = AdamW, frozen(teacher = policy)),
            "fn s(params: &Mlp<Tensor>, x: &Tensor) -> Result<Tensor> { x }",
        );
        assert!(
            missing.starts_with(
                "frozen model `teacher` is declared but the step takes no argument `teacher`"
            ),
            "{missing}"
        );
        let source = error(
            quote!(optimizer = AdamW, frozen(reference = checkpoint)),
            FROZEN,
        );
        assert!(
            source.starts_with("a frozen model is a copy of the policy"),
            "{source}"
        );
        let twice = error(
            quote!(
                optimizer = AdamW,
                frozen(reference = policy, reference = policy)
            ),
            FROZEN,
        );
        assert_eq!(twice, "frozen model `reference` is declared twice");
        let evaluation = error(quote!(frozen(reference = policy)), FROZEN);
        assert!(evaluation.contains("name its `optimizer`"), "{evaluation}");
        let other = error(
            quote!(optimizer = AdamW, frozen(reference = policy)),
            "fn s(params: &Mlp<Tensor>, reference: &Big<Tensor>, x: &Tensor) -> Result<Tensor> { x }",
        );
        assert_eq!(
            other,
            "a frozen copy of the policy is read as the policy is: `&Mlp < Tensor >`, not `&Big < Tensor >`"
        );
    }

    const METRICS: &str = "fn s(params: &Mlp<Tensor>, x: &Tensor, config: &Config) \
                           -> Result<(Tensor, Tensor)> { x }";

    #[test]
    fn metrics_are_returned_after_the_loss() {
        let out = expand_str(quote!(optimizer = AdamW, metrics(kl)), METRICS).unwrap();
        assert!(
            out.contains("const METRICS: &'static [&'static str] = &[\"kl\"]"),
            "{out}"
        );
        assert!(out.contains("fn loss_and_metrics("), "{out}");
        assert!(out.contains("host::loss_and_metrics"), "{out}");
        let error =
            |args: TokenStream, item: &str| expand_str(args, item).err().unwrap().to_string();
        assert_eq!(
            error(quote!(optimizer = AdamW, metrics(kl, kl)), METRICS),
            "metric `kl` is declared twice (the loss is always reported)"
        );
        assert_eq!(
            error(quote!(optimizer = AdamW, metrics(loss)), METRICS),
            "metric `loss` is declared twice (the loss is always reported)"
        );
        assert_eq!(
            error(quote!(metrics(kl)), METRICS),
            "metrics belong to a training step: name its `optimizer`"
        );
    }

    #[test]
    fn names() {
        assert_eq!(camel_case("train_loss"), "TrainLoss");
        assert_eq!(camel_case("eval"), "Eval");
    }
}
