//! The one generator of `impl Tree`: `#[derive(lmx::Tree)]`, which the code generated from
//! `.lmx` files, `#[lmx::model]` and the runtime's own layer structs all use.
//!
//! A tree struct is generic over its leaf (`struct Block<T = Array>`): a field of type `T` is a
//! leaf, `Option<T>` an optional leaf, any other field a sub-tree (`LinearParams<T>`, `Vec<..>`,
//! `Option<..>`). The impl lists the fields in declaration order; `#[lmx(...)]` on a field sets
//! its leaf role (`role = weight`), its masks (`frozen`, `no_decay`) and its name segment
//! (`rename = "h"`), and `#[lmx(skip)]` marks a field that is no part of the tree (a layer's
//! settings, such as a quantization's bits: copied by `map`, never a leaf). On the struct,
//! `#[lmx(crate = "path")]` or `#[lmx(runtime = "path")]` says where the runtime is
//! (`::lmx::runtime` by default; `crate` inside the runtime itself), and `#[lmx(layer = linear)]`
//! (or `embedding`, `switch_linear`) makes it a layer that `Tree::for_each_layer` visits, so that LoRA and
//! quantization can rewrite a model's linear layers and embeddings wherever they sit.

use proc_macro2::TokenStream;
use quote::quote;
use syn::ext::IdentExt;
use syn::{
    Data, DeriveInput, Fields, GenericArgument, GenericParam, Ident, LitStr, PathArguments, Type,
    TypePath,
};

/// A struct whose `Tree` impl is to be generated.
pub struct TreeDef {
    /// The struct's name.
    pub name: Ident,
    /// The leaf type parameter (`T`).
    pub leaf: Ident,
    /// The runtime's path (`::lmx::runtime`).
    pub runtime: TokenStream,
    /// The fields, in traversal order.
    pub fields: Vec<TreeField>,
    /// The `Layer` variant this struct is (`Linear`, `Embedding`), if it is a layer.
    pub layer: Option<Ident>,
}

/// One field of a tree struct.
pub struct TreeField {
    /// The Rust field.
    pub member: Ident,
    /// Its segment in the dotted leaf names.
    pub segment: String,
    /// Leaf, optional leaf or sub-tree.
    pub kind: FieldKind,
    /// Every leaf below is frozen.
    pub frozen: bool,
    /// No leaf below decays.
    pub no_decay: bool,
}

/// What a field holds.
pub enum FieldKind {
    /// A leaf of the role (a `LeafRole` variant).
    Leaf(Ident),
    /// An optional leaf of the role.
    OptionalLeaf(Ident),
    /// A tree: a layer, a nested model, a `Vec` or `Option` of those.
    Tree,
    /// Not part of the tree: cloned by `map`, ignored otherwise.
    Skip,
}

/// The leaf roles, as `LeafRole` spells them.
pub const ROLES: [&str; 8] = [
    "Weight",
    "Bias",
    "Norm",
    "Embedding",
    "Adapter",
    "Quantization",
    "Other",
    "Buffer",
];

/// The layer kinds, as `tree::Layer` spells them.
pub const LAYERS: [&str; 3] = ["Linear", "Embedding", "SwitchLinear"];

/// `role` (any case) as its `LeafRole` variant, or an error at its tokens.
pub fn role(role: &Ident) -> syn::Result<Ident> {
    let name = role.to_string();
    ROLES
        .iter()
        .find(|r| r.eq_ignore_ascii_case(&name))
        .map(|canonical| Ident::new(canonical, role.span()))
        .ok_or_else(|| {
            syn::Error::new(
                role.span(),
                "unknown role: expected `weight`, `bias`, `norm`, `embedding`, `adapter`, `quantization`, `other` or `buffer`",
            )
        })
}

/// `impl<T> Tree<T> for Name<T>`.
pub fn tree_impl(def: &TreeDef) -> TokenStream {
    let TreeDef {
        name,
        leaf: t,
        runtime: rt,
        fields,
        layer,
    } = def;
    let tree = quote!(#rt::tree::Tree::<#t>);
    let mut for_each = Vec::new();
    let mut for_each_mut = Vec::new();
    let mut map = Vec::new();
    let mut map_same = Vec::new();
    let mut describe = Vec::new();
    let mut layers = Vec::new();
    let mut layers_mut = Vec::new();
    for field in fields {
        let f = &field.member;
        let segment = &field.segment;
        let attrs = if field.frozen || field.no_decay {
            let (frozen, no_decay) = (field.frozen, field.no_decay);
            quote!(#rt::tree::FieldAttrs { frozen: #frozen, no_decay: #no_decay })
        } else {
            quote!(#rt::tree::FieldAttrs::default())
        };
        match &field.kind {
            FieldKind::Leaf(role) => {
                for_each.push(quote!(f(&self.#f);));
                for_each_mut.push(quote!(f(&mut self.#f);));
                map.push(quote!(#f: f(&self.#f)));
                map_same.push(quote!(#f: f(&self.#f)));
                describe
                    .push(quote!(scope.leaf(#segment, #rt::tree::LeafRole::#role, #attrs, out);));
            }
            FieldKind::OptionalLeaf(role) => {
                for_each.push(quote!(if let Some(leaf) = &self.#f { f(leaf); }));
                for_each_mut.push(quote!(if let Some(leaf) = &mut self.#f { f(leaf); }));
                map.push(quote!(#f: self.#f.as_ref().map(|leaf| f(leaf))));
                map_same.push(quote!(#f: self.#f.as_ref().map(|leaf| f(leaf))));
                describe.push(quote! {
                    if self.#f.is_some() {
                        scope.leaf(#segment, #rt::tree::LeafRole::#role, #attrs, out);
                    }
                });
            }
            FieldKind::Tree => {
                for_each.push(quote!(#tree::for_each(&self.#f, f);));
                for_each_mut.push(quote!(#tree::for_each_mut(&mut self.#f, f);));
                map.push(quote!(#f: #tree::map(&self.#f, f)));
                map_same.push(quote!(#f: #tree::map_same(&self.#f, f)));
                describe.push(quote! {
                    #tree::describe(&self.#f, &scope.child(#segment, #attrs), out);
                });
                layers.push(quote! {
                    #tree::for_each_layer(&self.#f, &scope.child(#segment, #attrs), f);
                });
                layers_mut.push(quote! {
                    #tree::for_each_layer_mut(&mut self.#f, &scope.child(#segment, #attrs), f);
                });
            }
            FieldKind::Skip => {
                map.push(quote!(#f: ::core::clone::Clone::clone(&self.#f)));
                map_same.push(quote!(#f: ::core::clone::Clone::clone(&self.#f)));
            }
        }
    }
    // A layer is visited whole; its fields are leaves and settings, never further layers.
    if let Some(kind) = layer {
        layers = vec![quote!(f(scope, #rt::tree::Layer::#kind(self));)];
        layers_mut = vec![quote!(f(scope, #rt::tree::LayerMut::#kind(self));)];
    }
    quote! {
        impl<#t> #rt::tree::Tree<#t> for #name<#t> {
            type Of<U> = #name<U>;

            fn for_each<'a>(&'a self, f: &mut dyn FnMut(&'a #t)) {
                #(#for_each)*
            }

            fn for_each_mut(&mut self, f: &mut dyn FnMut(&mut #t)) {
                #(#for_each_mut)*
            }

            fn map<U>(&self, f: &mut dyn FnMut(&#t) -> U) -> #name<U> {
                #name { #(#map,)* }
            }

            fn map_same(&self, f: &mut dyn FnMut(&#t) -> #t) -> Self {
                #name { #(#map_same,)* }
            }

            fn describe(&self, scope: &#rt::tree::Scope, out: &mut Vec<#rt::tree::LeafSpec>) {
                #(#describe)*
            }

            fn for_each_layer<'a>(
                &'a self,
                scope: &#rt::tree::Scope,
                f: &mut dyn FnMut(&#rt::tree::Scope, #rt::tree::Layer<'a, #t>),
            ) {
                #(#layers)*
            }

            fn for_each_layer_mut(
                &mut self,
                scope: &#rt::tree::Scope,
                f: &mut dyn FnMut(&#rt::tree::Scope, #rt::tree::LayerMut<'_, #t>),
            ) {
                #(#layers_mut)*
            }
        }
    }
}

/// `#[derive(Tree)]` on `input`: the impl, or the errors as `compile_error!`s.
pub fn derive(input: TokenStream) -> TokenStream {
    syn::parse2::<DeriveInput>(input)
        .and_then(|input| analyze(&input))
        .map(|def| tree_impl(&def))
        .unwrap_or_else(syn::Error::into_compile_error)
}

/// The fields of a deriving struct, with their attributes read.
fn analyze(input: &DeriveInput) -> syn::Result<TreeDef> {
    let mut runtime = quote!(::lmx::runtime);
    let mut layer = None;
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("lmx")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("crate") {
                let krate: syn::Path = meta.value()?.parse::<LitStr>()?.parse()?;
                runtime = quote!(#krate::runtime);
            } else if meta.path.is_ident("runtime") {
                let path: syn::Path = meta.value()?.parse::<LitStr>()?.parse()?;
                runtime = quote!(#path);
            } else if meta.path.is_ident("layer") {
                let kind: Ident = meta.value()?.parse()?;
                let name = kind.to_string().replace('_', "");
                let canonical = LAYERS
                    .iter()
                    .find(|l| l.eq_ignore_ascii_case(&name))
                    .ok_or_else(|| {
                        syn::Error::new(
                            kind.span(),
                            "expected `linear`, `embedding` or `switch_linear`",
                        )
                    })?;
                layer = Some(Ident::new(canonical, kind.span()));
            } else {
                return Err(meta.error(
                    "expected `crate = \"path\"`, `runtime = \"path\"` or `layer = linear`",
                ));
            }
            Ok(())
        })?;
    }
    let mut params = input.generics.params.iter();
    let leaf =
        match (params.next(), params.next()) {
            (Some(GenericParam::Type(param)), None) => param.ident.clone(),
            _ => return Err(syn::Error::new_spanned(
                &input.generics,
                "a tree struct has exactly one type parameter, its leaf: `struct Block<T = Array>`",
            )),
        };
    let Data::Struct(data) = &input.data else {
        return Err(syn::Error::new(
            input.ident.span(),
            "`Tree` derives for structs with named fields",
        ));
    };
    let Fields::Named(named) = &data.fields else {
        return Err(syn::Error::new(
            input.ident.span(),
            "`Tree` derives for structs with named fields",
        ));
    };
    let mut fields = Vec::new();
    let mut errors: Option<syn::Error> = None;
    for field in &named.named {
        match tree_field(field, &leaf) {
            Ok(field) => fields.push(field),
            Err(err) => match &mut errors {
                Some(all) => all.combine(err),
                None => errors = Some(err),
            },
        }
    }
    match errors {
        Some(err) => Err(err),
        None => Ok(TreeDef {
            name: input.ident.clone(),
            leaf,
            runtime,
            fields,
            layer,
        }),
    }
}

fn tree_field(field: &syn::Field, leaf: &Ident) -> syn::Result<TreeField> {
    let member = field.ident.clone().expect("named fields");
    let mut segment = member.unraw().to_string();
    let (mut frozen, mut no_decay, mut role_given, mut skip) = (false, false, None, false);
    for attr in field.attrs.iter().filter(|a| a.path().is_ident("lmx")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("frozen") {
                frozen = true;
            } else if meta.path.is_ident("no_decay") {
                no_decay = true;
            } else if meta.path.is_ident("role") {
                role_given = Some(role(&meta.value()?.parse()?)?);
            } else if meta.path.is_ident("rename") {
                segment = meta.value()?.parse::<LitStr>()?.value();
            } else if meta.path.is_ident("skip") {
                skip = true;
            } else {
                return Err(meta.error(
                    "expected `frozen`, `no_decay`, `role = ...`, `rename = \"segment\"` or `skip`",
                ));
            }
            Ok(())
        })?;
    }
    let is_leaf =
        |ty: &Type| matches!(ty, Type::Path(TypePath { qself: None, path }) if path.is_ident(leaf));
    let default_role = || Ident::new("Other", member.span());
    let kind = if skip {
        FieldKind::Skip
    } else if is_leaf(&field.ty) {
        FieldKind::Leaf(role_given.unwrap_or_else(default_role))
    } else if option_of(&field.ty).is_some_and(is_leaf) {
        FieldKind::OptionalLeaf(role_given.unwrap_or_else(default_role))
    } else if let Some(role) = role_given {
        return Err(syn::Error::new(
            role.span(),
            format!("`role` applies to leaves: fields of type `{leaf}` or `Option<{leaf}>`"),
        ));
    } else {
        FieldKind::Tree
    };
    Ok(TreeField {
        member,
        segment,
        kind,
        frozen,
        no_decay,
    })
}

/// The argument of `Option<argument>`.
fn option_of(ty: &Type) -> Option<&Type> {
    let Type::Path(TypePath { qself: None, path }) = ty else {
        return None;
    };
    let last = path.segments.last()?;
    if last.ident != "Option" {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn derive_str(item: TokenStream) -> String {
        prettyplease::unparse(&syn::parse2(derive(item)).unwrap())
    }

    #[test]
    fn fields_are_leaves_optional_leaves_and_trees_in_order() {
        let out = derive_str(quote! {
            #[lmx(runtime = "crate")]
            struct Block<T = Array> {
                #[lmx(role = weight, no_decay)]
                w: T,
                b: Option<T>,
                #[lmx(frozen, rename = "ln_1")]
                norm: LayerNormParams<T>,
            }
        });
        assert!(
            out.contains("impl<T> crate::tree::Tree<T> for Block<T>"),
            "{out}"
        );
        let flat: String = out.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(flat.contains(".leaf( \"w\", crate::tree::LeafRole::Weight, crate::tree::FieldAttrs { frozen: false, no_decay: true, }"), "{flat}");
        assert!(out.contains("if let Some(leaf) = &self.b"), "{out}");
        assert!(
            flat.contains(
                ".child( \"ln_1\", crate::tree::FieldAttrs { frozen: true, no_decay: false, }"
            ),
            "{flat}"
        );
        let (w, b, norm) = (
            out.find("self.w").unwrap(),
            out.find("self.b").unwrap(),
            out.find("self.norm").unwrap(),
        );
        assert!(w < b && b < norm, "{out}");
    }

    #[test]
    fn errors_name_the_field_or_the_struct() {
        let role_on_tree = derive(quote!(
            struct M<T> {
                #[lmx(role = norm)]
                a: LinearParams<T>,
            }
        ));
        assert!(
            role_on_tree
                .to_string()
                .contains("`role` applies to leaves"),
            "{role_on_tree}"
        );
        let unknown = derive(quote!(
            struct M<T> {
                #[lmx(shared)]
                a: T,
            }
        ));
        assert!(
            unknown.to_string().contains("expected `frozen`"),
            "{unknown}"
        );
        let two = derive(quote!(
            struct M<T, U> {
                a: T,
                b: U,
            }
        ));
        assert!(
            two.to_string().contains("exactly one type parameter"),
            "{two}"
        );
    }
}
