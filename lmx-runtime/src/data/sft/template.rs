//! Chat templates: the Jinja programs of Hugging Face's `tokenizer_config.json`, run by
//! minijinja as `transformers` runs them with Jinja2.

use std::fmt::Write as _;
use std::path::Path;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{context, Environment, Error, ErrorKind, Value};

use crate::data::error::DataError;

/// A chat template, compiled, with the special tokens it is rendered with.
///
/// The environment is the one `transformers` renders with (`apply_chat_template`): blocks
/// trimmed (`trim_blocks`, `lstrip_blocks`), `{% break %}` and `{% continue %}`, Python's string
/// and dict methods (`.strip()`, `.startswith()`, `.items()`, ...), `raise_exception(message)`,
/// `strftime_now(format)` (the local time, as Python's `datetime.now().strftime`), and a `tojson` that writes what Python's `json.dumps(value, ensure_ascii=False)` writes (keys
/// in their order, `", "` and `": "` between items, an `indent` when given), where Jinja's own
/// escapes HTML characters and leaves out the spaces.
#[derive(Debug)]
pub struct ChatTemplate {
    name: String,
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// Compiles `source`; `name` says where it came from in errors. `bos_token` and `eos_token`
    /// are the tokenizer's (`tokenizer_config.json`'s), as text: the template writes them.
    pub fn new(
        name: impl Into<String>,
        source: impl Into<String>,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<Self, DataError> {
        let name = name.into();
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", python_json);
        env.add_template_owned(name.clone(), source.into())
            .map_err(|error| DataError::Template {
                name: name.clone(),
                cause: describe(&error),
            })?;
        Ok(ChatTemplate {
            name,
            env,
            bos_token: bos_token.unwrap_or_default().to_owned(),
            eos_token: eos_token.unwrap_or_default().to_owned(),
        })
    }

    /// Reads and compiles the template in `path` (a `.jinja` file), named by the path.
    pub fn from_file(
        path: &Path,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<Self, DataError> {
        let source = std::fs::read_to_string(path).map_err(|cause| DataError::Io {
            path: path.to_path_buf(),
            cause,
        })?;
        Self::new(path.display().to_string(), source, bos_token, eos_token)
    }

    /// Where the template came from.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The text of `messages` (a list of message objects), with `tools` (none when absent, as
    /// `transformers` passes them) and, with `add_generation_prompt`, the opening of the
    /// assistant's turn.
    pub fn render(
        &self,
        messages: &[Value],
        tools: Option<&Value>,
        add_generation_prompt: bool,
    ) -> Result<String, DataError> {
        let template = self
            .env
            .get_template(&self.name)
            .expect("the template was added under its name");
        template
            .render(context! {
                messages => Value::from(messages.to_vec()),
                tools => tools.cloned().unwrap_or(Value::from(())),
                documents => Value::from(()),
                add_generation_prompt => add_generation_prompt,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
            })
            .map_err(|error| DataError::Template {
                name: self.name.clone(),
                cause: describe(&error),
            })
    }
}

/// The engine's message and, where it has one, the template's line.
fn describe(error: &Error) -> String {
    let mut text = match error.detail() {
        Some(detail) if error.kind() == ErrorKind::InvalidOperation => detail.to_owned(),
        _ => error.to_string(),
    };
    if error.kind() == ErrorKind::InvalidOperation {
        if let Some(line) = error.line() {
            let _ = write!(text, " (line {line})");
        }
    }
    text
}

/// `raise_exception(message)`: fails the rendering with the template's own message.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: the local time in a C `strftime` format, as `transformers` gives
/// templates. An unknown directive fails the rendering instead of writing a wrong date.
fn strftime_now(format: String) -> Result<String, Error> {
    use chrono::format::{Item, StrftimeItems};
    let items: Vec<Item<'_>> = StrftimeItems::new(&format).collect();
    if items.iter().any(|item| matches!(item, Item::Error)) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: `{format}` is not a strftime format"),
        ));
    }
    let mut text = String::new();
    write!(
        text,
        "{}",
        chrono::Local::now().format_with_items(items.into_iter())
    )
    .map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: `{format}` cannot be written"),
        )
    })?;
    Ok(text)
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=indent)`.
fn python_json(value: &Value, kwargs: Kwargs) -> Result<String, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(&mut out, value, indent, 0)?;
    Ok(out)
}

fn write_json(
    out: &mut String,
    value: &Value,
    indent: Option<usize>,
    depth: usize,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&python_number(value)),
        ValueKind::String => out.push_str(&json_string(value.as_str().unwrap_or_default())),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_items(out, items.len(), ('[', ']'), indent, depth, |out, index| {
                write_json(out, &items[index], indent, depth + 1)
            })?;
        }
        ValueKind::Map => {
            let keys: Vec<Value> = value.try_iter()?.collect();
            write_items(out, keys.len(), ('{', '}'), indent, depth, |out, index| {
                let key = &keys[index];
                let name = key.as_str().map_or_else(|| key.to_string(), str::to_owned);
                out.push_str(&json_string(&name));
                out.push_str(": ");
                write_json(out, &value.get_item(key)?, indent, depth + 1)
            })?;
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: {} is not JSON", value.kind()),
            ))
        }
    }
    Ok(())
}

/// `len` items between `brackets`: `", "` apart on one line, or one a line with `indent`.
fn write_items(
    out: &mut String,
    len: usize,
    brackets: (char, char),
    indent: Option<usize>,
    depth: usize,
    mut item: impl FnMut(&mut String, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(brackets.0);
    if len == 0 {
        out.push(brackets.1);
        return Ok(());
    }
    for index in 0..len {
        match indent {
            Some(width) => {
                out.push_str(if index == 0 { "\n" } else { ",\n" });
                out.push_str(&" ".repeat(width * (depth + 1)));
            }
            None if index > 0 => out.push_str(", "),
            None => {}
        }
        item(out, index)?;
    }
    if let Some(width) = indent {
        out.push('\n');
        out.push_str(&" ".repeat(width * depth));
    }
    out.push(brackets.1);
    Ok(())
}

/// A string as JSON, non-ASCII characters as they are (`ensure_ascii=False`).
fn json_string(text: &str) -> String {
    serde_json::to_string(text).expect("a string serializes")
}

/// A number as Python's `repr`: integers as they are, a whole float with `.0`.
fn python_number(value: &Value) -> String {
    if value.is_integer() {
        return value.to_string();
    }
    let float = f64::try_from(value.clone()).unwrap_or(f64::NAN);
    if float.is_nan() {
        "NaN".into()
    } else if float.is_infinite() {
        if float > 0.0 { "Infinity" } else { "-Infinity" }.into()
    } else if float.fract() == 0.0 && float.abs() < 1e16 {
        format!("{float:.1}")
    } else {
        format!("{float}")
    }
}
