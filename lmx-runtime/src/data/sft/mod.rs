//! Supervised fine-tuning data as mlx-lm reads it: a folder of `train.jsonl`, `valid.jsonl` and
//! `test.jsonl`, each in the text, completions or chat format (told per file by its first
//! example), chat templates run by a Jinja engine, prompt masking, and rows padded or packed.
//!
//! The pipeline: [`read_examples`] parses a file into [`Example`]s (every bad line an error
//! naming the file, the line and the cause); an [`SftEncoder`] renders each through the
//! [`ChatTemplate`] and tokenizes it into a [`Tokenized`] (its ids and prompt length);
//! [`SftRows`] lays those out as rows whose ignored targets (prompt, padding) are
//! [`IGNORE_TARGET`](crate::nn::IGNORE_TARGET), which `nn::cross_entropy` leaves out of the mean.
//! [`load_sft_file`] and [`load_sft_dir`] do the first two steps for a file and a folder.

mod encode;
mod examples;
mod rows;
mod template;

use std::path::{Path, PathBuf};

pub use encode::{SftEncoder, Tokenized};
pub use examples::{read_examples, Example, ExampleFile, SftFormat, SftKeys};
/// The template engine: a chat's messages and tools are its values.
pub use minijinja;
pub use rows::{Batching, RowStats, SftRows};
pub use template::ChatTemplate;

use super::error::DataError;

/// The tokenized examples of one file.
#[derive(Debug, Clone, PartialEq)]
pub struct SftSet {
    /// The file.
    pub path: PathBuf,
    /// Its format.
    pub format: SftFormat,
    /// Its examples, in the file's order.
    pub examples: Vec<Tokenized>,
}

/// A folder's three sets; `None` for a file that is not there.
#[derive(Debug, Clone, PartialEq)]
pub struct SftData {
    /// `train.jsonl`.
    pub train: Option<SftSet>,
    /// `valid.jsonl`.
    pub valid: Option<SftSet>,
    /// `test.jsonl`.
    pub test: Option<SftSet>,
}

/// Reads and encodes every example of `path`; the first bad one is an error naming the file and
/// its line. Prompt masking of a text file is an error: it has no prompts (as in mlx-lm).
pub fn load_sft_file(
    path: &Path,
    keys: &SftKeys,
    encoder: &SftEncoder<'_>,
) -> Result<SftSet, DataError> {
    let file = read_examples(path, keys)?;
    if file.format == SftFormat::Text && encoder.masks_prompt() {
        return Err(DataError::InvalidSetting(format!(
            "{}: prompt masking needs prompts, and examples in the text format have none \
             (give prompt/completion or chat examples, or leave out --mask-prompt)",
            path.display()
        )));
    }
    let examples = file
        .examples
        .iter()
        .map(|(line, example)| {
            encoder.encode(example).map_err(|fault| DataError::Example {
                path: path.to_path_buf(),
                line: *line,
                fault: Box::new(fault),
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(SftSet {
        path: path.to_path_buf(),
        format: file.format,
        examples,
    })
}

/// The sets of `dir`: `train.jsonl`, `valid.jsonl` and `test.jsonl`, each read if it is there.
pub fn load_sft_dir(
    dir: &Path,
    keys: &SftKeys,
    encoder: &SftEncoder<'_>,
) -> Result<SftData, DataError> {
    if !dir.is_dir() {
        return Err(DataError::Io {
            path: dir.to_path_buf(),
            cause: std::io::Error::new(std::io::ErrorKind::NotFound, "not a folder"),
        });
    }
    let set = |name: &str| -> Result<Option<SftSet>, DataError> {
        let path = dir.join(format!("{name}.jsonl"));
        if !path.exists() {
            return Ok(None);
        }
        load_sft_file(&path, keys, encoder).map(Some)
    };
    Ok(SftData {
        train: set("train")?,
        valid: set("valid")?,
        test: set("test")?,
    })
}
