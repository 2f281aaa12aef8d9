//! `Config`: the settings with their defaults, derived values as methods, enums and presets.

use proc_macro2::{Literal, TokenStream};
use quote::{format_ident, quote};

use super::forward::{convert, Fx, Site, R};
use super::names::{ident, snake};
use super::Gen;
use crate::eval::Value;
use crate::ir::ConfigItem;

/// The `Config` struct, its enums, `Default`, derived values and presets.
pub(crate) fn config(g: &Gen<'_>) -> R<TokenStream> {
    let model = g.model;
    let mut enums = TokenStream::new();
    for (setting, name, variants) in &g.enums {
        let id = format_ident!("{}", name);
        let doc = format!(" The values of setting `{setting}`.");
        let vs = variants.iter().map(|(lmx, rust)| {
            let v = format_ident!("{}", rust);
            let vdoc = format!(" `{lmx}`");
            quote!(#[doc = #vdoc] #[serde(rename = #lmx)] #v,)
        });
        enums.extend(quote! {
            #[doc = #doc]
            #[derive(Clone, Copy, Debug, PartialEq, Eq, ::lmx::serde::Serialize, ::lmx::serde::Deserialize)]
            #[serde(crate = "::lmx::serde")]
            pub enum #id { #(#vs)* }
        });
    }
    let defaults = model
        .preset("default")
        .map(|p| p.values.clone())
        .unwrap_or_default();
    let mut fields = Vec::new();
    let mut default_values = Vec::new();
    let mut derived = Vec::new();
    for item in &model.config {
        let f = ident(&snake(&item.name));
        let doc = format!(" `{}`", item_text(item));
        if item.derived {
            let mut fx = Fx::new(g, Site::Root, g.globals_at(quote!(self)));
            let (s, ty) = fx.static_expr(&item.value)?;
            let want = g.stype(&item.ty);
            let want = match (&ty, &want) {
                (super::forward::SType::Float, _) => ty.clone(),
                _ => want,
            };
            let rust_ty = match &want {
                super::forward::SType::Str => quote!(String),
                other => g.stype_tokens(other),
            };
            let body = convert(&s, &ty, &want);
            let body = if matches!(want, super::forward::SType::Str) {
                quote!(String::from(#body))
            } else {
                body
            };
            derived.push(quote! {
                #[doc = #doc]
                pub fn #f(&self) -> #rust_ty {
                    #body
                }
            });
        } else {
            let ty = field_type(g, item);
            fields.push(quote!(#[doc = #doc] pub #f: #ty,));
            let value = defaults
                .get(&item.name)
                .map(|v| value_tokens(g, item, v))
                .unwrap_or_else(|| quote!(Default::default()));
            default_values.push(quote!(#f: #value,));
        }
    }
    let mut preset_names = Vec::new();
    let mut arms = Vec::new();
    for (p, ast) in model.presets.iter().filter(|p| p.name != "default").zip(
        model
            .ast
            .presets
            .iter()
            .filter(|p| p.name.name != "default"),
    ) {
        let name = &p.name;
        preset_names.push(quote!(#name));
        let overrides = ast.overrides.iter().filter_map(|(setting, _)| {
            let item = model.config.iter().find(|c| c.name == setting.name)?;
            let v = p.values.get(&setting.name)?;
            let f = ident(&snake(&item.name));
            let value = value_tokens(g, item, v);
            Some(quote!(#f: #value,))
        });
        let overrides: Vec<TokenStream> = overrides.collect();
        arms.push(if overrides.is_empty() {
            quote!(#name => defaults,)
        } else {
            quote!(#name => Config { #(#overrides)* ..defaults },)
        });
    }
    let module = super::module_name(model);
    let doc = format!(
        " The configuration of `{}`: settings a preset may override, and derived values as methods.",
        model.name
    );
    Ok(quote! {
        #enums

        #[doc = #doc]
        #[derive(Clone, Debug, PartialEq, ::lmx::serde::Serialize, ::lmx::serde::Deserialize)]
        #[serde(default, crate = "::lmx::serde")]
        pub struct Config { #(#fields)* }

        impl Default for Config {
            fn default() -> Self {
                Config { #(#default_values)* }
            }
        }

        /// The presets, in declaration order (`default`, the declared defaults, is also accepted).
        pub const PRESETS: &[&str] = &[#(#preset_names),*];

        impl Config {
            #(#derived)*

            /// Fails with `Error::Config`, naming the setting at fault, if these settings break
            /// a rule of the model's `.lmx` file: the rules `lmx check` applies to every preset
            /// (exact divisions, sizes of at least 1, dropout probabilities in `[0, 1)`, finite
            /// floats).
            pub fn validate(&self) -> ::lmx::runtime::Result<()> {
                let source = super::SOURCES
                    .iter()
                    .find(|(module, _, _)| *module == #module)
                    .map_or("", |(_, _, source)| source);
                ::lmx::rules::validate(source, self)
            }

            /// The configuration of preset `name`, `None` for an unknown name.
            pub fn preset(name: &str) -> Option<Config> {
                let defaults = Config::default();
                Some(match name {
                    "default" => defaults,
                    #(#arms)*
                    _ => return None,
                })
            }
        }
    })
}

fn item_text(item: &ConfigItem) -> String {
    let value = crate::text::expr_text(&item.value);
    if item.derived {
        format!("{} = {value}", item.name)
    } else {
        format!("{}: {} = {value}", item.name, item.ty.name())
    }
}

fn field_type(g: &Gen<'_>, item: &ConfigItem) -> TokenStream {
    if let Some((_, name, _)) = g.enums.iter().find(|(n, _, _)| n == &item.name) {
        let id = format_ident!("{}", name);
        return quote!(#id);
    }
    match g.stype(&item.ty) {
        super::forward::SType::Str => quote!(String),
        other => g.stype_tokens(&other),
    }
}

/// A config value as a Rust literal of the setting's type.
fn value_tokens(g: &Gen<'_>, item: &ConfigItem, v: &Value) -> TokenStream {
    match v {
        Value::Int(i) if matches!(item.ty, crate::types::StaticTy::Float) => {
            let lit = Literal::f64_unsuffixed(*i as f64);
            quote!(#lit)
        }
        Value::Int(i) => {
            let lit = Literal::i64_unsuffixed(i.unsigned_abs() as i64);
            if *i < 0 {
                quote!(-#lit)
            } else {
                quote!(#lit)
            }
        }
        Value::Float(x) => {
            let lit = Literal::f64_unsuffixed(x.abs());
            if *x < 0.0 {
                quote!(-#lit)
            } else {
                quote!(#lit)
            }
        }
        Value::Bool(b) => quote!(#b),
        Value::Str(s) => quote!(String::from(#s)),
        Value::Enum(e) => g
            .variant(e)
            .map(|(_, ts)| ts)
            .unwrap_or_else(|| quote!(Default::default())),
    }
}
