//! `#[lmx::model]`: a Rust struct of layers becomes a typed parameter tree.
//!
//! The struct gains the leaf parameter `T = Array`: `Array` fields become `T`, layer and model
//! fields (`LinearParams`, `Block`, `Vec<Block>`, `Option<Block>`) become `LinearParams<T>`, ...
//! so that gradients and optimizer state are the same struct with other leaves. The generated
//! `Tree<T>` impl lists the fields in declaration order; the inherent impls add names, masks,
//! parameter counts, flat maps and safetensors files.

use super::options::{take_lmx_attrs, Accepts, Options};
use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{
    Fields, GenericArgument, Ident, ItemStruct, LitStr, Member, Path, PathArguments, Type, TypePath,
};

/// Expands `#[lmx::model(args)]` on `item`.
pub fn expand(args: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let mut item: ItemStruct = syn::parse2(item)?;
    let options = Options::parse(args, &mut item.attrs, Accepts::Crate)?;
    let model = Model::analyze(item)?;
    Ok(model.generate(&options.krate))
}

/// A model struct after analysis.
struct Model {
    item: ItemStruct,
    fields: Vec<Field>,
    tied: Vec<Tied>,
}

/// A field that is part of the tree.
struct Field {
    ident: Ident,
    kind: FieldKind,
    frozen: bool,
    no_decay: bool,
}

enum FieldKind {
    /// An `Array` leaf of a role.
    Leaf(Ident),
    /// An `Option<Array>` leaf of a role.
    OptionalLeaf(Ident),
    /// A tree: a layer, a nested model, a `Vec` or `Option` of those.
    Tree,
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

const ROLES: [&str; 5] = ["Weight", "Bias", "Norm", "Embedding", "Other"];

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
                    let role: Ident = meta.value()?.parse()?;
                    let name = role.to_string();
                    let Some(canonical) = ROLES.iter().find(|r| r.eq_ignore_ascii_case(&name)) else {
                        return Err(syn::Error::new(
                            role.span(),
                            "unknown role: expected `weight`, `bias`, `norm`, `embedding` or `other`",
                        ));
                    };
                    options.role = Some(Ident::new(canonical, role.span()));
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
                    fields.push(Field {
                        ident,
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

    fn generate(&self, krate: &Path) -> TokenStream {
        let rt = quote!(#krate::runtime);
        let mut item = self.item.clone();
        item.generics = syn::parse_quote!(<T = #rt::Array>);
        let name = &item.ident;
        let vis = &item.vis;

        let for_each = self.fields.iter().map(|field| {
            let ident = &field.ident;
            match field.kind {
                FieldKind::Leaf(_) => quote!(f(&self.#ident);),
                FieldKind::OptionalLeaf(_) => quote!(if let Some(leaf) = &self.#ident { f(leaf); }),
                FieldKind::Tree => quote!(#rt::tree::Tree::<T>::for_each(&self.#ident, f);),
            }
        });
        let for_each_mut = self.fields.iter().map(|field| {
            let ident = &field.ident;
            match field.kind {
                FieldKind::Leaf(_) => quote!(f(&mut self.#ident);),
                FieldKind::OptionalLeaf(_) => {
                    quote!(if let Some(leaf) = &mut self.#ident { f(leaf); })
                }
                FieldKind::Tree => quote!(#rt::tree::Tree::<T>::for_each_mut(&mut self.#ident, f);),
            }
        });
        let map = self.fields.iter().map(|field| {
            let ident = &field.ident;
            match field.kind {
                FieldKind::Leaf(_) => quote!(#ident: f(&self.#ident)),
                FieldKind::OptionalLeaf(_) => {
                    quote!(#ident: self.#ident.as_ref().map(|leaf| f(leaf)))
                }
                FieldKind::Tree => quote!(#ident: #rt::tree::Tree::<T>::map(&self.#ident, f)),
            }
        });
        let describe = self.fields.iter().map(|field| {
            let ident = &field.ident;
            let segment = ident.unraw().to_string();
            let attrs = if field.frozen || field.no_decay {
                let (frozen, no_decay) = (field.frozen, field.no_decay);
                quote!(#rt::tree::FieldAttrs { frozen: #frozen, no_decay: #no_decay })
            } else {
                quote!(#rt::tree::FieldAttrs::default())
            };
            match &field.kind {
                FieldKind::Leaf(role) => quote!(scope.leaf(#segment, #rt::tree::LeafRole::#role, #attrs, out);),
                FieldKind::OptionalLeaf(role) => quote! {
                    if self.#ident.is_some() {
                        scope.leaf(#segment, #rt::tree::LeafRole::#role, #attrs, out);
                    }
                },
                FieldKind::Tree => quote! {
                    #rt::tree::Tree::<T>::describe(&self.#ident, &scope.child(#segment, #attrs), out);
                },
            }
        });
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

            impl<T> #rt::tree::Tree<T> for #name<T> {
                type Of<U> = #name<U>;

                fn for_each<'a>(&'a self, f: &mut dyn FnMut(&'a T)) {
                    #(#for_each)*
                }

                fn for_each_mut(&mut self, f: &mut dyn FnMut(&mut T)) {
                    #(#for_each_mut)*
                }

                fn map<U>(&self, f: &mut dyn FnMut(&T) -> U) -> #name<U> {
                    #name { #(#map,)* }
                }

                fn map_same(&self, f: &mut dyn FnMut(&T) -> T) -> Self {
                    #rt::tree::Tree::<T>::map(self, f)
                }

                fn describe(&self, scope: &#rt::tree::Scope, out: &mut Vec<#rt::tree::LeafSpec>) {
                    #(#describe)*
                }
            }

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
