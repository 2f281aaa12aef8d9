//! The OpenAI API's request bodies, read and checked: a body becomes the prompt's tokens, the
//! sampling settings and stop strings of one sequence, or a 4xx [`ApiError`] naming the field.

use super::error::ApiError;
use super::ModelInfo;
use lmx::runtime::generate::Sampling;
use serde::Deserialize;
use std::collections::BTreeMap;

/// The fields of `/v1/completions` and `/v1/chat/completions` bodies that the server reads;
/// others are ignored, as OpenAI's server ignores fields it does not know.
#[derive(Deserialize, Default)]
pub struct Body {
    /// The model's id, as `/v1/models` lists it.
    pub model: Option<String>,
    /// `/v1/completions`: the text to continue.
    pub prompt: Option<Prompt>,
    /// `/v1/chat/completions`: the conversation.
    pub messages: Option<Vec<Message>>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    n: Option<u64>,
    best_of: Option<u64>,
    stop: Option<Stop>,
    seed: Option<i64>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    logit_bias: Option<BTreeMap<String, f32>>,
    /// Whether to answer with server-sent events.
    #[serde(default)]
    pub stream: bool,
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    echo: bool,
    suffix: Option<String>,
    logprobs: Option<serde_json::Value>,
    tools: Option<serde_json::Value>,
}

/// A completion's prompt: text, or token ids.
#[derive(Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// One text.
    Text(String),
    /// Texts; the server takes exactly one.
    Texts(Vec<String>),
    /// Token ids.
    Tokens(Vec<u32>),
    /// Lists of token ids; the server takes exactly one.
    TokenLists(Vec<Vec<u32>>),
}

/// One message of a chat.
#[derive(Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant`, ...
    pub role: String,
    /// Its text, or parts of which the text ones count.
    pub content: Option<Content>,
}

/// A message's content.
#[derive(Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Text.
    Text(String),
    /// Parts (`{"type": "text", "text": ...}`).
    Parts(Vec<Part>),
}

/// A part of a message's content.
#[derive(Deserialize)]
pub struct Part {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

/// `stop`: one string or several.
#[derive(Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// The most stop strings a request may give, as OpenAI allows.
const MAX_STOPS: usize = 4;

/// Reads a JSON body; a syntax or type error names where it is.
pub fn parse(bytes: &[u8]) -> Result<Body, ApiError> {
    let mut json = serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(&mut json).map_err(|err| {
        let path = err.path().to_string();
        let message = if path == "." {
            format!("the body is not a valid request: {}", err.inner())
        } else {
            format!("the body is not a valid request: {path}: {}", err.inner())
        };
        ApiError::invalid(None, message)
    })
}

/// What a request asks the engine for, beside its prompt.
#[derive(Debug, PartialEq)]
pub struct Settings {
    /// How tokens are chosen.
    pub sampling: Sampling,
    /// Stop strings: the text ends before the first.
    pub stops: Vec<String>,
    /// Whether a streamed answer ends with a chunk of token counts.
    pub include_usage: bool,
}

/// The server's bounds on what a request may ask.
#[derive(Clone, Debug)]
pub struct Bounds {
    /// The largest `max_tokens`.
    pub max_tokens: usize,
    /// `max_tokens` when a request gives none.
    pub default_max_tokens: usize,
}

impl Body {
    /// The model's id, which must be the served one's (404 otherwise).
    pub fn check_model(&self, model: &ModelInfo) -> Result<(), ApiError> {
        match &self.model {
            None => Err(ApiError::invalid(
                Some("model"),
                "the request names no model",
            )),
            Some(name) if *name != model.id => Err(ApiError {
                param: Some("model"),
                ..ApiError::new(
                    axum::http::StatusCode::NOT_FOUND,
                    "model_not_found",
                    format!(
                        "the model `{name}` does not exist; this server serves `{}`",
                        model.id
                    ),
                )
            }),
            Some(_) => Ok(()),
        }
    }

    /// The sampling settings and stop strings, each field checked against OpenAI's ranges and
    /// the server's bounds; a field the server does not support, set, is refused.
    pub fn settings(&self, model: &ModelInfo, bounds: &Bounds) -> Result<Settings, ApiError> {
        if self.n.is_some_and(|n| n != 1) {
            return invalid(
                "n",
                "this server generates one choice per request (n = 1)".into(),
            );
        }
        if self.best_of.is_some_and(|n| n != 1) {
            return invalid("best_of", "this server does not support best_of".into());
        }
        if self.echo {
            return invalid("echo", "this server does not support echo".into());
        }
        if self.suffix.is_some() {
            return invalid("suffix", "this server does not support suffix".into());
        }
        if self
            .logprobs
            .as_ref()
            .is_some_and(|value| !value.is_null() && *value != false)
        {
            return invalid(
                "logprobs",
                "this server does not return log probabilities".into(),
            );
        }
        if self.tools.as_ref().is_some_and(|value| !value.is_null()) {
            return invalid("tools", "this server does not call tools".into());
        }
        let (param, max_tokens) = match (self.max_completion_tokens, self.max_tokens) {
            (Some(max), _) => ("max_completion_tokens", Some(max)),
            (None, max) => ("max_tokens", max),
        };
        let max_tokens = match max_tokens {
            None => bounds.default_max_tokens,
            Some(0) => return invalid(param, format!("{param} must be at least 1")),
            Some(max) if max > bounds.max_tokens as u64 => {
                return invalid(
                    param,
                    format!(
                        "{param} is {max}; this server allows at most {}",
                        bounds.max_tokens
                    ),
                )
            }
            Some(max) => max as usize,
        };
        let temperature = self.temperature.unwrap_or(1.0);
        if !(0.0..=2.0).contains(&temperature) {
            return invalid(
                "temperature",
                format!("temperature is {temperature}; it must be in [0, 2]"),
            );
        }
        let top_p = self.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return invalid("top_p", format!("top_p is {top_p}; it must be in (0, 1]"));
        }
        let penalty = |param, value: Option<f32>| match value.unwrap_or(0.0) {
            value if (-2.0..=2.0).contains(&value) => Ok(value),
            value => invalid(param, format!("{param} is {value}; it must be in [-2, 2]")),
        };
        let presence_penalty = penalty("presence_penalty", self.presence_penalty)?;
        let frequency_penalty = penalty("frequency_penalty", self.frequency_penalty)?;
        let mut logit_bias = std::collections::BTreeMap::new();
        for (token, &bias) in self.logit_bias.iter().flatten() {
            let id = match token.parse::<u32>() {
                Ok(id) if (id as usize) < model.vocab_size => id,
                _ => {
                    return invalid(
                        "logit_bias",
                        format!(
                            "logit_bias names `{token}`, which is not a token id below the \
                             vocabulary size {}",
                            model.vocab_size
                        ),
                    )
                }
            };
            if !(-100.0..=100.0).contains(&bias) {
                return invalid(
                    "logit_bias",
                    format!("the bias of token {id} is {bias}; it must be in [-100, 100]"),
                );
            }
            logit_bias.insert(id, bias);
        }
        let stops = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(stop)) => vec![stop.clone()],
            Some(Stop::Many(stops)) => stops.clone(),
        };
        if stops.len() > MAX_STOPS {
            return invalid(
                "stop",
                format!(
                    "stop gives {} strings; at most {MAX_STOPS} are allowed",
                    stops.len()
                ),
            );
        }
        if stops.iter().any(String::is_empty) {
            return invalid("stop", "a stop string is empty".into());
        }
        let seed = match self.seed {
            Some(seed) => seed as u64,
            None => fresh_seed(),
        };
        Ok(Settings {
            sampling: Sampling {
                temperature,
                top_k: None,
                top_p: (top_p < 1.0).then_some(top_p),
                min_p: None,
                repetition_penalty: None,
                // OpenAI's penalties count every token so far.
                presence_penalty: (presence_penalty != 0.0).then_some(presence_penalty),
                frequency_penalty: (frequency_penalty != 0.0).then_some(frequency_penalty),
                penalty_context: model.context_len,
                logit_bias,
                seed,
                max_tokens,
            },
            stops,
            include_usage: self
                .stream_options
                .as_ref()
                .is_some_and(|options| options.include_usage),
        })
    }
}

impl Prompt {
    /// The one prompt's text or ids.
    pub fn single(self) -> Result<Result<String, Vec<u32>>, ApiError> {
        let one = |count: usize| {
            ApiError::invalid(
                Some("prompt"),
                format!("prompt gives {count} prompts; this server takes one per request"),
            )
        };
        match self {
            Prompt::Text(text) => Ok(Ok(text)),
            Prompt::Tokens(ids) => Ok(Err(ids)),
            Prompt::Texts(mut texts) if texts.len() == 1 => Ok(Ok(texts.remove(0))),
            Prompt::TokenLists(mut lists) if lists.len() == 1 => Ok(Err(lists.remove(0))),
            Prompt::Texts(texts) => Err(one(texts.len())),
            Prompt::TokenLists(lists) => Err(one(lists.len())),
        }
    }
}

impl Message {
    /// The message as a chat template reads it: `role` and `content` (its text parts joined).
    pub fn for_template(&self, index: usize) -> Result<serde_json::Value, ApiError> {
        let content = match &self.content {
            None => String::new(),
            Some(Content::Text(text)) => text.clone(),
            Some(Content::Parts(parts)) => {
                let mut text = String::new();
                for part in parts {
                    match (part.kind.as_str(), &part.text) {
                        ("text", Some(piece)) => text.push_str(piece),
                        (kind, _) => {
                            return Err(ApiError::invalid(
                                Some("messages"),
                                format!(
                                    "messages[{index}] has a content part of type `{kind}`; \
                                     this server reads text parts only"
                                ),
                            ))
                        }
                    }
                }
                text
            }
        };
        Ok(serde_json::json!({ "role": self.role, "content": content }))
    }
}

/// Refuses the field `param`.
fn invalid<T>(param: &'static str, message: String) -> Result<T, ApiError> {
    Err(ApiError::invalid(Some(param), message))
}

/// A seed for a request that gives none: different for every request.
pub fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}
