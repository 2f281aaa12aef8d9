//! The options a macro takes, in its arguments or in `#[lmx(...)]` attributes on its item.

use proc_macro2::TokenStream;
use quote::quote;
use syn::meta::ParseNestedMeta;
use syn::parse::Parser;
use syn::{Attribute, Expr, LitStr, Path, Type};

/// Reads the macro's arguments, then removes and reads the `#[lmx(...)]` attributes of `attrs`,
/// giving each option to `set`.
pub fn parse(
    args: TokenStream,
    attrs: &mut Vec<Attribute>,
    mut set: impl FnMut(ParseNestedMeta<'_>) -> syn::Result<()>,
) -> syn::Result<()> {
    syn::meta::parser(&mut set).parse2(args)?;
    for attr in take_lmx_attrs(attrs) {
        attr.parse_nested_meta(&mut set)?;
    }
    Ok(())
}

/// `crate = "path"`: the `lmx` facade crate, whose `runtime` module generated code uses.
pub fn krate(meta: &ParseNestedMeta<'_>) -> syn::Result<Path> {
    meta.value()?.parse::<LitStr>()?.parse()
}

/// The default facade path, `::lmx`.
pub fn default_krate() -> Path {
    syn::parse_quote!(::lmx)
}

/// A step's optimizer: its type and the value the step trains with.
pub struct Optimizer {
    /// `AdamW`.
    pub ty: Type,
    /// `AdamW::default()`, or the struct expression the user gave.
    pub value: TokenStream,
}

impl Optimizer {
    /// `optimizer = AdamW` (its default settings) or `optimizer = AdamW { weight_decay: 0.1,
    /// ..AdamW::default() }`.
    pub fn parse(meta: &ParseNestedMeta<'_>) -> syn::Result<Optimizer> {
        let expr: Expr = meta.value()?.parse()?;
        let path =
            match &expr {
                Expr::Path(path) if path.qself.is_none() => path.path.clone(),
                Expr::Struct(lit) if lit.qself.is_none() => lit.path.clone(),
                other => return Err(syn::Error::new_spanned(
                    other,
                    "expected an optimizer type (`AdamW`, with its default settings) or a struct \
                     expression (`AdamW { weight_decay: 0.1, ..AdamW::default() }`)",
                )),
            };
        let ty: Type = syn::parse_quote!(#path);
        let value = match expr {
            Expr::Path(_) => quote!(<#ty as ::std::default::Default>::default()),
            other => quote!(#other),
        };
        Ok(Optimizer { ty, value })
    }
}

/// Removes the `#[lmx(...)]` attributes from `attrs` and returns them.
pub fn take_lmx_attrs(attrs: &mut Vec<Attribute>) -> Vec<Attribute> {
    let (ours, others) = std::mem::take(attrs)
        .into_iter()
        .partition(|attr| attr.path().is_ident("lmx"));
    *attrs = others;
    ours
}
