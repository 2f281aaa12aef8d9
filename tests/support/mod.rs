//! What several test modules share. (`mlp.rs` is included by the compile-fail cases of
//! `tests/ui`, not by the suite.)

pub mod cli;
pub mod llama;
pub mod preferences;
pub mod reference;
