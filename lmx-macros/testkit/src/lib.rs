//! Stands in for the `lmx` facade crate in `lmx-macros`' tests: `lmx::runtime`, `lmx::model`
//! and `lmx::step` as the facade will offer them, so that the tests expand the macros against
//! their default `::lmx` path exactly as users do.
//!
//! [`runtime`] is `lmx_runtime` plus the two modules the macros' generated code needs and the
//! runtime does not have yet, [`runtime::tensor`] and [`runtime::checkpoint`]; they are written
//! to move into `lmx-runtime` unchanged. [`llama`] is a small LLaMA written under
//! `#[lmx::model]`, with Hugging Face parameter names, for comparisons with the `.lmx` LLaMA.

extern crate self as lmx;

pub mod llama;

pub use lmx_macros::{model, step};

/// `lmx_runtime`, with the modules the macros' generated code needs.
pub mod runtime {
    pub use lmx_runtime::*;

    pub mod checkpoint;
    pub mod tensor;
}
