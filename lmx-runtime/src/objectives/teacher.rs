//! A frozen teacher whose model type the objective does not name: its parameters' leaves (inputs
//! of the compiled step, without gradients or optimizer state) and the function from those leaves
//! and tokens to its logits. A student of any model distils from a teacher of any other through
//! it, so that a program holding N models compiles N students and N teachers, not N x N pairs.

use crate::error::Result;
use crate::model::{Context, LanguageModel};
use crate::train::frozen_tree;
use crate::tree;
use mlx_rs::Array;
use std::rc::Rc;

/// `(leaves, tokens) -> logits [B, T, vocab]`, the leaves in [`Teacher::leaves`]' order.
type Logits = dyn Fn(&[Array], &Array) -> Result<Array>;

/// A frozen model of any architecture, as a distillation objective reads it.
#[derive(Clone)]
pub struct Teacher {
    /// The teacher's model (`LanguageModel::NAME`), as errors and reports name it.
    pub model: &'static str,
    /// Its vocabulary size: the student's must be the same.
    pub vocab: usize,
    /// Its parameters' leaves, in its tree's order.
    pub leaves: Vec<Array>,
    logits: Rc<Logits>,
}

impl Teacher {
    /// The teacher `T` with `params` at `config`: its logits are `T`'s forward pass over the tree
    /// rebuilt from the leaves it is given, without dropout or a cache.
    pub fn new<T: LanguageModel>(params: T::Params, config: T::Config) -> Teacher {
        let leaves = tree::flatten(&params);
        let vocab = T::vocab_size(&config);
        let logits = move |leaves: &[Array], tokens: &Array| -> Result<Array> {
            let params = frozen_tree(&params, leaves)?;
            T::forward(&params, &config, tokens, &mut Context::evaluation())
        };
        Teacher {
            model: T::NAME,
            vocab,
            leaves,
            logits: Rc::new(logits),
        }
    }

    /// The teacher's logits for `tokens` `[B, T]`, its parameters being `leaves` (the compiled
    /// step's frozen inputs, cast to the run's compute dtype).
    pub fn logits(&self, leaves: &[Array], tokens: &Array) -> Result<Array> {
        (self.logits)(leaves, tokens)
    }

    /// How many numbers its parameters hold.
    pub fn parameters(&self) -> usize {
        self.leaves.iter().map(Array::size).sum()
    }
}
