//! Documents from plain text and JSONL files.

use std::fs::File;
use std::io::{BufRead, BufReader, Lines};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::DataError;

/// How an input file holds its documents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum InputFormat {
    /// The whole file is one document.
    Text,
    /// One JSON object per line; each line's document is the string in `field`. Blank lines are
    /// skipped.
    Jsonl {
        /// The field that holds the text.
        field: String,
    },
}

impl InputFormat {
    /// JSONL with the text in the field `"text"`.
    pub fn jsonl() -> Self {
        Self::Jsonl {
            field: "text".to_owned(),
        }
    }

    /// JSONL (field `"text"`) for names ending in `.jsonl`, plain text otherwise.
    pub fn from_path(path: impl AsRef<Path>) -> Self {
        match path.as_ref().extension() {
            Some(extension) if extension.eq_ignore_ascii_case("jsonl") => Self::jsonl(),
            _ => Self::Text,
        }
    }
}

/// The documents of one file, read lazily (a JSONL file line by line; a text file at once).
#[derive(Debug)]
pub struct Documents {
    path: PathBuf,
    kind: DocumentsKind,
}

#[derive(Debug)]
enum DocumentsKind {
    Text(Option<String>),
    Jsonl {
        lines: Lines<BufReader<File>>,
        field: String,
        line: usize,
    },
}

/// Opens `path` to read its documents in `format`.
pub fn read_documents(
    path: impl AsRef<Path>,
    format: &InputFormat,
) -> Result<Documents, DataError> {
    let path = path.as_ref().to_path_buf();
    let io = |cause| DataError::Io {
        path: path.clone(),
        cause,
    };
    let kind = match format {
        InputFormat::Text => DocumentsKind::Text(Some(std::fs::read_to_string(&path).map_err(io)?)),
        InputFormat::Jsonl { field } => DocumentsKind::Jsonl {
            lines: BufReader::new(File::open(&path).map_err(io)?).lines(),
            field: field.clone(),
            line: 0,
        },
    };
    Ok(Documents { path, kind })
}

impl Iterator for Documents {
    type Item = Result<String, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        match &mut self.kind {
            DocumentsKind::Text(text) => text.take().map(Ok),
            DocumentsKind::Jsonl { lines, field, line } => loop {
                *line += 1;
                let text = match lines.next()? {
                    Ok(text) => text,
                    Err(source) => {
                        return Some(Err(DataError::Jsonl {
                            path: self.path.clone(),
                            line: *line,
                            reason: source.to_string(),
                        }))
                    }
                };
                if !text.trim().is_empty() {
                    return Some(
                        document_of(&text, field).map_err(|reason| DataError::Jsonl {
                            path: self.path.clone(),
                            line: *line,
                            reason,
                        }),
                    );
                }
            },
        }
    }
}

/// The string in `field` of the JSON object `line`.
fn document_of(line: &str, field: &str) -> Result<String, String> {
    let value: serde_json::Value =
        serde_json::from_str(line).map_err(|error| format!("invalid JSON: {error}"))?;
    let object = value
        .as_object()
        .ok_or_else(|| "not a JSON object".to_owned())?;
    match object.get(field) {
        Some(serde_json::Value::String(text)) => Ok(text.clone()),
        Some(other) => Err(format!(
            "field {field:?} is not a string but {}",
            json_kind(other)
        )),
        None => Err(format!("no field {field:?}")),
    }
}

pub(crate) fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}
