//! `lmx serve`: an HTTP server with the OpenAI API (`/v1/completions`, `/v1/chat/completions`
//! with server-sent events, `/v1/models`) over one model.
//!
//! MLX is not thread-safe, so one thread owns the model: the [`worker`] runs an [`Engine`]
//! with continuous batching (queued requests join the running batch between steps). The HTTP
//! side ([`http`], on tokio and axum) reads and checks requests ([`api`]), queues them over a
//! bounded channel (a full queue answers 429) and turns each sequence's tokens into text
//! ([`decode`], with the runtime's `generate::text::TextStream`) as it streams them. A client that leaves drops its channel, and the
//! worker cancels its sequence.

pub mod api;
pub mod decode;
pub mod engine;
pub mod error;
pub mod http;
pub mod worker;

pub use engine::Engine;

use lmx::runtime::data::sft::ChatTemplate;
use lmx::runtime::data::Tokenizer;
use std::io::Write as _;
use std::sync::Arc;
use tokio::sync::mpsc;

/// The served model, as the API names and bounds it.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    /// Its id in requests and `/v1/models`.
    pub id: String,
    /// When it was loaded (seconds since the Unix epoch).
    pub created: u64,
    /// The longest sequence (prompt and generated tokens) it takes.
    pub context_len: usize,
    /// Its vocabulary size.
    pub vocab_size: usize,
}

/// Where the server listens and what it accepts.
#[derive(Clone, Debug)]
pub struct Options {
    /// The address to bind.
    pub host: String,
    /// The port (0: any free one; the address bound is printed).
    pub port: u16,
    /// The key requests must give as a Bearer token, if any.
    pub api_key: Option<String>,
    /// The model's id in the API.
    pub model_id: String,
    /// The largest request body, in bytes.
    pub max_body_bytes: usize,
    /// The largest `max_tokens` a request may ask.
    pub max_tokens: usize,
    /// `max_tokens` when a request gives none.
    pub default_max_tokens: usize,
    /// The longest prompt, in tokens (at most the model's context less one).
    pub max_prompt_tokens: Option<usize>,
    /// Requests waiting for a place in the batch; more are refused with 429.
    pub max_queue: usize,
    /// Sequences generated at once.
    pub max_batch: usize,
    /// How long a shutdown waits for the requests in flight before cancelling them.
    pub shutdown_grace: std::time::Duration,
}

/// The text side of the model: its tokenizer and chat template.
pub struct Text {
    /// The tokenizer.
    pub tokenizer: Arc<dyn Tokenizer>,
    /// The chat template, if the model has one (`/v1/chat/completions` needs it).
    pub template: Option<ChatTemplate>,
}

/// What the engine's thread loads: the engine, the model's context length and vocabulary size.
pub type Loaded<E> = (E, usize, usize);

/// Serves until SIGINT or SIGTERM: `load` runs on the engine's thread (which then owns every
/// MLX array); the server listens once it has loaded, printing `listening on http://ADDRESS`.
/// On a signal it stops accepting connections and new requests (503), finishes the requests it
/// has, and returns.
pub fn serve<E, L>(options: Options, text: Text, load: L) -> anyhow::Result<()>
where
    E: Engine + 'static,
    L: FnOnce() -> anyhow::Result<Loaded<E>> + Send + 'static,
{
    anyhow::ensure!(options.max_queue > 0, "--max-queue must be at least 1");
    anyhow::ensure!(options.max_batch > 0, "--max-batch must be at least 1");
    anyhow::ensure!(options.max_tokens > 0, "--max-tokens must be at least 1");
    ignore_sigpipe();
    let (queue, jobs) = mpsc::channel(options.max_queue);
    let (loaded, shape) = std::sync::mpsc::channel();
    let counters = Arc::new(worker::Counters::default());
    let worker_counters = counters.clone();
    let max_batch = options.max_batch;
    let engine_thread = std::thread::Builder::new()
        .name("lmx-engine".into())
        .spawn(move || match load() {
            Ok((engine, context_len, vocab_size)) => {
                let _ = loaded.send(Ok((context_len, vocab_size)));
                worker::run(engine, jobs, max_batch, worker_counters);
            }
            Err(err) => {
                let _ = loaded.send(Err(err));
            }
        })?;
    let (context_len, vocab_size) = shape
        .recv()
        .map_err(|_| anyhow::anyhow!("the engine's thread ended while loading the model"))??;
    let model = ModelInfo {
        id: options.model_id.clone(),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_secs()),
        context_len,
        vocab_size,
    };
    let shared = Arc::new(http::Shared::new(
        model,
        text.tokenizer,
        text.template,
        api::Bounds {
            max_tokens: options.max_tokens,
            default_max_tokens: options.default_max_tokens.min(options.max_tokens),
        },
        options.max_prompt_tokens.unwrap_or(usize::MAX),
        options.api_key.clone(),
        queue,
        counters,
    ));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let served = runtime.block_on(listen(&options, shared.clone()));
    // Whatever ended the server, the worker finishes what it has and stops.
    shared.close();
    drop(shared);
    drop(runtime);
    if engine_thread.join().is_err() {
        anyhow::bail!("the engine's thread panicked");
    }
    served
}

/// Binds, prints the address and serves until a signal.
async fn listen(options: &Options, shared: Arc<http::Shared>) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind((options.host.as_str(), options.port))
        .await
        .map_err(|err| {
            anyhow::anyhow!("cannot listen on {}:{}: {err}", options.host, options.port)
        })?;
    let address = listener.local_addr()?;
    // Installed before the address is announced: from then on a signal is the server's to
    // handle. (Installed lazily, a SIGTERM that came before axum first polled its shutdown
    // future met the default disposition and killed the process.)
    let signalled_by = signal();
    println!("listening on http://{address}");
    std::io::stdout().flush()?;
    let app = http::router(shared.clone(), options.max_body_bytes);
    let signalled = Arc::new(tokio::sync::Notify::new());
    let on_signal = signalled.clone();
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        signalled_by.await;
        eprintln!("shutting down: finishing the requests in flight");
        shared.close();
        on_signal.notify_one();
    });
    // A client that stops reading must not hold the process: past the grace period, the
    // requests still in flight are dropped, which cancels their sequences.
    let grace = options.shutdown_grace;
    let deadline = async move {
        signalled.notified().await;
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        served = server => served?,
        () = deadline => eprintln!(
            "shutting down: cancelled the requests still in flight after {grace:?}"
        ),
    }
    Ok(())
}

/// The first SIGINT or SIGTERM from now on: the handlers are installed when this is called, not
/// when the future is first polled.
fn signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let handlers = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    );
    async move {
        let (Ok(mut interrupt), Ok(mut terminate)) = handlers else {
            // Without signal handlers the server runs until killed.
            return std::future::pending().await;
        };
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    }
}

/// A client that closes its connection must not end the server: writing to the closed socket
/// fails with EPIPE instead of raising SIGPIPE (which `lmx` leaves at its default, ending the
/// process, for the sake of `lmx ... | head`).
fn ignore_sigpipe() {
    // SAFETY: sets the disposition of one signal to "ignore", which is async-signal-safe and
    // has no handler to race with.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}
