//! The `.lmx` language: grammar, parser, checker, cost report and Rust code generator.
//!
//! ```text
//! source --parse--> ast::Model --check--> ir::CheckedModel --report / codegen-->
//! ```
//! Every stage is ordinary library code. [`compile_str`] runs parse and check
//! and returns diagnostics ready to print; [`report::report`] computes
//! parameter counts, shapes, FLOPs and memory for a preset.

pub mod ast;
pub mod build;
pub mod builtins;
pub mod check;
pub mod codegen;
pub mod diag;
pub mod dim;
pub mod eval;
pub mod ir;
pub mod parse;
pub mod report;
pub mod rules;
pub mod rust_front;
pub mod span;
pub mod text;
pub mod types;

pub use check::check;
pub use diag::{render, Diagnostic};
pub use ir::CheckedModel;
pub use parse::parse;

/// Parses and checks a source text.
pub fn compile_str(source: &str) -> Result<CheckedModel, Vec<Diagnostic>> {
    let model = parse(source).map_err(|d| vec![d])?;
    check(&model)
}

/// Parses and checks a source text; on failure, the rendered diagnostics.
pub fn check_source(file_name: &str, source: &str) -> Result<CheckedModel, String> {
    compile_str(source).map_err(|d| render(&d, file_name, source))
}
