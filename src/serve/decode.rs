//! A sequence's events turned into text deltas, on the async side: incremental
//! detokenization, stop strings, the finish reason and the count of generated tokens. Dropping
//! the deltas' receiver (a client gone) or reaching a stop string drops the events' receiver,
//! which cancels the sequence in the engine.

use super::engine::{Event, FinishReason};
use lmx::runtime::data::Tokenizer;
use lmx::runtime::generate::text::TextStream;
use std::sync::Arc;
use tokio::sync::mpsc;

/// What a client is sent about its sequence.
#[derive(Debug)]
pub enum Delta {
    /// More text.
    Text(String),
    /// The end: why (OpenAI's `finish_reason`), and how many tokens were generated.
    Done {
        /// `stop` (a stop token or string) or `length`.
        finish: &'static str,
        /// Tokens generated.
        tokens: usize,
    },
    /// The sequence failed.
    Failed(String),
}

/// Reads `events` until the sequence ends, sending its text to `deltas`.
pub async fn decode(
    tokenizer: Arc<dyn Tokenizer>,
    stops: Vec<String>,
    mut events: mpsc::UnboundedReceiver<Result<Event, String>>,
    deltas: mpsc::Sender<Delta>,
) {
    let mut text = TextStream::new(tokenizer, stops);
    let mut tokens = 0;
    let last = loop {
        let event = match events.recv().await {
            Some(Ok(event)) => event,
            Some(Err(message)) => break Delta::Failed(message),
            None => break Delta::Failed("the generation engine stopped".into()),
        };
        tokens += 1;
        // A stop token ends the text; it has none of its own.
        let piece = match event.finish {
            Some(FinishReason::Stop) => None,
            _ => text.push(event.token),
        };
        if let Some(piece) = piece {
            if deltas.send(Delta::Text(piece)).await.is_err() {
                return;
            }
        }
        if text.stopped() {
            break Delta::Done {
                finish: "stop",
                tokens,
            };
        }
        if let Some(finish) = event.finish {
            let rest = text.finish();
            if !rest.is_empty() && deltas.send(Delta::Text(rest)).await.is_err() {
                return;
            }
            let finish = match finish {
                FinishReason::Length if !text.stopped() => "length",
                _ => "stop",
            };
            break Delta::Done { finish, tokens };
        }
    };
    drop(events);
    let _ = deltas.send(last).await;
}
