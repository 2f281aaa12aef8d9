//! The one error type of the data pipeline.

use std::path::PathBuf;

use thiserror::Error;

use super::token_file::TokenDtype;

/// Everything that can go wrong while reading, tokenizing, storing or batching training data.
///
/// Errors that concern a file name it, so that a message alone says where to look.
#[derive(Debug, Error)]
pub enum DataError {
    /// Reading or writing a file failed.
    #[error("{}: {cause}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the operating system said (in the message, so not also a `source()`).
        cause: std::io::Error,
    },
    /// A token file is not a complete, valid lmx token file.
    #[error("{}: {fault}", path.display())]
    TokenFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it (in the message, so not also a `source()`).
        fault: TokenFileFault,
    },
    /// A line of a JSONL file is not an object with a string in the expected field.
    #[error("{}:{line}: {reason}", path.display())]
    Jsonl {
        /// The file.
        path: PathBuf,
        /// The line, counted from 1.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// The Hugging Face tokenizer failed to load, encode or decode.
    #[error("tokenizer: {context}: {cause}")]
    Tokenizer {
        /// What was being done (and on which file, when there is one).
        context: String,
        /// The `tokenizers` crate's error (in the message, so not also a `source()`).
        cause: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A token id is not below the tokenizer's vocabulary size.
    #[error("token id {id} is outside the vocabulary of {vocab_size} ids")]
    UnknownToken {
        /// The id.
        id: u32,
        /// The tokenizer's vocabulary size.
        vocab_size: usize,
    },
    /// A token id is not below the model's vocabulary size: it would index past the embedding.
    #[error(
        "{origin}: token {position} is id {id}, outside the model's vocabulary of {vocab_size} ids"
    )]
    OutOfVocab {
        /// Where the token is.
        origin: TokenOrigin,
        /// Its index among the tokens of `origin`, counted from 0.
        position: u64,
        /// The id.
        id: u32,
        /// The model's vocabulary size.
        vocab_size: usize,
    },
    /// A token id does not fit the storage type it is written to or read as.
    #[error("token id {id} at position {position} does not fit {target}")]
    TokenTooLarge {
        /// The id.
        id: u32,
        /// Its position in the token stream.
        position: u64,
        /// The type it had to fit (`u16`, `u32` below 2^31, or MLX's `int32`).
        target: &'static str,
    },
    /// Documents were to be separated by the end-of-sequence token, and the tokenizer has none.
    #[error("the tokenizer has no end-of-sequence token to separate documents with")]
    NoEosToken,
    /// A named special token is not in the tokenizer's vocabulary.
    #[error("the tokenizer has no token {0:?}")]
    MissingSpecialToken(String),
    /// A parameter of the pipeline is out of its range.
    #[error("invalid data setting: {0}")]
    InvalidSetting(String),
    /// There are too few tokens to make even one window.
    #[error(
        "the {part} has {tokens} token{}, fewer than the {needed} of one window (seq_len + 1)",
        if *tokens == 1 { "" } else { "s" }
    )]
    TooFewTokens {
        /// Which tokens: `"corpus"`, `"training split"` or `"validation split"`.
        part: &'static str,
        /// How many there are.
        tokens: usize,
        /// How many one window needs.
        needed: usize,
    },
    /// A saved position does not fit the iterator it is restored into.
    #[error("cannot resume at {0}")]
    BadPosition(String),
    /// A line of a supervised fine-tuning JSONL file is not an example of the file's format.
    #[error("{}:{line}: {fault}", path.display())]
    Example {
        /// The file.
        path: PathBuf,
        /// The line, counted from 1.
        line: usize,
        /// What is wrong with it (boxed: the other errors stay small).
        fault: Box<ExampleFault>,
    },
    /// A chat template does not compile.
    #[error("chat template {name}: {cause}")]
    Template {
        /// Where the template came from (a file, or `tokenizer_config.json`).
        name: String,
        /// The template engine's message, with the template's line.
        cause: String,
    },
}

/// What is wrong with one line of a supervised fine-tuning file (see [`DataError::Example`]).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ExampleFault {
    /// The line is not JSON.
    #[error("invalid JSON: {0}")]
    BadJson(String),
    /// The line is JSON, but not an object.
    #[error("not a JSON object but {0}")]
    NotObject(&'static str),
    /// The first example has none of the keys that tell the format.
    #[error(
        "no key {text:?}, {messages:?} or {prompt:?} with {completion:?}: not an example of the \
         text, chat or completions format"
    )]
    UnknownFormat {
        /// The text format's key.
        text: String,
        /// The chat format's key.
        messages: String,
        /// The completions format's prompt key.
        prompt: String,
        /// The completions format's completion key.
        completion: String,
    },
    /// A key of the file's format is missing (`messages[1].role` names one inside a list).
    #[error("no key {key:?} ({format} format, as the file's first example)")]
    MissingKey {
        /// The key.
        key: String,
        /// The file's format.
        format: &'static str,
    },
    /// A value has the wrong JSON type.
    #[error("{key:?} is {found}, not {expected}")]
    WrongType {
        /// The key.
        key: String,
        /// What it must be.
        expected: &'static str,
        /// What it is.
        found: &'static str,
    },
    /// A value that must hold something is empty.
    #[error("{key:?} is empty")]
    Empty {
        /// The key.
        key: String,
    },
    /// The chat template failed on this example (a `raise_exception` of the template's, an
    /// undefined value, a type error).
    #[error("chat template {name}: {cause}")]
    Template {
        /// The template's name.
        name: String,
        /// The engine's message.
        cause: String,
    },
    /// A chat example, and no chat template to render it with.
    #[error(
        "a chat example needs a chat template: the model folder's tokenizer_config.json, or \
         --chat-template FILE"
    )]
    NoTemplate,
    /// The tokenizer failed on the example's text.
    #[error("{0}")]
    Tokenizer(String),
    /// The template renders the conversation without its last message as text that does not
    /// begin the rendering of the whole: where the completion starts is unknown.
    #[error(
        "chat template {name} renders the messages before the last as text that does not begin \
         the whole conversation's, so the completion cannot be told from the prompt"
    )]
    PromptNotPrefix {
        /// The template's name.
        name: String,
    },
}

/// Where token ids came from, for [`DataError::OutOfVocab`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenOrigin {
    /// A token file.
    File(PathBuf),
    /// A token stream in memory (tokenized text, or ids handed over by a program).
    Memory,
    /// The prompt of a generation.
    Prompt,
}

impl std::fmt::Display for TokenOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenOrigin::File(path) => write!(f, "{}", path.display()),
            TokenOrigin::Memory => f.write_str("the token stream"),
            TokenOrigin::Prompt => f.write_str("the prompt"),
        }
    }
}

/// What is wrong with a token file (see [`DataError::TokenFile`]).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum TokenFileFault {
    /// The file is shorter than the header.
    #[error(
        "truncated: {actual} bytes, shorter than the {header}-byte header of an lmx token file"
    )]
    ShortHeader {
        /// The file's length.
        actual: u64,
        /// The header's length.
        header: u64,
    },
    /// The file does not begin with the magic bytes.
    #[error("bad magic {found:?}: not an lmx token file (expected {expected:?})")]
    BadMagic {
        /// The first eight bytes, lossily as text.
        found: String,
        /// The magic, as text.
        expected: String,
    },
    /// The format version is not one this build reads.
    #[error("unsupported token file version {0} (this build reads version 1)")]
    UnsupportedVersion(u32),
    /// The dtype code in the header is unknown.
    #[error("unknown token dtype code {0} (2 is u16, 4 is u32)")]
    UnknownDtype(u32),
    /// The reserved header bytes are not zero.
    #[error("reserved header bytes are not zero")]
    Reserved,
    /// The file's length disagrees with the token count in its header.
    #[error(
        "{problem}: the header says {count} {dtype} tokens ({expected} bytes with the header) \
         but the file has {actual} bytes"
    )]
    LengthMismatch {
        /// `"truncated"` or `"trailing bytes"`.
        problem: &'static str,
        /// The header's token count.
        count: u64,
        /// The header's dtype.
        dtype: TokenDtype,
        /// The length the header implies.
        expected: u64,
        /// The file's length.
        actual: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::DataError;

    /// Too few tokens are counted in words that agree with the count.
    #[test]
    fn too_few_tokens_agree_in_number() {
        let message = |tokens| {
            DataError::TooFewTokens {
                part: "corpus",
                tokens,
                needed: 33,
            }
            .to_string()
        };
        assert_eq!(
            message(1),
            "the corpus has 1 token, fewer than the 33 of one window (seq_len + 1)"
        );
        assert_eq!(
            message(0),
            "the corpus has 0 tokens, fewer than the 33 of one window (seq_len + 1)"
        );
    }
}
