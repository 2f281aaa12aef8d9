//! What the server's worker drives: a generator of many sequences at once, stepped one token
//! for every active sequence at a time. The method shapes are those of the runtime's batched
//! generator (the contract between generation and serving), so that it plugs in unchanged.

use lmx::runtime::Result;

/// A sequence's id, unique within one engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SeqId(pub u64);

/// How one sequence's next tokens are chosen, as the OpenAI API's parameters give it.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    /// 0 picks the first most likely token; a positive value divides the logits.
    pub temperature: f32,
    /// Keep the smallest set of most likely tokens whose probability reaches it, in `(0, 1]`.
    pub top_p: Option<f32>,
    /// Seed of the sequence's sampler.
    pub seed: u64,
    /// Tokens to generate at most.
    pub max_tokens: usize,
    /// Subtracted from the logit of every token generated at least once.
    pub presence_penalty: f32,
    /// Subtracted from the logit of every token once per time it was generated.
    pub frequency_penalty: f32,
    /// Added to the logits of these tokens.
    pub logit_bias: Vec<(u32, f32)>,
}

/// One sequence to generate.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// Its prompt's token ids.
    pub prompt: Vec<u32>,
    /// How its tokens are chosen.
    pub sampling: Sampling,
    /// Tokens that end it (reported, with [`FinishReason::Stop`]): the tokenizer's end of
    /// sequence.
    pub stop_tokens: Vec<u32>,
}

/// Why a sequence ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// It reached its `max_tokens` or the model's context.
    Length,
    /// It generated one of its stop tokens.
    Stop,
    /// It was cancelled.
    Cancelled,
}

/// A token generated for a sequence; the last one of a sequence says why it finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// The sequence.
    pub id: SeqId,
    /// The token.
    pub token: u32,
    /// Set on the sequence's last token.
    pub finish: Option<FinishReason>,
}

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
