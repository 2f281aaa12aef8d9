//! The engine's thread: it owns the model (MLX is not thread-safe) and runs continuous
//! batching. Between steps it admits queued jobs into the running batch (up to its size),
//! cancels the sequences whose requester is gone, steps every active sequence and sends each
//! token to its requester's channel.

use super::engine::{Engine, Event, Request, SeqId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc::{self, error::TryRecvError};

/// A sequence to generate, and where its tokens go.
pub struct Job {
    /// The sequence.
    pub request: Request,
    /// Its tokens, or the error that ended it. Dropping the receiver cancels the sequence.
    pub events: mpsc::UnboundedSender<Result<Event, String>>,
}

/// What the worker has done, for `/health`.
#[derive(Default)]
pub struct Counters {
    /// Sequences in the running batch.
    pub active: AtomicUsize,
    /// Sequences cancelled before they finished because their requester left (a client that
    /// disconnected, or a stop string that ended the text).
    pub cancelled: AtomicUsize,
    /// Sequences finished.
    pub finished: AtomicUsize,
}

/// Runs `engine` over the jobs of `queue`, `max_batch` sequences at a time, until the queue is
/// closed (every sender dropped) and every admitted sequence has finished.
pub fn run<E: Engine>(
    mut engine: E,
    mut queue: mpsc::Receiver<Job>,
    max_batch: usize,
    counters: Arc<Counters>,
) {
    let mut sinks: HashMap<SeqId, mpsc::UnboundedSender<Result<Event, String>>> = HashMap::new();
    let mut open = true;
    loop {
        while open && engine.active() < max_batch {
            // An idle worker sleeps until a job comes; a busy one only takes what is waiting.
            let job = if engine.active() == 0 {
                match queue.blocking_recv() {
                    Some(job) => job,
                    None => {
                        open = false;
                        break;
                    }
                }
            } else {
                match queue.try_recv() {
                    Ok(job) => job,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            };
            if job.events.is_closed() {
                continue;
            }
            match engine.insert(job.request) {
                Ok(id) => {
                    sinks.insert(id, job.events);
                }
                Err(err) => {
                    let _ = job.events.send(Err(err.to_string()));
                }
            }
        }
        sinks.retain(|&id, sink| {
            let gone = sink.is_closed();
            if gone {
                engine.cancel(id);
                counters.cancelled.fetch_add(1, Ordering::Relaxed);
            }
            !gone
        });
        counters.active.store(engine.active(), Ordering::Relaxed);
        if engine.active() == 0 {
            if open {
                continue;
            }
            return;
        }
        match engine.step() {
            Ok(events) => {
                for event in events {
                    if let Some(sink) = sinks.get(&event.id) {
                        let _ = sink.send(Ok(event));
                    }
                    if event.finish.is_some() {
                        sinks.remove(&event.id);
                        counters.finished.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            // A failed step fails the sequences it was stepping; the server goes on.
            Err(err) => {
                let message = format!("generation failed: {err}");
                for (id, sink) in sinks.drain() {
                    engine.cancel(id);
                    let _ = sink.send(Err(message.clone()));
                }
            }
        }
        counters.active.store(engine.active(), Ordering::Relaxed);
    }
}
