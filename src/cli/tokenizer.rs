//! Which tokenizer a run uses: bytes, or a Hugging Face `tokenizer.json`.

use lmx::runtime::data::{ByteTokenizer, HfTokenizer, Tokenizer};
use std::path::PathBuf;

/// A run's tokenizer, as recorded in its `run.json`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenizerSpec {
    /// Byte-level: 256 ids plus an end-of-sequence id.
    Byte,
    /// A Hugging Face `tokenizer.json`, with its end-of-sequence token.
    HuggingFace {
        /// The file.
        path: PathBuf,
        /// The end-of-sequence token, e.g. `</s>` or `<|endoftext|>`.
        eos: Option<String>,
    },
}

impl TokenizerSpec {
    /// `byte`, or the path of a `tokenizer.json` with an optional end-of-sequence token.
    pub fn parse(name: &str, eos: Option<String>) -> TokenizerSpec {
        match name {
            "byte" => TokenizerSpec::Byte,
            path => TokenizerSpec::HuggingFace {
                path: PathBuf::from(path),
                eos,
            },
        }
    }

    /// Loads the tokenizer.
    pub fn load(&self) -> anyhow::Result<Box<dyn Tokenizer>> {
        Ok(match self {
            TokenizerSpec::Byte => Box::new(ByteTokenizer::with_eos()),
            TokenizerSpec::HuggingFace { path, eos } => {
                let tokenizer = HfTokenizer::from_file(path)?;
                Box::new(match eos {
                    Some(token) => tokenizer.with_eos(token)?,
                    None => tokenizer,
                })
            }
        })
    }
}
