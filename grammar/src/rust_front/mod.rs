//! The Rust front end: the analysis and code generation behind `#[lmx::model]`, `#[lmx::step]`
//! and `#[derive(lmx::Tree)]`, as ordinary library code (the `lmx-macros` crate is a thin shell
//! over it).
//!
//! Each function takes the macro's arguments and item and returns the expansion, or the
//! diagnostics as `compile_error!`s located on the user's own tokens.

mod model;
mod options;
mod step;
pub mod taint;
pub mod tree;

use proc_macro2::TokenStream;

/// `#[lmx::model]`: the struct as a typed parameter tree generic over its leaf and, with
/// `config = ...`, a language model.
pub fn model(args: TokenStream, item: TokenStream) -> TokenStream {
    model::expand(args, item).unwrap_or_else(syn::Error::into_compile_error)
}

/// `#[lmx::step]`: a checked loss function and, with `optimizer = ...`, a training step.
pub fn step(args: TokenStream, item: TokenStream) -> TokenStream {
    step::expand(args, item).unwrap_or_else(syn::Error::into_compile_error)
}

/// `#[derive(lmx::Tree)]`: the `Tree` impl of a struct generic over its leaf.
pub fn derive_tree(item: TokenStream) -> TokenStream {
    tree::derive(item)
}
