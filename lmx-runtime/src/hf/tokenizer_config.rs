//! What a tokenizer's folder says beside `tokenizer.json`: `tokenizer_config.json`'s special
//! tokens and chat template, or transformers 5's `chat_template.jinja`. Read here for a model
//! folder and for a tokenizer given alone (`lmx train --tokenizer DIR/tokenizer.json`).

use super::error::HfError;
use super::{read_json, CHAT_TEMPLATE_FILE, TOKENIZER_CONFIG_FILE};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// A folder's `tokenizer_config.json` (if it has one) and where it lies.
#[derive(Clone, Debug)]
pub struct TokenizerConfig {
    dir: PathBuf,
    json: Option<Value>,
}

impl TokenizerConfig {
    /// Reads `dir`'s `tokenizer_config.json`; a folder without one has no special tokens and
    /// only `chat_template.jinja`'s template, if that exists.
    pub fn read(dir: &Path) -> Result<TokenizerConfig, HfError> {
        let path = dir.join(TOKENIZER_CONFIG_FILE);
        let json = if path.exists() {
            Some(read_json(&path)?)
        } else {
            None
        };
        Ok(TokenizerConfig {
            dir: dir.to_owned(),
            json,
        })
    }

    /// The file's contents, if there is one.
    pub fn json(&self) -> Option<&Value> {
        self.json.as_ref()
    }

    /// The beginning-of-sequence token it names.
    pub fn bos_token(&self) -> Option<String> {
        self.token("bos_token")
    }

    /// The end-of-sequence token it names.
    pub fn eos_token(&self) -> Option<String> {
        self.token("eos_token")
    }

    /// A special token: a string, or an added token's `content`.
    fn token(&self, name: &str) -> Option<String> {
        let value = self.json.as_ref()?.get(name)?;
        value
            .as_str()
            .or_else(|| value.get("content").and_then(Value::as_str))
            .map(str::to_owned)
    }

    /// The chat template, unrendered, and where it was read: `chat_template` (a string, or of a
    /// list of named templates the one named `default`), else `chat_template.jinja`.
    pub fn chat_template(&self) -> Result<Option<(String, PathBuf)>, HfError> {
        let config = self.dir.join(TOKENIZER_CONFIG_FILE);
        let malformed = |message: &str| HfError::File {
            path: config.clone(),
            message: message.to_owned(),
        };
        match self
            .json
            .as_ref()
            .and_then(|json| json.get("chat_template"))
        {
            None | Some(Value::Null) => {}
            Some(Value::String(template)) => return Ok(Some((template.clone(), config))),
            Some(Value::Array(named)) => {
                let template = named
                    .iter()
                    .find(|entry| entry.get("name").and_then(Value::as_str) == Some("default"))
                    .and_then(|entry| entry.get("template")?.as_str())
                    .ok_or_else(|| malformed("chat_template has no template named `default`"))?;
                return Ok(Some((template.to_owned(), config)));
            }
            Some(_) => {
                return Err(malformed(
                    "chat_template is neither a string nor a list of named templates",
                ))
            }
        }
        let file = self.dir.join(CHAT_TEMPLATE_FILE);
        if !file.exists() {
            return Ok(None);
        }
        match std::fs::read_to_string(&file) {
            Ok(template) => Ok(Some((template, file))),
            Err(err) => Err(HfError::File {
                path: file,
                message: err.to_string(),
            }),
        }
    }
}
