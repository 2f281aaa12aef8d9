//! Continuous batching: many sequences decoded together, one token each per step, new ones
//! joining the running batch as they come.
//!
//! The rows share the cache's slots ([`KvCache`]): a sequence that joins a batch whose rows fill
//! `L` slots places its prompt in the last slots before `L` (its earlier slots masked) and is fed
//! alone once, with the positions of those slots; from then on it takes one slot per step with
//! the others. A sequence whose prompt is longer than `L`, or that would run past the model's
//! context from there, waits until the batch has drained; then the waiting sequences start
//! together, the shorter prompts left-padded to the longest.
//!
//! From then on every step feeds one token of every row through a compiled step
//! ([`BatchStep`]), traced once per (bucket of rows, cache capacity block): the cache holds the
//! running rows, rounded up to a bucket with copies of the first.
//!
//! Attention then sees only distances between slots, so a sequence's tokens are the same as when
//! decoded alone for models whose positions are relative (rotary embeddings, ALiBi); absolute
//! positions (GPT-2's learned table, sinusoids) count from each row's own first slot
//! ([`Positions::rows`](crate::nn::Positions)), so those rows decode as alone too.

use super::batch_step::BatchStep;
use super::cache::KvCache;
use super::decode::PREFILL_CHUNK;
use super::row_sampler::RowSampler;
use super::sampler::Sampler;
use super::{check_prompt, Sampling};
use crate::error::{Error, Result};
use crate::model::{Context, LanguageModel};
use crate::nn;
use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::transforms::{async_eval, eval};
use mlx_rs::{ops, Array, Dtype};
use std::collections::VecDeque;

/// A sequence of a [`BatchGenerator`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SeqId(pub u64);

/// One sequence to generate: its prompt, sampling settings (`max_tokens` included) and the
/// tokens that end it.
#[derive(Clone, Debug)]
pub struct Request {
    /// The prompt's token ids (at least one).
    pub prompt: Vec<u32>,
    /// How its tokens are chosen, and how many at most.
    pub sampling: Sampling,
    /// Tokens that end the sequence (reported, with [`FinishReason::Stop`]): the tokenizer's
    /// end-of-sequence ids, say.
    pub stop_tokens: Vec<u32>,
}

/// Why a sequence ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// It reached `max_tokens`, or the model's context.
    Length,
    /// It produced one of its stop tokens.
    Stop,
    /// It was cancelled ([`BatchGenerator::cancel`] reports no event; a caller that cancels on
    /// its side, as a server for a client gone, uses this to say so).
    Cancelled,
}

/// A token of a sequence; a sequence's last event carries why it ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// The sequence.
    pub id: SeqId,
    /// Its next token.
    pub token: u32,
    /// Set on the sequence's last token.
    pub finish: Option<FinishReason>,
}

/// How much a [`BatchGenerator`] takes on.
#[derive(Clone, Debug)]
pub struct BatchLimits {
    /// Sequences decoded together at most; more wait.
    pub max_batch: usize,
    /// Sequences waiting at most; [`BatchGenerator::insert`] refuses more.
    pub max_waiting: usize,
}

impl Default for BatchLimits {
    fn default() -> Self {
        BatchLimits {
            max_batch: 32,
            max_waiting: 256,
        }
    }
}

/// A running sequence: one row of the batch.
struct Row {
    id: SeqId,
    sampler: Sampler,
    stop_tokens: Vec<u32>,
    /// Tokens it may still produce.
    left: usize,
}

/// A sequence not yet started.
struct Waiting {
    id: SeqId,
    request: Request,
    /// Tokens it may produce: `max_tokens`, within the model's context.
    limit: usize,
}

/// Decodes many sequences at once, each with its own settings; see the module's documentation.
/// MLX is not thread-safe: a server keeps it on one thread and talks to it over channels.
pub struct BatchGenerator<M: LanguageModel> {
    params: M::Params,
    config: M::Config,
    limits: BatchLimits,
    /// The batch's cache: a row per entry of `rows`, then copies of the first up to
    /// `cache_rows`.
    ctx: Context,
    /// Rows the cache holds: `rows`' count, or its bucket once a step ran.
    cache_rows: usize,
    rows: Vec<Row>,
    /// The compiled decode step, made at the first step (its inputs' count is the prefilled
    /// cache's).
    decoder: Option<BatchStep>,
    /// The compiled draw of rows that sample alike, made when they first do.
    row_sampler: Option<RowSampler>,
    /// The token each row produced last and has not reported yet (`uint32`, `[rows]`, queued).
    pending: Option<Array>,
    waiting: VecDeque<Waiting>,
    next_id: u64,
}

impl<M: LanguageModel> BatchGenerator<M> {
    /// A generator over `params` (arrays share their data: a clone costs nothing).
    pub fn new(params: M::Params, config: M::Config, limits: BatchLimits) -> Result<Self> {
        M::validate(&config)?;
        if limits.max_batch == 0 {
            return Err(Error::Setting {
                name: "max_batch",
                value: "0".into(),
                expected: "at least 1",
            });
        }
        Ok(BatchGenerator {
            params,
            config,
            limits,
            ctx: Context::generation(),
            cache_rows: 0,
            rows: Vec::new(),
            decoder: None,
            row_sampler: None,
            pending: None,
            waiting: VecDeque::new(),
            next_id: 0,
        })
    }

    /// Queues `request`; it joins the running batch at the next [`step`](Self::step) if it can.
    /// Fails on an invalid request (sampling settings, prompt, a `max_tokens` of 0 or a prompt
    /// that fills the context, leaving no token to generate) or a full queue.
    pub fn insert(&mut self, request: Request) -> Result<SeqId> {
        request.sampling.validate()?;
        request.sampling.check_vocab(M::vocab_size(&self.config))?;
        check_prompt::<M>(&self.config, &request.prompt)?;
        let limit = request
            .sampling
            .max_tokens
            .min(M::context_len(&self.config) - request.prompt.len());
        if limit == 0 {
            return Err(Error::Setting {
                name: "max_tokens",
                value: request.sampling.max_tokens.to_string(),
                expected: "at least 1, with room for it in the model's context after the prompt",
            });
        }
        if self.waiting.len() >= self.limits.max_waiting {
            return Err(Error::Setting {
                name: "max_waiting",
                value: self.limits.max_waiting.to_string(),
                expected: "room for one more waiting sequence (the queue is full)",
            });
        }
        let id = SeqId(self.next_id);
        self.next_id += 1;
        self.waiting.push_back(Waiting { id, request, limit });
        Ok(id)
    }

    /// Generates from now on with `params` (trained further, say: GRPO's policy between
    /// updates), keeping the compiled steps, whose traces take the parameters as inputs. The
    /// parameters must have the shapes and dtypes of the ones they replace.
    ///
    /// # Errors
    /// [`Error::Config`] while sequences are running or waiting: their caches were computed with
    /// the parameters they started with.
    pub fn set_params(&mut self, params: M::Params) -> Result<()> {
        if self.active() > 0 {
            return Err(Error::Config(format!(
                "the parameters change between generations: {} sequences are running or waiting",
                self.active()
            )));
        }
        if let Some(decoder) = &mut self.decoder {
            decoder.set_params(&params);
        }
        self.params = params;
        Ok(())
    }

    /// Sequences running or waiting.
    pub fn active(&self) -> usize {
        self.rows.len() + self.waiting.len()
    }

    /// Drops sequence `id`, running or waiting, freeing its row; it reports nothing more.
    pub fn cancel(&mut self, id: SeqId) {
        self.waiting.retain(|waiting| waiting.id != id);
        if let Some(row) = self.rows.iter().position(|row| row.id == id) {
            let keep: Vec<usize> = (0..self.rows.len()).filter(|&r| r != row).collect();
            // A failure here would leave the cache and the rows out of step: start afresh.
            if self.keep_rows(&keep).is_err() {
                self.clear();
            }
        }
    }

    /// Admits the waiting sequences that can join, then reports one token of every running
    /// sequence (each sequence's first token comes from its prompt), queueing the next step on
    /// the device before reading these tokens. Nothing to do gives no events.
    pub fn step(&mut self) -> Result<Vec<Event>> {
        self.admit()?;
        let Some(current) = self.pending.take() else {
            return Ok(Vec::new());
        };
        let next = self.forward(&current)?;
        eval([&current])?;
        let tokens: Vec<u32> = current.as_slice::<u32>().to_vec();
        let mut events = Vec::with_capacity(tokens.len());
        let mut keep = Vec::with_capacity(tokens.len());
        for (index, (row, &token)) in self.rows.iter_mut().zip(&tokens).enumerate() {
            row.left -= 1;
            let finish = if row.stop_tokens.contains(&token) {
                Some(FinishReason::Stop)
            } else if row.left == 0 {
                Some(FinishReason::Length)
            } else {
                keep.push(index);
                None
            };
            events.push(Event {
                id: row.id,
                token,
                finish,
            });
        }
        self.pending = Some(next);
        if keep.len() < self.rows.len() {
            self.keep_rows(&keep)?;
        }
        Ok(events)
    }

    /// Feeds every row's `tokens` (`[rows]`) through the compiled step and returns the tokens
    /// after them, queued.
    fn forward(&mut self, tokens: &Array) -> Result<Array> {
        let rows = self.rows.len();
        let bucket = bucket(rows, self.limits.max_batch);
        let cache = self.ctx.cache_mut().ok_or_else(|| {
            Error::Layout("a batch's decode step needs its prompts' cache".into())
        })?;
        let padded = padded(rows, bucket);
        if self.cache_rows != bucket {
            cache.keep_rows(&padded)?;
            self.cache_rows = bucket;
        }
        let input = if bucket > rows {
            tokens.take_axis(index(&padded), 0)?
        } else {
            tokens.clone()
        };
        let (params, config) = (&self.params, &self.config);
        let decoder = self
            .decoder
            .get_or_insert_with(|| BatchStep::new::<M>(params, config, cache.states.len()));
        let logits = decoder.step(cache, &input)?;
        let next = match self.sample_bucket(&logits) {
            Ok(next) => next,
            Err(err) => {
                // The step counted its slot filled; on CUDA its keys and values are written
                // only when the step runs (in place, by attention): run it before failing.
                async_eval([&logits])?;
                return Err(err);
            }
        };
        async_eval([&next])?;
        Ok(next)
    }

    /// The next token of every row after the bucket's `logits` (`[bucket, vocab]`: the rows,
    /// then copies of the first): one `argmax` when every row decodes greedily as is, one
    /// compiled draw when they sample alike ([`RowSampler`]), else each row's own sampler.
    fn sample_bucket(&mut self, logits: &Array) -> Result<Array> {
        let rows = self.rows.len() as i32;
        let samplers: Vec<&Sampler> = self.rows.iter().map(|row| &row.sampler).collect();
        let greedy = samplers.iter().all(|sampler| sampler.is_plain_greedy());
        let shared = RowSampler::shared(&samplers).filter(|_| !greedy);
        let Some(settings) = shared else {
            return sample(&mut self.rows, &logits.index(..rows));
        };
        let row_sampler = match self.row_sampler.take() {
            Some(current) if current.draws(&settings) => current,
            _ => RowSampler::new(settings)?,
        };
        let row_sampler = self.row_sampler.insert(row_sampler);
        let mut samplers: Vec<&mut Sampler> =
            self.rows.iter_mut().map(|row| &mut row.sampler).collect();
        row_sampler.next(&mut samplers, logits)
    }

    /// Times the compiled decode step was traced: at most once per (bucket of rows, cache
    /// capacity block) the batch met.
    pub fn traces(&self) -> usize {
        self.decoder.as_ref().map_or(0, BatchStep::traces)
    }

    /// Drops every row, and the cache with them.
    fn clear(&mut self) {
        self.rows.clear();
        self.settle();
        self.ctx = Context::generation();
        self.cache_rows = 0;
    }

    /// Waits for the step queued last and drops its tokens. Queued work that nothing waits for
    /// runs on MLX's own thread: a process that ends under it (a server shut down with its
    /// sequences cancelled) tears MLX down while that thread still runs, and corrupts the heap.
    fn settle(&mut self) {
        if let Some(pending) = self.pending.take() {
            // Nothing reads these tokens: a failure here is the step's, already dropped.
            let _ = eval([&pending]);
        }
    }

    /// Keeps the rows `keep` (in order), in the cache (padded to their bucket) and in the
    /// pending tokens.
    fn keep_rows(&mut self, keep: &[usize]) -> Result<()> {
        if keep.is_empty() {
            self.clear();
            return Ok(());
        }
        if let Some(cache) = self.ctx.cache_mut() {
            let bucket = bucket(keep.len(), self.limits.max_batch);
            let rows: Vec<usize> = padded(keep.len(), bucket)
                .into_iter()
                .map(|row| keep[row])
                .collect();
            cache.keep_rows(&rows)?;
            self.cache_rows = bucket;
        }
        if let Some(pending) = &self.pending {
            self.pending = Some(pending.take_axis(index(keep), 0)?);
        }
        let mut rows = std::mem::take(&mut self.rows);
        let mut kept: Vec<Option<Row>> = rows.drain(..).map(Some).collect();
        self.rows = keep
            .iter()
            .map(|&row| kept[row].take().expect("each row kept once"))
            .collect();
        Ok(())
    }

    /// Starts the waiting sequences that can start, first come first served: all those that
    /// fit when nothing runs, else each whose prompt ends by the batch's filled slots and whose
    /// tokens fit in the context from there.
    fn admit(&mut self) -> Result<()> {
        let room = self.limits.max_batch.saturating_sub(self.rows.len());
        if room == 0 || self.waiting.is_empty() {
            return Ok(());
        }
        let context = M::context_len(&self.config);
        if self.rows.is_empty() {
            let mut longest = 0;
            let mut group = Vec::new();
            while let Some(next) = self.waiting.front() {
                let len = longest.max(next.request.prompt.len());
                let fits = group
                    .iter()
                    .chain([next])
                    .all(|w: &Waiting| len + w.limit <= context);
                if group.len() == room || !fits {
                    break;
                }
                longest = len;
                group.push(self.waiting.pop_front().expect("front"));
            }
            return self.start(group, 0);
        }
        let filled = self.ctx.offset() as usize;
        let mut group = Vec::new();
        while let Some(next) = self.waiting.front() {
            if group.len() == room
                || next.request.prompt.len() > filled
                || filled + next.limit > context
            {
                break;
            }
            group.push(self.waiting.pop_front().expect("front"));
        }
        for waiting in group {
            self.start(vec![waiting], filled)?;
        }
        Ok(())
    }

    /// Feeds the prompts of `group` together, right-aligned to end at slot `end` (at least the
    /// longest prompt: the batch's filled slots, or 0 for a new batch), and appends their rows
    /// with their first tokens pending.
    fn start(&mut self, group: Vec<Waiting>, end: usize) -> Result<()> {
        if group.is_empty() {
            return Ok(());
        }
        let end = end.max(
            group
                .iter()
                .map(|w| w.request.prompt.len())
                .max()
                .unwrap_or(0),
        );
        // Slots before the shortest start hold nothing any of these rows sees: feed from there.
        let first = group
            .iter()
            .map(|w| end - w.request.prompt.len())
            .min()
            .unwrap_or(0);
        let width = end - first;
        let mut ids = Vec::with_capacity(group.len() * width);
        let mut starts = Vec::with_capacity(group.len());
        let mut rows = Vec::with_capacity(group.len());
        for waiting in group {
            let prompt = &waiting.request.prompt;
            starts.push((end - prompt.len()) as i32);
            ids.extend(std::iter::repeat_n(0, width - prompt.len()));
            ids.extend(prompt.iter().map(|&id| id as i32));
            rows.push(Row {
                id: waiting.id,
                sampler: Sampler::new(&waiting.request.sampling, prompt)?,
                stop_tokens: waiting.request.stop_tokens,
                left: waiting.limit,
            });
        }
        let mut ctx = Context::with_cache(KvCache::padded(starts, first as i32));
        let batch = rows.len() as i32;
        let mut from = 0;
        let logits = loop {
            let to = (from + PREFILL_CHUNK).min(width);
            let chunk: Vec<i32> = (0..rows.len())
                .flat_map(|row| ids[row * width + from..row * width + to].iter().copied())
                .collect();
            let chunk = Array::from_slice(&chunk, &[batch, (to - from) as i32]);
            let (params, config) = (&self.params, &self.config);
            let logits = nn::without_gradients(|| M::forward(params, config, &chunk, &mut ctx))?;
            if to == width {
                break logits;
            }
            eval(
                ctx.cache_mut()
                    .map(|cache| cache.arrays())
                    .unwrap_or_default(),
            )?;
            from = to;
        };
        let first_tokens = sample(&mut rows, &logits.index((.., -1)))?;
        async_eval([&first_tokens])?;
        let cache = ctx.take_cache().expect("a generation context");
        match self.ctx.cache_mut() {
            Some(batch_cache) if !self.rows.is_empty() => {
                // The bucket's copies of the first row go: the new rows come right after the
                // running ones.
                if self.cache_rows > self.rows.len() {
                    batch_cache.keep_rows(&(0..self.rows.len()).collect::<Vec<_>>())?;
                }
                batch_cache.append_rows(cache)?
            }
            _ => self.ctx = Context::with_cache(cache),
        }
        self.cache_rows = self.rows.len() + rows.len();
        self.pending = Some(match self.pending.take() {
            Some(pending) => ops::concatenate(&[pending, first_tokens], 0)?,
            None => first_tokens,
        });
        self.rows.extend(rows);
        Ok(())
    }
}

impl<M: LanguageModel> Drop for BatchGenerator<M> {
    fn drop(&mut self) {
        self.settle();
    }
}

/// The rows a step computes for `rows` running ones: the next power of two, within `max_batch`
/// (and at least `rows`), so that the step's traces are few however rows join and leave.
fn bucket(rows: usize, max_batch: usize) -> usize {
    rows.next_power_of_two().min(max_batch).max(rows)
}

/// The cache's rows for `rows` running ones in a bucket of `bucket`: each row, then copies of
/// the first.
fn padded(rows: usize, bucket: usize) -> Vec<usize> {
    (0..rows)
        .chain(std::iter::repeat_n(0, bucket - rows))
        .collect()
}

/// `rows` as an int32 index array.
fn index(rows: &[usize]) -> Array {
    let rows: Vec<i32> = rows.iter().map(|&row| row as i32).collect();
    Array::from_slice(&rows, &[rows.len() as i32])
}

/// The next token of every row after its logits (`[rows, vocab]`): one `argmax` when every row
/// decodes greedily as is, else each row's own sampler.
fn sample(rows: &mut [Row], logits: &Array) -> Result<Array> {
    if rows.iter().all(|row| row.sampler.is_plain_greedy()) {
        return Ok(argmax_axis(logits, -1, false)?.as_dtype(Dtype::Uint32)?);
    }
    let tokens = rows
        .iter_mut()
        .enumerate()
        .map(|(index, row)| row.sampler.next(&logits.index(index as i32)))
        .collect::<Result<Vec<_>>>()?;
    Ok(ops::stack(&tokens, 0)?)
}
