//! `#[lmx::step]`: a loss function over tensors becomes a compiled step over a declared state.
//!
//! The function reads the parameter tree with `Tensor` leaves (`&Llama<Tensor>`), the batch
//! (`&Tensor` arguments, in order), optionally the step's random key (`#[lmx(rng)] key: &Tensor`)
//! and static configuration (any other argument), and returns its loss. Its body is checked by
//! [`taint::check`](super::taint::check). With `optimizer = O`, the macro declares the compiled
//! state, `TrainState<Params, O>` (parameters, the optimizer's state for every trainable
//! parameter, the step count and the random key; the learning rate is an input of each call),
//! and a struct that compiles the step over it with `TrainStep`.

use super::options::{take_lmx_attrs, Accepts, Options};
use super::taint;
use proc_macro2::TokenStream;
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, Ident, ItemFn, Pat, PathArguments, Type, TypePath};

/// Expands `#[lmx::step(args)]` on `item`.
pub fn expand(args: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let mut item: ItemFn = syn::parse2(item)?;
    let options = Options::parse(args, &mut item.attrs, Accepts::CrateAndOptimizer)?;
    let signature = Signature::analyze(&mut item)?;
    let mut tensors = vec![signature.params.ident.clone()];
    tensors.extend(signature.batch.iter().map(|arg| arg.ident.clone()));
    tensors.extend(signature.rng.iter().map(|arg| arg.ident.clone()));
    let errors = taint::check(&tensors, &item.block);
    if let Some(err) = errors.into_iter().reduce(|mut all, err| {
        all.combine(err);
        all
    }) {
        return Err(err);
    }
    Ok(signature.generate(&item, &options))
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
    rng: Option<Arg>,
    config: Vec<Arg>,
}

impl Signature {
    fn analyze(item: &mut ItemFn) -> syn::Result<Signature> {
        let sig = &mut item.sig;
        if !sig.generics.params.is_empty() {
            return Err(syn::Error::new(
                sig.generics.span(),
                "a step takes no generic parameters",
            ));
        }
        let mut args = Vec::new();
        let mut errors = Vec::new();
        for input in &mut sig.inputs {
            let FnArg::Typed(arg) = input else {
                errors.push(syn::Error::new(
                    input.span(),
                    "a step is a free function, not a method",
                ));
                continue;
            };
            let mut rng = false;
            for attr in take_lmx_attrs(&mut arg.attrs) {
                let parsed = attr.parse_nested_meta(|meta| {
                    if meta.path.is_ident("rng") {
                        rng = true;
                        Ok(())
                    } else {
                        Err(meta.error("expected `rng`"))
                    }
                });
                errors.extend(parsed.err());
            }
            let Pat::Ident(pat) = &*arg.pat else {
                errors.push(syn::Error::new(
                    arg.pat.span(),
                    "a step's arguments are plain names",
                ));
                continue;
            };
            let (ty, by_ref) = match &*arg.ty {
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
            args.push((
                Arg {
                    ident: pat.ident.clone(),
                    ty,
                    by_ref,
                },
                rng,
            ));
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
        let (params, _) = args.next().ok_or_else(params_error)?;
        let params_ty = array_leaves(&params.ty)
            .filter(|_| params.by_ref)
            .ok_or_else(params_error)?;
        let mut signature = Signature {
            params,
            params_ty,
            batch: Vec::new(),
            rng: None,
            config: Vec::new(),
        };
        for (arg, rng) in args {
            let tensor = is_tensor(&arg.ty) && arg.by_ref;
            match (tensor, rng) {
                (true, true) if signature.rng.is_none() => signature.rng = Some(arg),
                (true, true) => {
                    return Err(syn::Error::new(
                        arg.ident.span(),
                        "a step has one random key",
                    ))
                }
                (false, true) => {
                    return Err(syn::Error::new(
                        arg.ty.span(),
                        "the random key is a `&Tensor`",
                    ))
                }
                (true, false) => signature.batch.push(arg),
                (false, false) if is_tensor(&arg.ty) => {
                    return Err(syn::Error::new(
                        arg.ty.span(),
                        "a step reads tensors by reference: `&Tensor`",
                    ))
                }
                (false, false) => signature.config.push(arg),
            }
        }
        Ok(signature)
    }

    fn generate(&self, item: &ItemFn, options: &Options) -> TokenStream {
        let krate = &options.krate;
        let rt = quote!(#krate::runtime);
        let vis = &item.vis;
        let function = &item.sig.ident;
        let name = format_ident!(
            "{}",
            camel_case(&function.to_string()),
            span = function.span()
        );
        let params_ty = &self.params_ty;

        let batch: Vec<&Ident> = self.batch.iter().map(|arg| &arg.ident).collect();
        let config: Vec<&Ident> = self.config.iter().map(|arg| &arg.ident).collect();
        let config_tys: Vec<&Type> = self.config.iter().map(|arg| &arg.ty).collect();
        let config_args: Vec<TokenStream> = self
            .config
            .iter()
            .map(|arg| {
                let ident = &arg.ident;
                if arg.by_ref {
                    quote!(&#ident)
                } else {
                    quote!(::std::clone::Clone::clone(&#ident))
                }
            })
            .collect();
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
                if index == 0 {
                    quote!(&#rt::tensor::graph(#ident))
                } else if let Some(position) = config.iter().position(|c| *c == ident) {
                    config_args[position].clone()
                } else {
                    quote!(&#rt::tensor::Tensor::from(::std::clone::Clone::clone(#ident)))
                }
            })
            .collect();
        let params = &self.params.ident;
        let rng_arg: Vec<&Ident> = self.rng.iter().map(|arg| &arg.ident).collect();
        let batch_len = batch.len();
        let call_doc = format!(
            "[`{function}`] run eagerly on arrays, outside any compiled step (for evaluation and debugging)."
        );
        let call = quote! {
            #[doc = #call_doc]
            #vis fn call(
                #params: &#params_ty,
                #(#batch: &#rt::Array,)*
                #(#rng_arg: &#rt::Array,)*
                #(#config: &#config_tys,)*
            ) -> #rt::Result<#rt::Array> {
                #(let #config = ::std::clone::Clone::clone(#config);)*
                Ok(#function(#(#call_args),*)?.into_array())
            }
        };

        let mut fn_item = item.clone();
        fn_item.attrs.retain(|attr| !attr.path().is_ident("lmx"));

        let Some(optimizer) = &options.optimizer else {
            let doc = format!("The evaluation step [`{function}`] at the host boundary.");
            return quote! {
                #fn_item

                #[doc = #doc]
                #vis struct #name;

                impl #name {
                    #call
                }
            };
        };

        let state = format_ident!("{name}State");
        let key = self
            .rng
            .as_ref()
            .map_or_else(|| format_ident!("_key"), |arg| arg.ident.clone());
        let key_binding = self.rng.as_ref().map(|_| quote!(let #key = #key;));
        let state_doc = format!(
            "The compiled state of [`{function}`]: the parameters (`{}`), the state of `{}` for every trainable \
             parameter (`opt`), the step count and the random key, flattened in that declared order \
             (`TrainState::declaration`). The learning rate is an input of each step.",
            quote!(#params_ty),
            quote!(#optimizer),
        );
        let struct_doc = format!(
            "[`{function}`] compiled as a training step over [`{state}`]: loss, gradients of the trainable \
             parameters, clipping and the `{}` update, traced once.",
            quote!(#optimizer)
        );
        let assert_optimizer = quote_spanned! {optimizer.span()=>
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
                let _ = declares_its_state::<#optimizer>;
            };
        };

        quote! {
            #fn_item

            #assert_optimizer

            #[doc = #state_doc]
            #vis type #state = #rt::state::TrainState<#params_ty, #optimizer>;

            #[doc = #struct_doc]
            #vis struct #name {
                step: #rt::step::TrainStep<#params_ty, #optimizer>,
            }

            impl #name {
                /// A fresh compiled state for `params`, with the optimizer's state created now for every
                /// trainable parameter and the random key drawn from `seed`.
                #vis fn state(params: #params_ty, optimizer: &#optimizer, seed: u64) -> #rt::Result<#state> {
                    #rt::state::TrainState::new(params, optimizer, seed)
                }

                /// The step for states laid out like `state`, with its configuration fixed for its life.
                #vis fn new(
                    state: &#state,
                    optimizer: #optimizer,
                    #(#config: #config_tys,)*
                    options: #rt::step::StepOptions,
                ) -> #rt::Result<Self> {
                    let loss = move |#params: &#params_ty, batch: &[#rt::Array], #key: &#rt::Array| -> #rt::Result<#rt::Array> {
                        let [#(#batch),*] = batch else {
                            return Err(#rt::Error::Layout(format!(
                                "`{}` takes {} batch arrays, got {}", stringify!(#function), #batch_len, batch.len()
                            )));
                        };
                        #key_binding
                        Ok(#function(#(#call_args),*)?.into_array())
                    };
                    Ok(#name { step: #rt::step::TrainStep::new(state, optimizer, loss, options)? })
                }

                /// One step at learning rate `lr`: `state` becomes the next state (lazily).
                #vis fn step(
                    &mut self,
                    state: &mut #state,
                    lr: f32,
                    #(#batch: &#rt::Array),*
                ) -> #rt::Result<#rt::step::StepMetrics> {
                    self.step.step(state, lr, &[#(::std::clone::Clone::clone(#batch)),*])
                }

                /// How many times the step has been traced (compiled) or run (eager).
                #vis fn traces(&self) -> usize {
                    self.step.traces()
                }

                #call
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
            if !is_tensor(leaf) {
                return None;
            }
        }
        _ => return None,
    }
    last.arguments = PathArguments::None;
    Some(Type::Path(TypePath { qself: None, path }))
}

fn is_tensor(ty: &Type) -> bool {
    matches!(ty, Type::Path(TypePath { qself: None, path })
        if path.segments.last().is_some_and(|s| s.ident == "Tensor" && s.arguments.is_empty()))
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

    const LOSS: &str = "pub fn train_loss(params: &Mlp<Tensor>, x: &Tensor, #[lmx(rng)] key: &Tensor, \
                        config: &Config, depth: usize) -> Result<Tensor> { todo(params, x, key, config, depth) }";

    #[test]
    fn a_training_step_declares_its_state() {
        let out = expand_str(quote!(optimizer = AdamW), LOSS).unwrap();
        assert!(
            out.contains(
                "pub type TrainLossState = ::lmx::runtime::state::TrainState<Mlp, AdamW>;"
            ),
            "{out}"
        );
        assert!(out.contains("pub struct TrainLoss {"), "{out}");
        assert!(
            out.contains("step: ::lmx::runtime::step::TrainStep<Mlp, AdamW>"),
            "{out}"
        );
        assert!(out.contains("let [x] = batch else"), "{out}");
        assert!(out.contains("config: Config,"), "{out}");
        assert!(out.contains("::std::clone::Clone::clone(&depth)"), "{out}");
        assert!(!out.contains("#[lmx"), "{out}");
    }

    #[test]
    fn an_evaluation_step_has_no_state() {
        let out = expand_str(quote!(crate = "my::lmx"), LOSS).unwrap();
        assert!(!out.contains("TrainState"), "{out}");
        assert!(out.contains("pub struct TrainLoss;"), "{out}");
        assert!(
            out.contains("my::lmx::runtime::tensor::graph(params)"),
            "{out}"
        );
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
    fn the_first_argument_is_the_tree() {
        let err = expand_str(
            TokenStream::new(),
            "fn s(x: &Tensor) -> Result<Tensor> { x }",
        )
        .err()
        .unwrap();
        assert!(err.to_string().contains("parameter tree"));
    }

    #[test]
    fn names() {
        assert_eq!(camel_case("train_loss"), "TrainLoss");
        assert_eq!(camel_case("eval"), "Eval");
    }
}
