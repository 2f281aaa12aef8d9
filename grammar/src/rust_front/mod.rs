//! The Rust front end: the analysis and code generation behind `#[lmx::model]` and
//! `#[lmx::step]`, as ordinary library code (the `lmx-macros` crate is a thin shell over it).
//!
//! Both functions take the macro's arguments and item and return the expansion, or the
//! diagnostics as `compile_error!`s located on the user's own tokens.

mod model;
mod options;
mod step;
pub mod taint;

use proc_macro2::TokenStream;

/// `#[lmx::model]`: the struct as a typed parameter tree generic over its leaf.
pub fn model(args: TokenStream, item: TokenStream) -> TokenStream {
    model::expand(args, item).unwrap_or_else(syn::Error::into_compile_error)
}

/// `#[lmx::step]`: a checked loss function and, with `optimizer = ...`, its compiled step.
pub fn step(args: TokenStream, item: TokenStream) -> TokenStream {
    step::expand(args, item).unwrap_or_else(syn::Error::into_compile_error)
}
