//! What the server's worker drives: a generator of many sequences at once, stepped one token
//! for every active sequence at a time: the runtime's [`BatchGenerator`] (continuous batching),
//! behind a trait so that the worker names no model type.

use lmx::runtime::generate::BatchGenerator;
pub use lmx::runtime::generate::{Event, FinishReason, Request, SeqId};
use lmx::runtime::model::LanguageModel;
use lmx::runtime::Result;

/// A generator of many sequences, which join and leave between steps. It lives on one thread
/// (MLX is not thread-safe), so it need not be `Send`.
pub trait Engine {
    /// Adds a sequence to the running batch; its first token comes with the next step.
    fn insert(&mut self, request: Request) -> Result<SeqId>;
    /// Generates one token for every active sequence.
    fn step(&mut self) -> Result<Vec<Event>>;
    /// Drops a sequence and frees what it held; an unknown id is ignored.
    fn cancel(&mut self, id: SeqId);
    /// How many sequences are active.
    fn active(&self) -> usize;
}

impl<M: LanguageModel> Engine for BatchGenerator<M> {
    fn insert(&mut self, request: Request) -> Result<SeqId> {
        BatchGenerator::insert(self, request)
    }

    fn step(&mut self) -> Result<Vec<Event>> {
        BatchGenerator::step(self)
    }

    fn cancel(&mut self, id: SeqId) {
        BatchGenerator::cancel(self, id)
    }

    fn active(&self) -> usize {
        BatchGenerator::active(self)
    }
}
