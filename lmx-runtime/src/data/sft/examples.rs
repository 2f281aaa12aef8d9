//! Supervised fine-tuning examples from JSONL, in mlx-lm's three formats.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::data::error::{DataError, ExampleFault};
use crate::data::input::json_kind;

/// The keys the formats read, mlx-lm's `text_feature`, `chat_feature`, `prompt_feature` and
/// `completion_feature`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SftKeys {
    /// The text format's key (`"text"`).
    pub text: String,
    /// The chat format's list of messages (`"messages"`).
    pub messages: String,
    /// The completions format's prompt (`"prompt"`).
    pub prompt: String,
    /// The completions format's completion (`"completion"`).
    pub completion: String,
}

impl Default for SftKeys {
    fn default() -> Self {
        SftKeys {
            text: "text".into(),
            messages: "messages".into(),
            prompt: "prompt".into(),
            completion: "completion".into(),
        }
    }
}

/// A file's format, told by its first example as mlx-lm tells it: a prompt and a completion
/// make it completions, else messages make it chat, else a text makes it text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SftFormat {
    /// `{"text": ...}`: trained on whole; nothing is a prompt.
    Text,
    /// `{"prompt": ..., "completion": ...}`.
    Completions,
    /// `{"messages": [{"role": ..., "content": ...}, ...], "tools": [...]?}`.
    Chat,
}

impl SftFormat {
    fn name(self) -> &'static str {
        match self {
            SftFormat::Text => "text",
            SftFormat::Completions => "completions",
            SftFormat::Chat => "chat",
        }
    }
}

/// One example.
#[derive(Debug, Clone, PartialEq)]
pub enum Example {
    /// A text, trained on whole.
    Text(String),
    /// A prompt and its completion.
    Completion {
        /// The prompt (may be empty).
        prompt: String,
        /// The completion (not empty).
        completion: String,
    },
    /// A conversation: its messages as the file gives them (objects with a string `role`, their
    /// keys in the file's order), for the chat template, and the tools it may call.
    Chat {
        /// The messages (at least one).
        messages: Vec<minijinja::Value>,
        /// The example's `tools`, handed to the template.
        tools: Option<minijinja::Value>,
    },
}

/// The examples of one JSONL file, each with its line (counted from 1).
#[derive(Debug, Clone, PartialEq)]
pub struct ExampleFile {
    /// The format every example has.
    pub format: SftFormat,
    /// The examples and their lines; blank lines are skipped.
    pub examples: Vec<(usize, Example)>,
}

/// Reads every example of `path`; the first bad line is an error naming the file, the line and
/// what is wrong.
pub fn read_examples(path: &Path, keys: &SftKeys) -> Result<ExampleFile, DataError> {
    let io = |cause| DataError::Io {
        path: path.to_path_buf(),
        cause,
    };
    let reader = BufReader::new(File::open(path).map_err(io)?);
    let mut format = None;
    let mut examples = Vec::new();
    for (index, line) in reader.lines().enumerate() {
        let line_number = index + 1;
        let fault = |fault| DataError::Example {
            path: path.to_path_buf(),
            line: line_number,
            fault: Box::new(fault),
        };
        let text = match line {
            Ok(text) => text,
            // The line's bytes are not UTF-8: JSON text must be.
            Err(error) if error.kind() == std::io::ErrorKind::InvalidData => {
                return Err(fault(ExampleFault::BadJson(error.to_string())))
            }
            Err(error) => return Err(io(error)),
        };
        if text.trim().is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(&text)
            .map_err(|error| fault(ExampleFault::BadJson(error.to_string())))?;
        let Value::Object(object) = value else {
            return Err(fault(ExampleFault::NotObject(json_kind(&value))));
        };
        let format = *match &mut format {
            Some(format) => format,
            None => format.insert(detect(&object, keys).ok_or_else(|| {
                fault(ExampleFault::UnknownFormat {
                    text: keys.text.clone(),
                    messages: keys.messages.clone(),
                    prompt: keys.prompt.clone(),
                    completion: keys.completion.clone(),
                })
            })?),
        };
        let example = parse(&object, &text, format, keys).map_err(fault)?;
        examples.push((line_number, example));
    }
    let format = format
        .ok_or_else(|| DataError::InvalidSetting(format!("{} holds no example", path.display())))?;
    Ok(ExampleFile { format, examples })
}

/// mlx-lm's `create_dataset` order: completions, chat, text.
fn detect(object: &Map<String, Value>, keys: &SftKeys) -> Option<SftFormat> {
    if object.contains_key(&keys.prompt) && object.contains_key(&keys.completion) {
        Some(SftFormat::Completions)
    } else if object.contains_key(&keys.messages) {
        Some(SftFormat::Chat)
    } else if object.contains_key(&keys.text) {
        Some(SftFormat::Text)
    } else {
        None
    }
}

/// The example of `object`, the JSON of `line`.
fn parse(
    object: &Map<String, Value>,
    line: &str,
    format: SftFormat,
    keys: &SftKeys,
) -> Result<Example, ExampleFault> {
    let field = |key: &str| -> Result<&Value, ExampleFault> {
        object.get(key).ok_or_else(|| ExampleFault::MissingKey {
            key: key.to_owned(),
            format: format.name(),
        })
    };
    Ok(match format {
        SftFormat::Text => Example::Text(non_empty(
            string(field(&keys.text)?, &keys.text)?,
            &keys.text,
        )?),
        SftFormat::Completions => Example::Completion {
            prompt: string(field(&keys.prompt)?, &keys.prompt)?,
            completion: non_empty(
                string(field(&keys.completion)?, &keys.completion)?,
                &keys.completion,
            )?,
        },
        SftFormat::Chat => {
            check_messages(field(&keys.messages)?, &keys.messages)?;
            // Read again as the template's values: serde_json's objects have lost their keys'
            // order, which a template's `tojson` shows.
            let ordered: minijinja::Value = serde_json::from_str(line)
                .map_err(|error| ExampleFault::BadJson(error.to_string()))?;
            let field = |key: &str| ordered.get_attr(key).ok().filter(|v| !v.is_undefined());
            let messages = field(&keys.messages)
                .and_then(|list| list.try_iter().ok())
                .map(|items| items.collect())
                .unwrap_or_default();
            Example::Chat {
                messages,
                tools: field("tools").filter(|tools| !tools.is_none()),
            }
        }
    })
}

fn string(value: &Value, key: &str) -> Result<String, ExampleFault> {
    match value {
        Value::String(text) => Ok(text.clone()),
        other => Err(wrong_type(key, "a string", other)),
    }
}

fn non_empty(text: String, key: &str) -> Result<String, ExampleFault> {
    if text.is_empty() {
        return Err(ExampleFault::Empty {
            key: key.to_owned(),
        });
    }
    Ok(text)
}

/// A non-empty list of objects, each with a string `role` and a `content` that is a string, a
/// list (of content parts) or, beside `tool_calls`, null or absent; the rest is the template's.
fn check_messages(value: &Value, key: &str) -> Result<(), ExampleFault> {
    let Value::Array(list) = value else {
        return Err(wrong_type(key, "a list of messages", value));
    };
    if list.is_empty() {
        return Err(ExampleFault::Empty {
            key: key.to_owned(),
        });
    }
    for (index, message) in list.iter().enumerate() {
        let at = format!("{key}[{index}]");
        let Value::Object(message) = message else {
            return Err(wrong_type(&at, "an object", message));
        };
        let role = message
            .get("role")
            .ok_or_else(|| ExampleFault::MissingKey {
                key: format!("{at}.role"),
                format: "chat",
            })?;
        string(role, &format!("{at}.role"))?;
        let calls_tools = message
            .get("tool_calls")
            .is_some_and(|calls| !calls.is_null());
        match message.get("content") {
            Some(Value::String(_) | Value::Array(_)) => {}
            None | Some(Value::Null) if calls_tools => {}
            None => {
                return Err(ExampleFault::MissingKey {
                    key: format!("{at}.content"),
                    format: "chat",
                })
            }
            Some(other) => {
                return Err(wrong_type(
                    &format!("{at}.content"),
                    "a string or a list",
                    other,
                ))
            }
        }
    }
    Ok(())
}

fn wrong_type(key: &str, expected: &'static str, found: &Value) -> ExampleFault {
    ExampleFault::WrongType {
        key: key.to_owned(),
        expected,
        found: json_kind(found),
    }
}
