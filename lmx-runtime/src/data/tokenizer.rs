//! The tokenizer interface shared by the byte-level and Hugging Face tokenizers.

use super::error::DataError;

/// Turns text into token ids and back.
pub trait Tokenizer: Send + Sync {
    /// The ids of `text`, without special tokens.
    fn encode(&self, text: &str) -> Result<Vec<u32>, DataError>;

    /// The ids of `text`, and how many of the first ones lie wholly within its first `split`
    /// bytes: with the prompt there, the prompt's ids, where a token that straddles the split
    /// counts as the completion's.
    ///
    /// The text is tokenized whole, as the model reads it in training. This default tokenizes
    /// the two parts apart, which is the same where no token can span the split (bytes); a
    /// tokenizer whose tokens can cross it (BPE) overrides it with offsets.
    ///
    /// # Panics
    /// If `split` is not a character boundary of `text`.
    fn encode_split(&self, text: &str, split: usize) -> Result<(Vec<u32>, usize), DataError> {
        let mut ids = self.encode(&text[..split])?;
        let prompt = ids.len();
        ids.extend(self.encode(&text[split..])?);
        Ok((ids, prompt))
    }

    /// The text of `ids`, with special tokens left out; fails on an id outside the vocabulary.
    fn decode(&self, ids: &[u32]) -> Result<String, DataError>;

    /// How many ids there are (every id is below it): the model's embedding size.
    fn vocab_size(&self) -> usize;

    /// The end-of-sequence id, which also separates documents in a token stream.
    fn eos_id(&self) -> Option<u32>;

    /// The beginning-of-sequence id.
    fn bos_id(&self) -> Option<u32>;

    /// The special ids the tokenizer itself puts before and after a document's ids (Llama's
    /// `tokenizer.json` post-processor puts its BOS first; GPT-2's puts nothing): what
    /// `transformers`' `tokenizer.encode(text)` adds, and so what mlx-lm's text examples get.
    /// The default, for tokenizers without a post-processor, is none.
    fn framing(&self) -> (&[u32], &[u32]) {
        (&[], &[])
    }

    /// The ids of `text` inside the tokenizer's [`framing`](Self::framing): a document or a
    /// prompt as `transformers`' `tokenizer.encode(text)` gives it to a published model (a Llama
    /// prompt starts with its BOS).
    fn encode_framed(&self, text: &str) -> Result<Vec<u32>, DataError> {
        let (before, after) = self.framing();
        Ok([before, &self.encode(text)?, after].concat())
    }
}
