//! Documents to one token stream, with a separator after each document.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::error::DataError;
use super::input::{read_documents, InputFormat};
use super::token_file::TokenFileWriter;
use super::tokenizer::Tokenizer;

/// What follows each document in a token stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Separator {
    /// The tokenizer's end-of-sequence id (an error if it has none).
    #[default]
    Eos,
    /// This id.
    Token(u32),
    /// Nothing: documents run into each other.
    Nothing,
}

/// Encodes documents one at a time, each followed by the separator.
#[derive(Clone, Copy)]
pub struct DocumentEncoder<'a> {
    tokenizer: &'a dyn Tokenizer,
    separator: Option<u32>,
}

impl<'a> DocumentEncoder<'a> {
    /// An encoder with `tokenizer`; fails if `separator` is [`Separator::Eos`] and the tokenizer
    /// has no end-of-sequence id, or names an id outside its vocabulary.
    pub fn new(tokenizer: &'a dyn Tokenizer, separator: Separator) -> Result<Self, DataError> {
        let separator = match separator {
            Separator::Eos => Some(tokenizer.eos_id().ok_or(DataError::NoEosToken)?),
            Separator::Token(id) if id as usize >= tokenizer.vocab_size() => {
                return Err(DataError::UnknownToken {
                    id,
                    vocab_size: tokenizer.vocab_size(),
                })
            }
            Separator::Token(id) => Some(id),
            Separator::Nothing => None,
        };
        Ok(Self {
            tokenizer,
            separator,
        })
    }

    /// The ids of `document` followed by the separator.
    pub fn encode(&self, document: &str) -> Result<Vec<u32>, DataError> {
        let mut ids = self.tokenizer.encode(document)?;
        ids.extend(self.separator);
        Ok(ids)
    }

    /// The ids of every document of every file, in order, in memory.
    pub fn encode_files<P: AsRef<Path>>(
        &self,
        paths: &[P],
        format: &InputFormat,
    ) -> Result<Vec<u32>, DataError> {
        let mut tokens = Vec::new();
        self.for_each_document(paths, format, |ids| {
            tokens.extend_from_slice(&ids);
            Ok(())
        })?;
        Ok(tokens)
    }

    /// Streams the ids of every document of every file into `writer`, one document in memory at
    /// a time (a plain text file is one document).
    pub fn encode_files_into<P: AsRef<Path>>(
        &self,
        paths: &[P],
        format: &InputFormat,
        writer: &mut TokenFileWriter,
    ) -> Result<(), DataError> {
        self.for_each_document(paths, format, |ids| writer.push(&ids))
    }

    fn for_each_document<P: AsRef<Path>>(
        &self,
        paths: &[P],
        format: &InputFormat,
        mut sink: impl FnMut(Vec<u32>) -> Result<(), DataError>,
    ) -> Result<(), DataError> {
        for path in paths {
            for document in read_documents(path, format)? {
                sink(self.encode(&document?)?)?;
            }
        }
        Ok(())
    }
}
