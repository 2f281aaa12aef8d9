//! Everything the checker accepts compiles, and runs.
//!
//! The build script (`build.rs`) writes, into `OUT_DIR`, mutants of every bundled model (drawn
//! by the seeded engine of `src/mutate.rs`) and every accept case of the checker's corpus, and
//! generates a module for each program the checker accepts; this crate compiles them all in one
//! batch. [`programs::PROGRAMS`] lists every program with its outcome; the tests below fail on a
//! program the checker accepted that the code generator refused or that does not initialise and
//! run a forward pass, unless `known-failures.txt` lists it (and then until it is fixed).

pub mod known;

#[cfg(test)]
mod mutate;

use lmx::runtime::mlx_rs::Dtype;
use lmx::runtime::model::{Context, LanguageModel};
use lmx::runtime::{Array, Result};

/// The generated programs: one module per compiled program, `SOURCES` and [`PROGRAMS`].
///
/// [`PROGRAMS`]: programs::PROGRAMS
#[allow(clippy::all, unused)]
pub mod programs {
    include!(concat!(env!("OUT_DIR"), "/programs.rs"));
}

/// One program of the batch.
#[derive(Debug)]
pub struct Program {
    /// Its model name, which the known-failures list uses.
    pub name: &'static str,
    /// The file it was made from (`models/gpt2.lmx`, `grammar/tests/accept/full_slice.lmx`).
    pub origin: &'static str,
    /// The mutations applied to that file, with positions in it; none for an accept case.
    pub mutations: &'static [&'static str],
    /// Its whole source.
    pub source: &'static str,
    /// What became of it.
    pub outcome: Outcome,
}

/// What became of a program.
#[derive(Debug)]
pub enum Outcome {
    /// The checker rejected it: the first diagnostic.
    Rejected(&'static str),
    /// The checker accepted it and the code generator refused it: the rendered diagnostics.
    NotGenerated(&'static str),
    /// Listed in `known-failures.txt` as generated Rust that does not compile, so left out.
    Skipped(&'static str),
    /// Compiled into this crate.
    Compiled {
        /// Its preset with the fewest parameters.
        preset: &'static str,
        /// That preset's parameter count.
        params: u64,
        /// Initialises the model at a preset and runs one forward pass.
        forward: Forward,
        /// For a mutant whose mutations keep the logits, the same for the bundled model it
        /// came from.
        reference: Option<Forward>,
    },
}

/// Initialises a model at a preset and runs one forward pass: [`forward_once`] of a model.
pub type Forward = fn(&str) -> std::result::Result<Logits, String>;

/// The logits of a forward pass, as float32.
#[derive(Debug, Clone, PartialEq)]
pub struct Logits {
    /// Their shape.
    pub shape: Vec<i32>,
    /// Their values, in row-major order.
    pub values: Vec<f32>,
}

/// Initialises `M` at `preset` with seed 0 and runs one forward pass, without dropout, over a
/// batch of one sequence of 8 tokens (fewer if the context is shorter); its logits, or why it
/// failed (an error, or logits that are not finite).
pub fn forward_once<M: LanguageModel>(preset: &str) -> std::result::Result<Logits, String> {
    let run = || -> Result<Logits> {
        let config = M::preset(preset)
            .ok_or_else(|| lmx::runtime::Error::Config(format!("no preset `{preset}`")))?;
        let params = M::init(&config, 0)?;
        let vocab = M::vocab_size(&config).max(1);
        let len = M::context_len(&config).clamp(1, 8);
        let ids: Vec<i32> = (0..len).map(|i| (i * 7 % vocab) as i32).collect();
        let tokens = Array::from_slice(&ids, &[1, len as i32]);
        let logits = M::forward(&params, &config, &tokens, &mut Context::evaluation())?;
        let values = logits.as_dtype(Dtype::Float32)?;
        values.eval()?;
        Ok(Logits {
            shape: logits.shape().to_vec(),
            values: values.as_slice::<f32>().to_vec(),
        })
    };
    let logits = run().map_err(|e| e.to_string())?;
    if logits.values.iter().all(|v| v.is_finite()) {
        Ok(logits)
    } else {
        Err(format!(
            "logits of shape {:?} that are not finite",
            logits.shape
        ))
    }
}

#[cfg(test)]
mod tests;
