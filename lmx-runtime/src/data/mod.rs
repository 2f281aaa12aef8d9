//! Training data: tokenizers, text and JSONL inputs, memory-mapped token files, packed windows,
//! a train/validation split, and a seeded batch iterator that resumes at an exact position.
//!
//! The pipeline: a [`Tokenizer`] ([`ByteTokenizer`] or [`HfTokenizer`]) and a
//! [`DocumentEncoder`] turn documents ([`read_documents`]) into one token stream, kept in memory
//! (`Vec<u32>`) or in a [`TokenFile`]; [`Windows`] cuts it into windows of `seq_len + 1` tokens
//! and [`Windows::split`] holds out validation tokens; a [`BatchIterator`] hands out [`Batch`]es
//! whose [`BatchPosition`] goes into a checkpoint.
//!
//! ```
//! use std::sync::Arc;
//! use lmx_runtime::data::{
//!     BatchIterator, ByteTokenizer, DocumentEncoder, Order, Separator, Windows,
//! };
//!
//! let tokenizer = ByteTokenizer::with_eos();
//! let encoder = DocumentEncoder::new(&tokenizer, Separator::Eos)?;
//! let mut tokens = encoder.encode("To be, or not to be, that is the question:")?;
//! tokens.extend(encoder.encode("Whether 'tis nobler in the mind to suffer")?);
//!
//! let split = Windows::new(Arc::new(tokens), 8)?.split(0.1)?;
//! let mut batches = BatchIterator::new(split.train, 2, Order::Shuffled, 42)?;
//! let saved = batches.position();
//! let batch = batches.next_batch()?;
//! assert_eq!(batch.shape(), [2, 8]);
//!
//! batches.seek(saved)?;
//! assert_eq!(batches.next_batch()?, batch);
//! let (inputs, _targets) = batch.to_arrays();
//! assert_eq!(inputs.shape(), &[2, 8]);
//! # Ok::<(), lmx_runtime::data::DataError>(())
//! ```

mod batch;
mod batches;
mod bpe;
mod byte_tokenizer;
mod encode;
mod error;
mod hf_tokenizer;
mod input;
mod preferences;
pub mod rng;
mod rows;
pub mod sft;
mod source;
mod token_file;
mod tokenizer;
mod windows;

pub use batch::Batch;
pub use batches::{BatchIterator, BatchPosition, Order};
pub use bpe::{BPE_EOS, BPE_MIN_VOCAB};
pub use byte_tokenizer::ByteTokenizer;
pub use encode::{DocumentEncoder, Separator};
pub use error::{DataError, ExampleFault, TokenFileFault, TokenOrigin};
pub use hf_tokenizer::HfTokenizer;
pub use input::{read_documents, Documents, InputFormat};
pub use preferences::{read_preferences, PreferencePair, PreferenceRows};
pub use rows::Rows;
pub use sft::SftRows;
pub use source::TokenSource;
pub use token_file::{write_token_file, TokenDtype, TokenFile, TokenFileWriter};
pub use tokenizer::Tokenizer;
pub use windows::{Split, Windows};
