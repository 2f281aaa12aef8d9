//! The tokenizer interface shared by the byte-level and Hugging Face tokenizers.

use super::error::DataError;

/// Turns text into token ids and back.
pub trait Tokenizer: Send + Sync {
    /// The ids of `text`, without special tokens.
    fn encode(&self, text: &str) -> Result<Vec<u32>, DataError>;

    /// The text of `ids`, with special tokens left out; fails on an id outside the vocabulary.
    fn decode(&self, ids: &[u32]) -> Result<String, DataError>;

    /// How many ids there are (every id is below it): the model's embedding size.
    fn vocab_size(&self) -> usize;

    /// The end-of-sequence id, which also separates documents in a token stream.
    fn eos_id(&self) -> Option<u32>;

    /// The beginning-of-sequence id.
    fn bos_id(&self) -> Option<u32>;
}
