//! `#[lmx::model]`: a Rust struct of layers becomes a typed parameter tree and, given a
//! configuration type, a language model.
//!
//! The struct gains the leaf parameter `T = Array`: `Array` fields become `T`, layer and model
//! fields (`LinearParams`, `Block`, `Vec<Block>`, `Option<Block>`) become `LinearParams<T>`, ...
//! so that gradients and optimizer state are the same struct with other leaves. Its `Tree<T>`
//! impl comes from the one generator of [`tree`](super::tree); the inherent impls add names,
//! masks, parameter counts, flat maps and safetensors files. With `config = Config` (and the
//! functions that go with it) the struct implements `LanguageModel` (see [`Language`]).

use super::options::{self, take_lmx_attrs};
use super::tree::{self, FieldKind, TreeDef, TreeField};
use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::ext::IdentExt;
use syn::meta::ParseNestedMeta;
use syn::spanned::Spanned;
use syn::{
    Expr, Fields, GenericArgument, Ident, ItemStruct, LitStr, Member, Path, PathArguments, Type,
    TypePath,
};

/// Expands `#[lmx::model(args)]` on `item`.
pub fn expand(args: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let mut item: ItemStruct = syn::parse2(item)?;
    let mut krate = options::default_krate();
    let mut language = LanguageArgs::default();
    options::parse(args, &mut item.attrs, |meta| {
        if meta.path.is_ident("crate") {
            krate = options::krate(&meta)?;
            Ok(())
        } else {
            language.set(meta)
        }
    })?;
    let language = language.finish(&item)?;
    let model = Model::analyze(item)?;
    Ok(model.generate(&krate, language.as_ref()))
}

/// What makes a model struct a `LanguageModel`:
///
/// ```ignore
/// #[lmx::model(
///     config = TinyConfig,          // serde: Clone + Debug + Serialize + Deserialize
///     init = Tiny::build,           // fn(&TinyConfig, &mut Keys) -> Result<Tiny>
///     forward = forward,            // fn(&Tiny<Tensor>, &Tensor, &TinyConfig, &mut Context) -> Result<Tensor>
///     vocab_size = vocab,           // the configuration's field holding the vocabulary size
///     context_len = context,        // ... and the longest context (unbounded if not given)
///     presets(tiny = TinyConfig::tiny(), small = TinyConfig::small()),
///     validate = TinyConfig::check, // fn(&TinyConfig) -> Result<()> (none if not given)
///     name = "tiny",                // the name `lmx` lists (the struct's name in snake case)
/// )]
/// ```
struct Language {
    config: Type,
    init: Path,
    forward: Path,
    vocab_size: Ident,
    context_len: Option<Ident>,
    validate: Option<Path>,
    presets: Vec<(Ident, Expr)>,
    name: String,
}

/// The language-model arguments as given, before their completeness is checked.
#[derive(Default)]
struct LanguageArgs {
    config: Option<Type>,
    init: Option<Path>,
    forward: Option<Path>,
    vocab_size: Option<Ident>,
    context_len: Option<Ident>,
    validate: Option<Path>,
    presets: Vec<(Ident, Expr)>,
    name: Option<LitStr>,
    /// The first language-model argument, where an error about a missing one points.
    first: Option<proc_macro2::Span>,
}

impl LanguageArgs {
    fn set(&mut self, meta: ParseNestedMeta<'_>) -> syn::Result<()> {
        self.first.get_or_insert(meta.path.span());
        let path = &meta.path;
        if path.is_ident("config") {
            self.config = Some(meta.value()?.parse()?);
        } else if path.is_ident("init") {
            self.init = Some(meta.value()?.parse()?);
        } else if path.is_ident("forward") {
            self.forward = Some(meta.value()?.parse()?);
        } else if path.is_ident("vocab_size") {
            self.vocab_size = Some(meta.value()?.parse()?);
        } else if path.is_ident("context_len") {
            self.context_len = Some(meta.value()?.parse()?);
        } else if path.is_ident("validate") {
            self.validate = Some(meta.value()?.parse()?);
        } else if path.is_ident("name") {
            self.name = Some(meta.value()?.parse()?);
        } else if path.is_ident("presets") {
            meta.parse_nested_meta(|preset| {
                let Some(name) = preset.path.get_ident().cloned() else {
                    return Err(preset.error("a preset is `name = expression`"));
                };
                if self.presets.iter().any(|(known, _)| *known == name) {
                    return Err(preset.error(format!("preset `{name}` is declared twice")));
                }
                self.presets.push((name, preset.value()?.parse()?));
                Ok(())
            })?;
        } else {
            return Err(meta.error(
                "expected `crate`, `config`, `init`, `forward`, `vocab_size`, `context_len`, \
                 `validate`, `presets(..)` or `name`",
            ));
        }
        Ok(())
    }

    /// The language model, `None` for a plain tree, or an error naming what is missing.
    fn finish(self, item: &ItemStruct) -> syn::Result<Option<Language>> {
        let Some(first) = self.first else {
            return Ok(None);
        };
        let missing: Vec<&str> = [
            ("config = Type", self.config.is_none()),
            ("init = function", self.init.is_none()),
            ("forward = function", self.forward.is_none()),
            ("vocab_size = field", self.vocab_size.is_none()),
        ]
        .into_iter()
        .filter_map(|(name, missing)| missing.then_some(name))
        .collect();
        let (Some(config), Some(init), Some(forward), Some(vocab_size)) =
            (self.config, self.init, self.forward, self.vocab_size)
        else {
            return Err(syn::Error::new(
                first,
                format!(
                    "a language model names its configuration and functions: missing `{}`",
                    missing.join("`, `")
                ),
            ));
        };
        let name = self
            .name
            .map(|name| name.value())
            .unwrap_or_else(|| snake_case(&item.ident.unraw().to_string()));
        Ok(Some(Language {
            config,
            init,
            forward,
            vocab_size,
            context_len: self.context_len,
            validate: self.validate,
            presets: self.presets,
            name,
        }))
    }
}

/// `TinyGpt` as `tiny_gpt`.
fn snake_case(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.extend(c.to_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// A model struct after analysis.
struct Model {
    item: ItemStruct,
    fields: Vec<TreeField>,
    tied: Vec<Tied>,
}

/// A tied field: no leaf of its own, an accessor to the tree it shares.
struct Tied {
    ident: Ident,
    ty: Type,
    target: Vec<Member>,
    doc: Vec<syn::Attribute>,
}

/// What `#[lmx(...)]` says about one field.
#[derive(Default)]
struct FieldOptions {
    frozen: bool,
    no_decay: bool,
    role: Option<Ident>,
    tied: Option<LitStr>,
}

impl FieldOptions {
    fn parse(attrs: &mut Vec<syn::Attribute>) -> syn::Result<FieldOptions> {
        let mut options = FieldOptions::default();
        for attr in take_lmx_attrs(attrs) {
            attr.parse_nested_meta(|meta| {
                if meta.path.is_ident("frozen") {
                    options.frozen = true;
                } else if meta.path.is_ident("no_decay") {
                    options.no_decay = true;
                } else if meta.path.is_ident("role") {
                    options.role = Some(tree::role(&meta.value()?.parse()?)?);
                } else if meta.path.is_ident("tied") {
                    options.tied = Some(meta.value()?.parse()?);
                } else {
                    return Err(meta.error(
                        "expected `frozen`, `no_decay`, `role = ...` or `tied = \"path.to.field\"`",
                    ));
                }
                Ok(())
            })?;
        }
        Ok(options)
    }
}

impl Model {
    fn analyze(mut item: ItemStruct) -> syn::Result<Model> {
        if !item.generics.params.is_empty() || item.generics.where_clause.is_some() {
            return Err(syn::Error::new_spanned(
                &item.generics,
                "a model struct takes no generic parameters: `#[lmx::model]` adds the leaf parameter `T`",
            ));
        }
        let Fields::Named(named) = &mut item.fields else {
            return Err(syn::Error::new(
                item.ident.span(),
                "a model is a struct with named fields",
            ));
        };
        let mut fields = Vec::new();
        let mut tied = Vec::new();
        let mut errors = Vec::new();
        let mut kept = syn::punctuated::Punctuated::new();
        for mut field in std::mem::take(&mut named.named) {
            let ident = field.ident.clone().expect("named fields");
            let options = match FieldOptions::parse(&mut field.attrs) {
                Ok(options) => options,
                Err(err) => {
                    errors.push(err);
                    continue;
                }
            };
            if let Some(path) = &options.tied {
                match tied_target(path) {
                    Ok(target) => match leaf_generic(&field.ty) {
                        Ok(ty) => tied.push(Tied {
                            ident,
                            ty,
                            target,
                            doc: doc_attrs(&field.attrs),
                        }),
                        Err(err) => errors.push(err),
                    },
                    Err(err) => errors.push(err),
                }
                continue;
            }
            match classify(&field.ty, &options) {
                Ok((kind, ty)) => {
                    field.ty = ty;
                    fields.push(TreeField {
                        segment: ident.unraw().to_string(),
                        member: ident,
                        kind,
                        frozen: options.frozen,
                        no_decay: options.no_decay,
                    });
                    kept.push(field);
                }
                Err(err) => errors.push(err),
            }
        }
        named.named = kept;
        if let Some(err) = errors.into_iter().reduce(|mut all, err| {
            all.combine(err);
            all
        }) {
            return Err(err);
        }
        Ok(Model { item, fields, tied })
    }

    fn generate(self, krate: &Path, language: Option<&Language>) -> TokenStream {
        let rt = quote!(#krate::runtime);
        let mut item = self.item;
        item.generics = syn::parse_quote!(<T = #rt::Array>);
        let name = item.ident.clone();
        let vis = item.vis.clone();
        let tree_impl = tree::tree_impl(&TreeDef {
            name: name.clone(),
            leaf: format_ident!("T"),
            runtime: rt.clone(),
            fields: self.fields,
            layer: None,
        });
        let language = language.map(|language| language_model(&name, &rt, language));
        let tied = self.tied.iter().map(|tied| {
            let Tied {
                ident,
                ty,
                target,
                doc,
            } = tied;
            let doc = if doc.is_empty() {
                let path = target
                    .iter()
                    .map(|m| quote!(#m).to_string())
                    .collect::<Vec<_>>()
                    .join(".");
                let text = format!("`{ident}`, tied to `{path}`: the same leaves, not a copy.");
                quote!(#[doc = #text])
            } else {
                quote!(#(#doc)*)
            };
            quote! {
                #doc
                #vis fn #ident(&self) -> &#ty {
                    &self #(.#target)*
                }
            }
        });

        quote! {
            #[derive(Clone, Debug, PartialEq)]
            #item

            #tree_impl

            #language

            impl<T> #name<T> {
                /// The dotted names of the leaves, in traversal order.
                #vis fn names(&self) -> Vec<String> {
                    #rt::tree::names::<T, Self>(self)
                }

                /// The name, role and masks of every leaf, in traversal order.
                #vis fn specs(&self) -> Vec<#rt::tree::LeafSpec> {
                    #rt::tree::specs::<T, Self>(self)
                }

                /// The number of leaves (tensors).
                #vis fn leaf_count(&self) -> usize {
                    #rt::tree::leaf_count::<T, Self>(self)
                }

                /// `true` at every leaf that training updates.
                #vis fn trainable_mask(&self) -> #name<bool> {
                    let mut specs = self.specs().into_iter();
                    #rt::tree::Tree::<T>::map(self, &mut |_| specs.next().expect("one spec per leaf").trainable)
                }

                /// `true` at every frozen leaf.
                #vis fn frozen_mask(&self) -> #name<bool> {
                    let mut specs = self.specs().into_iter();
                    #rt::tree::Tree::<T>::map(self, &mut |_| !specs.next().expect("one spec per leaf").trainable)
                }

                #(#tied)*
            }

            impl #name<#rt::Array> {
                /// The number of scalar parameters.
                #vis fn parameter_count(&self) -> usize {
                    #rt::tree::parameter_count(self, |_| true)
                }

                /// The number of scalar parameters that training updates.
                #vis fn trainable_parameter_count(&self) -> usize {
                    #rt::tree::parameter_count(self, |spec| spec.trainable)
                }

                /// The leaves by dotted name, as mlx-rs modules flatten their parameters (for
                /// interop, not for the training loop).
                #vis fn to_flat_map(&self) -> ::std::collections::HashMap<String, #rt::Array> {
                    #rt::checkpoint::tree_to_map(self)
                }

                /// Replaces every leaf by the tensor of its name in `tensors`, which must hold
                /// exactly these names with the same shapes and dtypes; nothing changes on error.
                #vis fn update_from_flat_map(
                    &mut self,
                    tensors: ::std::collections::HashMap<String, #rt::Array>,
                ) -> #rt::Result<()> {
                    #rt::checkpoint::update_tree_from_map(self, tensors)
                }

                /// Writes the leaves to a safetensors file, by dotted name.
                #vis fn save_safetensors(&self, path: impl AsRef<::std::path::Path>) -> #rt::Result<()> {
                    #rt::checkpoint::save_tree(path.as_ref(), self)
                }

                /// Reads every leaf from a safetensors file, checking names, shapes and dtypes.
                #vis fn load_safetensors(&mut self, path: impl AsRef<::std::path::Path>) -> #rt::Result<()> {
                    *self = #rt::checkpoint::load_tree(path.as_ref(), self)?;
                    Ok(())
                }
            }
        }
    }
}

/// `impl LanguageModel for Name`: the forward pass over tensors run through the runtime's host
/// boundary, which also advances the context past the tokens.
fn language_model(name: &Ident, rt: &TokenStream, language: &Language) -> TokenStream {
    let Language {
        config,
        init,
        forward,
        vocab_size,
        context_len,
        validate,
        presets,
        name: model_name,
    } = language;
    let preset_names: Vec<String> = presets.iter().map(|(name, _)| name.to_string()).collect();
    let preset_values = presets.iter().map(|(_, value)| value);
    let validate = validate.as_ref().map(|validate| {
        quote! {
            fn validate(config: &#config) -> #rt::Result<()> {
                #validate(config)
            }
        }
    });
    let context_len = match context_len {
        Some(field) => quote!(config.#field as usize),
        None => quote!({
            let _ = config;
            usize::MAX
        }),
    };
    let doc = format!(
        "`{name}` as a language model: `Trainer`, checkpoints, `generate` and the KV cache work for it as for a `.lmx` model."
    );
    quote! {
        #[doc = #doc]
        impl #rt::model::LanguageModel for #name {
            type Config = #config;
            type Params = #name;

            const NAME: &'static str = #model_name;

            fn presets() -> &'static [&'static str] {
                &[#(#preset_names),*]
            }

            fn preset(name: &str) -> ::std::option::Option<#config> {
                match name {
                    #(#preset_names => ::std::option::Option::Some(#preset_values),)*
                    _ => ::std::option::Option::None,
                }
            }

            #validate

            fn init(config: &#config, seed: u64) -> #rt::Result<#name> {
                <#name as #rt::model::LanguageModel>::validate(config)?;
                let mut keys = #rt::nn::init::Keys::from_seed(seed)?;
                #init(config, &mut keys)
            }

            fn forward(
                params: &#name,
                config: &#config,
                tokens: &#rt::Array,
                ctx: &mut #rt::model::Context,
            ) -> #rt::Result<#rt::Array> {
                #rt::tensor::host::forward(params, tokens, ctx, |params, tokens, ctx| {
                    #forward(params, tokens, config, ctx)
                })
            }

            fn vocab_size(config: &#config) -> usize {
                config.#vocab_size as usize
            }

            fn context_len(config: &#config) -> usize {
                #context_len
            }
        }
    }
}

/// The field's kind and its type with the leaf parameter `T` in place.
fn classify(ty: &Type, options: &FieldOptions) -> syn::Result<(FieldKind, Type)> {
    let role = || {
        options
            .role
            .clone()
            .unwrap_or_else(|| Ident::new("Other", ty.span()))
    };
    if is_array(ty) {
        return Ok((
            FieldKind::Leaf(role()),
            syn::parse_quote_spanned!(ty.span()=> T),
        ));
    }
    if let Some(inner) = generic_of(ty, "Option") {
        if is_array(inner) {
            return Ok((
                FieldKind::OptionalLeaf(role()),
                syn::parse_quote_spanned!(ty.span()=> Option<T>),
            ));
        }
    }
    if let Some(role) = &options.role {
        return Err(syn::Error::new(
            role.span(),
            "`role` applies to `Array` and `Option<Array>` leaves",
        ));
    }
    Ok((FieldKind::Tree, leaf_generic(ty)?))
}

/// `ty` with `<T>` added to the tree type inside `Vec`, `Option` and `Box`.
fn leaf_generic(ty: &Type) -> syn::Result<Type> {
    for wrapper in ["Vec", "Option", "Box"] {
        if let Some(inner) = generic_of(ty, wrapper) {
            if is_array(inner) {
                return Err(syn::Error::new_spanned(
                    inner,
                    format!("`{wrapper}<Array>` is not a tree: declare the leaves as fields of a `#[lmx::model]` struct"),
                ));
            }
            let inner = leaf_generic(inner)?;
            let mut ty = ty.clone();
            *generic_of_mut(&mut ty).expect("checked above") = inner;
            return Ok(ty);
        }
    }
    let Type::Path(TypePath { qself: None, path }) = ty else {
        return Err(syn::Error::new_spanned(
            ty,
            "expected a layer, a model, `Array`, or a `Vec` or `Option` of them",
        ));
    };
    let last = path.segments.last().expect("a path has a segment");
    if !last.arguments.is_empty() {
        return Err(syn::Error::new_spanned(
            &last.arguments,
            format!(
                "write `{}` without generic arguments: `#[lmx::model]` adds the leaf parameter",
                last.ident
            ),
        ));
    }
    let span = ty.span();
    Ok(syn::parse_quote_spanned!(span=> #path<T>))
}

fn is_array(ty: &Type) -> bool {
    matches!(ty, Type::Path(TypePath { qself: None, path })
        if path.segments.last().is_some_and(|s| s.ident == "Array" && s.arguments.is_empty()))
}

/// The type argument of `ty` when `ty` is `wrapper<argument>`.
fn generic_of<'a>(ty: &'a Type, wrapper: &str) -> Option<&'a Type> {
    let Type::Path(TypePath { qself: None, path }) = ty else {
        return None;
    };
    let last = path.segments.last()?;
    if last.ident != wrapper {
        return None;
    }
    match &last.arguments {
        PathArguments::AngleBracketed(args) if args.args.len() == 1 => match args.args.first()? {
            GenericArgument::Type(inner) => Some(inner),
            _ => None,
        },
        _ => None,
    }
}

fn generic_of_mut(ty: &mut Type) -> Option<&mut Type> {
    let Type::Path(TypePath { path, .. }) = ty else {
        return None;
    };
    match &mut path.segments.last_mut()?.arguments {
        PathArguments::AngleBracketed(args) => match args.args.first_mut()? {
            GenericArgument::Type(inner) => Some(inner),
            _ => None,
        },
        _ => None,
    }
}

/// `"model.embed_tokens"` as the members `model`, `embed_tokens`.
fn tied_target(path: &LitStr) -> syn::Result<Vec<Member>> {
    let text = path.value();
    text.split('.')
        .map(|segment| match segment.parse::<u32>() {
            Ok(_) => Err(syn::Error::new(
                path.span(),
                "a tied field names fields, not list elements",
            )),
            Err(_) if !segment.is_empty() => syn::parse_str::<Ident>(segment)
                .map(|ident| Member::Named(format_ident!("{}", ident, span = path.span())))
                .map_err(|_| {
                    syn::Error::new(path.span(), format!("`{segment}` is not a field name"))
                }),
            Err(_) => Err(syn::Error::new(
                path.span(),
                "expected a dotted field path, e.g. \"model.embed_tokens\"",
            )),
        })
        .collect()
}

fn doc_attrs(attrs: &[syn::Attribute]) -> Vec<syn::Attribute> {
    attrs
        .iter()
        .filter(|attr| attr.path().is_ident("doc"))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand_str(item: &str) -> String {
        let file: syn::File =
            syn::parse2(expand(quote!(crate = "lmx"), item.parse().unwrap()).unwrap()).unwrap();
        prettyplease::unparse(&file)
    }

    #[test]
    fn fields_become_generic_over_the_leaf() {
        let out = expand_str(
            "pub struct Block { attn: Attention, layers: Vec<Layer>, head: Option<LinearParams>, \
             #[lmx(role = norm, frozen)] scale: Array, shift: Option<Array> }",
        );
        assert!(
            out.contains("pub struct Block<T = lmx::runtime::Array>"),
            "{out}"
        );
        assert!(out.contains("attn: Attention<T>"), "{out}");
        assert!(out.contains("layers: Vec<Layer<T>>"), "{out}");
        assert!(out.contains("head: Option<LinearParams<T>>"), "{out}");
        assert!(out.contains("scale: T"), "{out}");
        assert!(out.contains("shift: Option<T>"), "{out}");
        assert!(out.contains("LeafRole::Norm"), "{out}");
        assert!(out.contains("frozen: true"), "{out}");
    }

    #[test]
    fn tied_fields_are_accessors_not_leaves() {
        let out = expand_str(
            "pub struct Lm { embed: EmbeddingParams, #[lmx(tied = \"embed\")] head: EmbeddingParams }",
        );
        assert!(!out.contains("head: EmbeddingParams<T>,"), "{out}");
        assert!(
            out.contains("pub fn head(&self) -> &EmbeddingParams<T>"),
            "{out}"
        );
        assert!(out.contains("&self.embed"), "{out}");
    }

    #[test]
    fn errors_are_on_the_fields() {
        let item = quote!(
            struct M {
                #[lmx(role = weight)]
                a: LinearParams,
                b: Vec<Array>,
                c: Foo<u8>,
            }
        );
        let err = expand(TokenStream::new(), item).err().unwrap();
        let messages: Vec<String> = err.into_iter().map(|e| e.to_string()).collect();
        assert_eq!(messages.len(), 3, "{messages:?}");
        assert!(messages[0].contains("`role` applies"));
        assert!(messages[1].contains("`Vec<Array>` is not a tree"));
        assert!(messages[2].contains("write `Foo` without generic arguments"));
    }

    #[test]
    fn a_language_model_names_its_configuration_and_functions() {
        let item = "pub struct TinyGpt { embed: EmbeddingParams }";
        let tokens = expand(
            quote!(
                config = TinyConfig,
                init = TinyGpt::init,
                forward = forward,
                vocab_size = vocab,
                context_len = context,
                presets(tiny = TinyConfig::tiny())
            ),
            item.parse().unwrap(),
        )
        .unwrap();
        let out = prettyplease::unparse(&syn::parse2(tokens).unwrap());
        assert!(
            out.contains("impl ::lmx::runtime::model::LanguageModel for TinyGpt"),
            "{out}"
        );
        assert!(
            out.contains("const NAME: &'static str = \"tiny_gpt\";"),
            "{out}"
        );
        assert!(
            out.contains("\"tiny\" => ::std::option::Option::Some(TinyConfig::tiny())"),
            "{out}"
        );
        assert!(
            out.contains("forward(params, tokens, config, ctx)"),
            "{out}"
        );
        assert!(out.contains("config.vocab as usize"), "{out}");

        let err = expand(
            quote!(config = TinyConfig, vocab_size = vocab),
            item.parse().unwrap(),
        )
        .err()
        .unwrap();
        assert_eq!(
            err.to_string(),
            "a language model names its configuration and functions: missing `init = function`, `forward = function`"
        );
    }

    #[test]
    fn generic_structs_are_rejected() {
        let err = expand(
            TokenStream::new(),
            quote!(
                struct M<T> {
                    a: T,
                }
            ),
        )
        .err()
        .unwrap();
        assert!(err.to_string().contains("adds the leaf parameter"));
    }
}
