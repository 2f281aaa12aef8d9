//! The options a macro takes, in its arguments or in `#[lmx(...)]` attributes on its item.

use proc_macro2::TokenStream;
use syn::meta::ParseNestedMeta;
use syn::parse::Parser;
use syn::{Attribute, LitStr, Path, Type};

/// What `#[lmx::model(...)]`, `#[lmx::step(...)]` and the item's `#[lmx(...)]` attributes say.
pub struct Options {
    /// The path of the `lmx` facade crate, whose `runtime` module the generated code uses.
    pub krate: Path,
    /// The optimizer of a training step (`optimizer = AdamW`); `None` for an evaluation step.
    pub optimizer: Option<Type>,
}

/// Which options an item accepts.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Accepts {
    /// `crate = "..."` only.
    Crate,
    /// `crate = "..."` and `optimizer = Type`.
    CrateAndOptimizer,
}

impl Options {
    /// Reads the macro's arguments and removes (and reads) the `#[lmx(...)]` attributes of `attrs`.
    pub fn parse(
        args: TokenStream,
        attrs: &mut Vec<Attribute>,
        accepts: Accepts,
    ) -> syn::Result<Options> {
        let mut options = Options {
            krate: syn::parse_quote!(::lmx),
            optimizer: None,
        };
        syn::meta::parser(|meta| options.set(meta, accepts)).parse2(args)?;
        for attr in take_lmx_attrs(attrs) {
            attr.parse_nested_meta(|meta| options.set(meta, accepts))?;
        }
        Ok(options)
    }

    fn set(&mut self, meta: ParseNestedMeta<'_>, accepts: Accepts) -> syn::Result<()> {
        if meta.path.is_ident("crate") {
            self.krate = meta.value()?.parse::<LitStr>()?.parse()?;
            Ok(())
        } else if meta.path.is_ident("optimizer") && accepts == Accepts::CrateAndOptimizer {
            self.optimizer = Some(meta.value()?.parse()?);
            Ok(())
        } else if accepts == Accepts::CrateAndOptimizer {
            Err(meta.error("expected `crate = \"path\"` or `optimizer = Type`"))
        } else {
            Err(meta.error("expected `crate = \"path\"`"))
        }
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
