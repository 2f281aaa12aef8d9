//! The HTTP side: routes, the API key, request bodies into jobs, and answers as JSON or as
//! server-sent events.

use super::api::{self, Body, Bounds, Settings};
use super::decode::{decode, Delta};
use super::engine::Request;
use super::error::ApiError;
use super::worker::{Counters, Job};
use super::ModelInfo;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Request as HttpRequest, State};
use axum::http::{header, Method, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use axum::Router;
use futures_util::stream::{self, StreamExt};
use lmx::runtime::data::sft::minijinja::Value as TemplateValue;
use lmx::runtime::data::sft::ChatTemplate;
use lmx::runtime::data::Tokenizer;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc::{self, error::TrySendError};

/// What every handler shares.
pub struct Shared {
    /// The served model.
    pub model: ModelInfo,
    /// Its tokenizer.
    pub tokenizer: Arc<dyn Tokenizer>,
    /// Its chat template, if it has one.
    pub template: Option<ChatTemplate>,
    /// Bounds on `max_tokens`.
    pub bounds: Bounds,
    /// The longest prompt, in tokens.
    pub max_prompt_tokens: usize,
    /// The key a request must give as a Bearer token, if any.
    pub api_key: Option<String>,
    /// The engine's queue; `None` once the server shuts down.
    pub queue: RwLock<Option<mpsc::Sender<Job>>>,
    /// Its capacity.
    pub max_queue: usize,
    /// The worker's counters.
    pub counters: Arc<Counters>,
    /// Numbers the answers' ids.
    next_id: AtomicU64,
    /// Tells this process's ids from another's.
    id_prefix: u64,
}

impl Shared {
    /// Shared state with an open queue.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        model: ModelInfo,
        tokenizer: Arc<dyn Tokenizer>,
        template: Option<ChatTemplate>,
        bounds: Bounds,
        max_prompt_tokens: usize,
        api_key: Option<String>,
        queue: mpsc::Sender<Job>,
        counters: Arc<Counters>,
    ) -> Shared {
        Shared {
            model,
            tokenizer,
            template,
            bounds,
            max_prompt_tokens,
            api_key,
            max_queue: queue.max_capacity(),
            queue: RwLock::new(Some(queue)),
            counters,
            next_id: AtomicU64::new(0),
            id_prefix: api::fresh_seed() >> 32,
        }
    }

    /// Refuses new jobs from now on; queued and running ones finish.
    pub fn close(&self) {
        self.queue
            .write()
            .unwrap_or_else(|err| err.into_inner())
            .take();
    }

    fn next_id(&self, kind: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{kind}-{:08x}{n}", self.id_prefix)
    }

    /// Queues `job`; a full queue answers 429, a closed one 503.
    fn submit(&self, job: Job) -> Result<(), ApiError> {
        let queue = self
            .queue
            .read()
            .unwrap_or_else(|err| err.into_inner())
            .clone();
        let closed = || {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                "the server is shutting down",
            )
        };
        match queue.ok_or_else(closed)?.try_send(job) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "queue_full",
                format!(
                    "the server's queue is full ({} requests waiting); retry later",
                    self.max_queue
                ),
            )),
            Err(TrySendError::Closed(_)) => Err(closed()),
        }
    }
}

/// The server's routes over `shared`, bodies limited to `max_body_bytes`.
pub fn router(shared: Arc<Shared>, max_body_bytes: usize) -> Router {
    let api = Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model))
        .route_layer(middleware::from_fn_with_state(shared.clone(), authorize));
    Router::new()
        .merge(api)
        .route("/health", get(health))
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(axum::extract::DefaultBodyLimit::max(max_body_bytes))
        .with_state(shared)
}

/// Refuses a request without the API key (when the server has one) with 401.
async fn authorize(
    State(shared): State<Arc<Shared>>,
    request: HttpRequest,
    next: Next,
) -> Response {
    let Some(key) = &shared.api_key else {
        return next.run(request).await;
    };
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "));
    match given {
        Some(given) if same(given.trim().as_bytes(), key.as_bytes()) => next.run(request).await,
        Some(_) => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_api_key",
            "the API key given is not this server's",
        )
        .into_response(),
        None => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing_api_key",
            "this server needs an API key: send it as `Authorization: Bearer KEY`",
        )
        .into_response(),
    }
}

/// Compares in time that does not depend on where the bytes differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0, |diff, (x, y)| diff | (x ^ y)) == 0
}

async fn no_route(uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "unknown_url",
        format!("no route for {}", uri.path()),
    )
}

async fn wrong_method(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{} does not take {method}", uri.path()),
    )
}

async fn health(State(shared): State<Arc<Shared>>) -> Json<Value> {
    let counters = &shared.counters;
    Json(json!({
        "status": "ok",
        "active": counters.active.load(Ordering::Relaxed),
        "finished": counters.finished.load(Ordering::Relaxed),
        "cancelled": counters.cancelled.load(Ordering::Relaxed),
    }))
}

fn model_object(model: &ModelInfo) -> Value {
    json!({
        "id": model.id,
        "object": "model",
        "created": model.created,
        "owned_by": "lmx",
        "max_model_len": model.context_len,
    })
}

async fn models(State(shared): State<Arc<Shared>>) -> Json<Value> {
    Json(json!({ "object": "list", "data": [model_object(&shared.model)] }))
}

async fn model(
    State(shared): State<Arc<Shared>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Json<Value>, ApiError> {
    if id != shared.model.id {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "model_not_found",
            format!(
                "the model `{id}` does not exist; this server serves `{}`",
                shared.model.id
            ),
        ));
    }
    Ok(Json(model_object(&shared.model)))
}

/// The body, read within the size limit (413 past it) and parsed.
fn read_body(body: Result<Bytes, BytesRejection>, shared: &Shared) -> Result<Body, ApiError> {
    let bytes = body.map_err(|rejection| {
        let status = rejection.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                status,
                "request_too_large",
                "the request body is larger than this server accepts (--max-body-bytes)",
            )
        } else {
            ApiError::new(status, "invalid_body", rejection.body_text())
        }
    })?;
    let body = api::parse(&bytes)?;
    body.check_model(&shared.model)?;
    Ok(body)
}

/// Which endpoint an answer is for.
#[derive(Clone, Copy)]
enum Kind {
    Completion,
    Chat,
}

async fn completions(
    State(shared): State<Arc<Shared>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let answer = async {
        let mut body = read_body(body, &shared)?;
        let settings = body.settings(&shared.model, &shared.bounds)?;
        let prompt = match body.prompt.take() {
            None => {
                return Err(ApiError::invalid(
                    Some("prompt"),
                    "the request gives no prompt",
                ))
            }
            Some(prompt) => match prompt.single()? {
                Ok(text) => encode(&shared, &text, Framing::Tokenizer)?,
                Err(ids) => ids,
            },
        };
        generate(&shared, prompt, settings, body.stream, Kind::Completion).await
    };
    answer.await.unwrap_or_else(IntoResponse::into_response)
}

async fn chat(State(shared): State<Arc<Shared>>, body: Result<Bytes, BytesRejection>) -> Response {
    let answer = async {
        let body = read_body(body, &shared)?;
        let settings = body.settings(&shared.model, &shared.bounds)?;
        let messages = match &body.messages {
            Some(messages) if !messages.is_empty() => messages,
            _ => {
                return Err(ApiError::invalid(
                    Some("messages"),
                    "the request gives no messages",
                ))
            }
        };
        let template = shared.template.as_ref().ok_or_else(|| {
            ApiError::invalid(
                Some("messages"),
                format!(
                    "the model `{}` has no chat template; use /v1/completions",
                    shared.model.id
                ),
            )
        })?;
        let messages = messages
            .iter()
            .enumerate()
            .map(|(index, message)| {
                message
                    .for_template(index)
                    .map(|value| TemplateValue::from_serialize(&value))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let text = template
            .render(&messages, None, true)
            .map_err(|err| ApiError::invalid(Some("messages"), err.to_string()))?;
        let prompt = encode(&shared, &text, Framing::Template)?;
        generate(&shared, prompt, settings, body.stream, Kind::Chat).await
    };
    answer.await.unwrap_or_else(IntoResponse::into_response)
}

/// Who writes a prompt's special tokens.
enum Framing {
    /// The tokenizer's post-processor, as `transformers`' `encode(text)` (a Llama prompt's BOS).
    Tokenizer,
    /// The chat template, whose text `transformers` tokenizes without adding any.
    Template,
}

fn encode(shared: &Shared, text: &str, framing: Framing) -> Result<Vec<u32>, ApiError> {
    let ids = match framing {
        Framing::Tokenizer => shared.tokenizer.encode_framed(text),
        Framing::Template => shared.tokenizer.encode(text),
    };
    ids.map_err(|err| {
        ApiError::invalid(
            Some("prompt"),
            format!("the prompt cannot be tokenized: {err}"),
        )
    })
}

/// Checks the prompt, queues its sequence and answers with its text.
async fn generate(
    shared: &Arc<Shared>,
    prompt: Vec<u32>,
    settings: Settings,
    stream: bool,
    kind: Kind,
) -> Result<Response, ApiError> {
    check_prompt(shared, &prompt)?;
    let prompt_tokens = prompt.len();
    let (events, events_out) = mpsc::unbounded_channel();
    shared.submit(Job {
        request: Request {
            prompt,
            sampling: settings.sampling,
            stop_tokens: shared.tokenizer.eos_id().into_iter().collect(),
        },
        events,
    })?;
    let (deltas, mut deltas_out) = mpsc::channel(64);
    tokio::spawn(decode(
        shared.tokenizer.clone(),
        settings.stops,
        events_out,
        deltas,
    ));
    let answer = Answer {
        id: shared.next_id(match kind {
            Kind::Completion => "cmpl",
            Kind::Chat => "chatcmpl",
        }),
        created: unix_time(),
        model: shared.model.id.clone(),
        kind,
        prompt_tokens,
    };
    if stream {
        return Ok(answer
            .stream(deltas_out, settings.include_usage)
            .into_response());
    }
    let mut text = String::new();
    while let Some(delta) = deltas_out.recv().await {
        match delta {
            Delta::Text(piece) => text.push_str(&piece),
            Delta::Done { finish, tokens } => {
                return Ok(Json(answer.whole(&text, finish, tokens)).into_response())
            }
            Delta::Failed(message) => return Err(failed(message)),
        }
    }
    Err(failed("the generation ended without an answer".into()))
}

fn failed(message: String) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "generation_failed",
        message,
    )
}

/// Fails unless the prompt has tokens, all in the vocabulary, and fits the server's bound and
/// leaves room in the model's context for a token.
fn check_prompt(shared: &Shared, prompt: &[u32]) -> Result<(), ApiError> {
    let model = &shared.model;
    if prompt.is_empty() {
        return Err(ApiError::invalid(
            Some("prompt"),
            "the prompt has no tokens",
        ));
    }
    if let Some((position, id)) = prompt
        .iter()
        .enumerate()
        .find(|(_, &id)| id as usize >= model.vocab_size)
    {
        return Err(ApiError::invalid(
            Some("prompt"),
            format!(
                "token {id} at position {position} is outside the vocabulary of {} ids",
                model.vocab_size
            ),
        ));
    }
    let limit = shared
        .max_prompt_tokens
        .min(model.context_len.saturating_sub(1));
    if prompt.len() > limit {
        return Err(ApiError {
            code: "context_length_exceeded",
            ..ApiError::invalid(
                Some("prompt"),
                format!(
                    "the prompt has {} tokens; this server takes at most {limit} (the model's \
                     context is {})",
                    prompt.len(),
                    model.context_len
                ),
            )
        });
    }
    Ok(())
}

fn unix_time() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}

/// An answer's fixed fields.
struct Answer {
    id: String,
    created: u64,
    model: String,
    kind: Kind,
    prompt_tokens: usize,
}

impl Answer {
    fn usage(&self, tokens: usize) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": tokens,
            "total_tokens": self.prompt_tokens + tokens,
        })
    }

    /// The whole answer, not streamed.
    fn whole(&self, text: &str, finish: &str, tokens: usize) -> Value {
        let (object, choice) = match self.kind {
            Kind::Completion => (
                "text_completion",
                json!({ "index": 0, "text": text, "logprobs": null, "finish_reason": finish }),
            ),
            Kind::Chat => (
                "chat.completion",
                json!({
                    "index": 0,
                    "message": { "role": "assistant", "content": text },
                    "logprobs": null,
                    "finish_reason": finish,
                }),
            ),
        };
        let mut answer = self.envelope(object, choice);
        answer["usage"] = self.usage(tokens);
        answer
    }

    /// What every answer and chunk is wrapped in: the request's id, the object's kind, when and
    /// by which model, and its one choice.
    fn envelope(&self, object: &str, choice: Value) -> Value {
        json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        })
    }

    /// A streamed chunk: its choice's `delta` (chat) or `text` (completion), its finish.
    fn chunk(&self, text: Option<&str>, finish: Option<&str>) -> Value {
        let (object, choice) = match self.kind {
            Kind::Completion => (
                "text_completion",
                json!({
                    "index": 0,
                    "text": text.unwrap_or_default(),
                    "logprobs": null,
                    "finish_reason": finish,
                }),
            ),
            Kind::Chat => (
                "chat.completion.chunk",
                json!({
                    "index": 0,
                    "delta": text.map_or(json!({}), |text| json!({ "content": text })),
                    "logprobs": null,
                    "finish_reason": finish,
                }),
            ),
        };
        self.envelope(object, choice)
    }

    /// The answer as server-sent events: a chunk per delta (a chat's first says the role), the
    /// finish, the usage if asked, and `[DONE]`; a failure ends it with an error event.
    fn stream(
        self,
        deltas: mpsc::Receiver<Delta>,
        include_usage: bool,
    ) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
        let data = |value: Value| SseEvent::default().data(value.to_string());
        let opening = match self.kind {
            Kind::Chat => {
                let mut chunk = self.chunk(None, None);
                chunk["choices"][0]["delta"] = json!({ "role": "assistant", "content": "" });
                vec![data(chunk)]
            }
            Kind::Completion => Vec::new(),
        };
        let rest = stream::unfold(deltas, |mut deltas| async move {
            deltas.recv().await.map(|delta| (delta, deltas))
        })
        .map(move |delta| match delta {
            Delta::Text(text) => vec![data(self.chunk(Some(&text), None))],
            Delta::Done { finish, tokens } => {
                let mut events = vec![data(self.chunk(None, Some(finish)))];
                if include_usage {
                    let mut usage = self.chunk(None, None);
                    usage["choices"] = json!([]);
                    usage["usage"] = self.usage(tokens);
                    events.push(data(usage));
                }
                events.push(SseEvent::default().data("[DONE]"));
                events
            }
            Delta::Failed(message) => vec![data(failed(message).body())],
        });
        let events = stream::iter(opening)
            .chain(rest.flat_map(stream::iter))
            .map(Ok);
        Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(5)))
    }
}
