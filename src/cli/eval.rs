//! `lmx eval`: a run's loss and perplexity on supervised examples (its folder's `test.jsonl`, or
//! a file given), over the targets its training counted.

use super::run_file::RunFile;
use super::sft::SftSettings;
use super::tokenizer::TokenizerSpec;
use lmx::runtime::data::{Batch, Rows};
use lmx::runtime::model::{LanguageModel, TrainingStep};
use lmx::runtime::nn::IGNORE_TARGET;
use std::path::PathBuf;

/// What `lmx eval` was asked to do.
pub struct EvalRequest {
    /// The run directory.
    pub run: PathBuf,
    /// A checkpoint directory other than the run's latest.
    pub checkpoint: Option<PathBuf>,
    /// A JSONL file of examples instead of the run's `test.jsonl`.
    pub data: Option<PathBuf>,
    /// Rows per forward pass (default: the run's batch size).
    pub batch_size: Option<usize>,
}

/// What the evaluation found.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    /// The mean loss over the counted targets.
    pub loss: f64,
    /// `exp(loss)`.
    pub perplexity: f64,
    /// The targets counted.
    pub tokens: usize,
    /// The examples read.
    pub examples: usize,
}

/// Evaluates a run of step `S`'s model and prints its loss and perplexity.
pub fn evaluate<S: TrainingStep>(run: &RunFile, request: EvalRequest) -> anyhow::Result<()> {
    let (file, settings) = match (&request.data, &run.sft) {
        (Some(file), settings) => (file.clone(), settings.clone().unwrap_or_else(plain)),
        (None, Some(settings)) => match &run.data[..] {
            [dir] => (dir.join("test.jsonl"), settings.clone()),
            _ => anyhow::bail!("the run's record names no folder of examples; give --data FILE"),
        },
        (None, None) => anyhow::bail!(
            "{} was not trained on a folder of supervised examples; give --data FILE.jsonl",
            request.run.display()
        ),
    };
    let config: <S::Model as LanguageModel>::Config =
        serde_json::from_value(run.model_config.clone())?;
    S::Model::validate(&config)?;
    let checkpoint = super::run_file::checkpoint_of(&request.run, request.checkpoint.clone())?;
    let tokenizer = run.tokenizer.load(&request.run)?;
    let tokenizer_file = match &run.tokenizer {
        TokenizerSpec::HuggingFace { path, .. } => Some(path.as_path()),
        _ => None,
    };
    let template = super::sft::template(&settings, tokenizer_file)?;
    let set = super::sft::load(&file, &settings, tokenizer.as_ref(), template.as_ref())?;
    let rows = super::sft::rows(&set, run.train.seq_len, settings.batching)?;
    rows.check_vocab(S::Model::vocab_size(&config))?;
    let batch_size = request.batch_size.unwrap_or(run.train.batch_size);
    if batch_size == 0 {
        anyhow::bail!("--batch-size must be at least 1");
    }
    // A LoRA run's checkpoints hold its adapters, which its parameters must have to load.
    let params = super::run_file::load_params::<S::Model>(run, &config, &checkpoint, None)?;
    let params = run.train.precision.for_compute(&params)?;
    let result = loss_over(&rows, batch_size, set.examples.len(), |batch| {
        let (inputs, targets) = batch.to_arrays();
        let loss = S::loss(&params, &config, &[inputs, targets], None)?;
        Ok(f64::from(loss.item_exact::<f32>()))
    })?;
    println!(
        "{}: loss {:.4}, perplexity {:.3} ({} targets of {} examples; checkpoint {})",
        file.display(),
        result.loss,
        result.perplexity,
        result.tokens,
        result.examples,
        checkpoint.display()
    );
    Ok(())
}

/// Settings for a file given to a run trained on plain text: nothing masked, one example a row.
fn plain() -> SftSettings {
    SftSettings {
        mask_prompt: false,
        batching: Default::default(),
        chat_template: None,
        keys: Default::default(),
    }
}

/// The mean over every counted target of `rows`: each batch's mean loss (`batch_loss`) weighed
/// by its counted targets. The last batch is filled up with rows of no counted target, so
/// every row is read once.
fn loss_over(
    rows: &dyn Rows,
    batch_size: usize,
    examples: usize,
    mut batch_loss: impl FnMut(&Batch) -> anyhow::Result<f64>,
) -> anyhow::Result<Evaluation> {
    let seq_len = rows.seq_len();
    let (mut total, mut tokens) = (0.0f64, 0usize);
    for first in (0..rows.count()).step_by(batch_size) {
        let mut inputs = vec![0; batch_size * seq_len];
        let mut targets = vec![IGNORE_TARGET; batch_size * seq_len];
        for (row, index) in (first..rows.count().min(first + batch_size)).enumerate() {
            let span = row * seq_len..(row + 1) * seq_len;
            rows.read(index, &mut inputs[span.clone()], &mut targets[span])?;
        }
        let batch = Batch {
            inputs,
            targets,
            batch_size,
            seq_len,
        };
        let kept = batch.kept_targets();
        if kept > 0 {
            total += batch_loss(&batch)? * kept as f64;
            tokens += kept;
        }
    }
    let loss = total / tokens.max(1) as f64;
    Ok(Evaluation {
        loss,
        perplexity: loss.exp(),
        tokens,
        examples,
    })
}
