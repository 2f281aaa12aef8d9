//! Examples to token ids, with the length of the prompt that prompt masking leaves out.

use minijinja::Value;

use crate::data::error::{DataError, ExampleFault};
use crate::data::tokenizer::Tokenizer;

use super::examples::Example;
use super::template::ChatTemplate;

/// One example's ids; the loss counts the targets from `prompt_len` on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tokenized {
    /// The ids, ending with the end-of-sequence id where the tokenizer has one.
    pub ids: Vec<u32>,
    /// How many leading ids are the prompt: 0 without prompt masking and for texts.
    pub prompt_len: usize,
}

/// Encodes examples as mlx-lm does: a text whole, inside the special tokens the tokenizer's own
/// post-processor puts around a document (Llama's BOS); a completion and a conversation through the
/// chat template (a completion as a user message and the assistant's answer; without a template,
/// the prompt and the completion as one text); with prompt masking, the prompt is what the
/// template renders for the messages before the last, with the assistant's turn opened when the
/// last message is the assistant's (mlx-lm's `add_generation_prompt`), so the loss counts the
/// last message only. Every example then ends with the end-of-sequence id (appended unless it
/// ends with it), which separates packed examples and teaches the model to stop.
pub struct SftEncoder<'a> {
    tokenizer: &'a dyn Tokenizer,
    template: Option<&'a ChatTemplate>,
    mask_prompt: bool,
}

impl<'a> SftEncoder<'a> {
    /// An encoder with `tokenizer`, the chat template if there is one, and whether the prompt is
    /// left out of the loss.
    pub fn new(
        tokenizer: &'a dyn Tokenizer,
        template: Option<&'a ChatTemplate>,
        mask_prompt: bool,
    ) -> Self {
        SftEncoder {
            tokenizer,
            template,
            mask_prompt,
        }
    }

    /// Whether the prompt is left out of the loss.
    pub fn masks_prompt(&self) -> bool {
        self.mask_prompt
    }

    /// The ids of `example`, or what is wrong with it.
    pub fn encode(&self, example: &Example) -> Result<Tokenized, ExampleFault> {
        // A template writes its own special tokens (`transformers` tokenizes its text without
        // them); plain text gets the tokenizer's, as mlx-lm's `tokenizer.encode(text)` does.
        let ((text, prompt), (before, after)) = match example {
            Example::Text(text) => ((text.clone(), None), self.tokenizer.framing()),
            Example::Completion { prompt, completion } if self.template.is_none() => (
                (format!("{prompt}{completion}"), Some(prompt.len())),
                self.tokenizer.framing(),
            ),
            Example::Completion { prompt, completion } => {
                let messages = [message("user", prompt), message("assistant", completion)];
                (self.rendered(&messages, None, true)?, (&[][..], &[][..]))
            }
            Example::Chat { messages, tools } => {
                let last_is_assistant = messages
                    .last()
                    .and_then(|last| last.get_attr("role").ok())
                    .is_some_and(|role| role.as_str() == Some("assistant"));
                (
                    self.rendered(messages, tools.as_ref(), last_is_assistant)?,
                    (&[][..], &[][..]),
                )
            }
        };
        let tokenizer_fault = |error: DataError| ExampleFault::Tokenizer(error.to_string());
        let (body, prompt_len) = match prompt.filter(|_| self.mask_prompt) {
            Some(split) => {
                let (ids, prompt_len) = self
                    .tokenizer
                    .encode_split(&text, split)
                    .map_err(tokenizer_fault)?;
                (ids, before.len() + prompt_len)
            }
            None => (self.tokenizer.encode(&text).map_err(tokenizer_fault)?, 0),
        };
        let mut ids = [before, &body, after].concat();
        if let Some(eos) = self.tokenizer.eos_id() {
            if ids.last() != Some(&eos) {
                ids.push(eos);
            }
        }
        Ok(Tokenized { ids, prompt_len })
    }

    /// The whole conversation's text and, with prompt masking, the length of the text of the
    /// messages before the last (with the assistant's turn opened if `open_turn`).
    fn rendered(
        &self,
        messages: &[Value],
        tools: Option<&Value>,
        open_turn: bool,
    ) -> Result<(String, Option<usize>), ExampleFault> {
        let template = self.template.ok_or(ExampleFault::NoTemplate)?;
        let render = |messages: &[Value], open: bool| {
            template
                .render(messages, tools, open)
                .map_err(|error| match error {
                    DataError::Template { name, cause } => ExampleFault::Template { name, cause },
                    other => ExampleFault::Template {
                        name: template.name().to_owned(),
                        cause: other.to_string(),
                    },
                })
        };
        let whole = render(messages, false)?;
        if !self.mask_prompt {
            return Ok((whole, None));
        }
        let prompt = render(&messages[..messages.len() - 1], open_turn)?;
        if !whole.starts_with(&prompt) {
            return Err(ExampleFault::PromptNotPrefix {
                name: template.name().to_owned(),
            });
        }
        Ok((whole, Some(prompt.len())))
    }
}

fn message(role: &str, content: &str) -> Value {
    Value::from_iter([
        ("role", Value::from(role)),
        ("content", Value::from(content)),
    ])
}
