//! `lmx train` and `lmx generate` for one model, generic over its declared training step.

use super::run_file::RunFile;
use super::tokenizer::TokenizerArg;
use lmx::runtime::checkpoint::{self, MODEL_FILE};
use lmx::runtime::data::{
    DocumentEncoder, InputFormat, Separator, TokenFile, TokenSource, Windows,
};
use lmx::runtime::generate::{generate, Sampling};
use lmx::runtime::model::{LanguageModel, TrainingStep};
use lmx::runtime::train::{EarlyStopping, JsonlLog, ProgressBar, TrainConfig, Trainer};
use lmx::runtime::tree::Tree;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

/// What `lmx train` was asked to do, once flags and the TOML file are merged.
pub struct TrainRequest {
    /// The bundled model's name.
    pub model: String,
    /// Its preset.
    pub preset: String,
    /// Settings changed on top of the preset.
    pub settings: Vec<super::settings::Setting>,
    /// Text (`.txt`), JSONL (`.jsonl`) or token (`.tokens`) files.
    pub data: Vec<PathBuf>,
    /// The tokenizer.
    pub tokenizer: TokenizerArg,
    /// The training settings.
    pub train: TrainConfig,
    /// Continue from the run directory's latest checkpoint.
    pub resume: bool,
    /// Show a progress bar.
    pub progress: bool,
}

/// Trains the model of step `S`.
pub fn train<S: TrainingStep>(request: TrainRequest) -> anyhow::Result<()>
where
    <<S::Model as LanguageModel>::Params as Tree<lmx::runtime::Array>>::Of<
        Option<<S::Optimizer as lmx::runtime::optim::Optimizer>::Leaf>,
    >: Clone + 'static,
{
    let model_config = S::Model::preset(&request.preset).ok_or_else(|| {
        anyhow::anyhow!(
            "{} has no preset `{}`; its presets are {}",
            S::Model::NAME,
            request.preset,
            S::Model::presets().join(", ")
        )
    })?;
    let model_config = super::settings::apply(&model_config, &request.settings, S::Model::NAME)?;
    let vocab = S::Model::vocab_size(&model_config);
    let out_dir = request.train.out_dir.clone();
    let tokenizer_spec = request.tokenizer.resolve(vocab, &request.data);
    let prepared = tokenizer_spec.for_training(&out_dir, &request.data, vocab, request.resume)?;
    let tokenizer = &prepared.tokenizer;
    if tokenizer.vocab_size() > vocab {
        anyhow::bail!(
            "the tokenizer has {} ids but {} (preset {}) has a vocabulary of {vocab}",
            tokenizer.vocab_size(),
            S::Model::NAME,
            request.preset
        );
    }
    let context = S::Model::context_len(&model_config);
    if request.train.seq_len > context {
        anyhow::bail!(
            "seq_len {} is longer than the model's context of {context}",
            request.train.seq_len
        );
    }
    let source = tokens(&request.data, tokenizer.as_ref())?;
    let windows = Windows::new(source, request.train.seq_len)?;
    prepared.save(&out_dir)?;
    RunFile {
        model: request.model.clone(),
        preset: request.preset.clone(),
        model_config: serde_json::to_value(&model_config)?,
        tokenizer: tokenizer_spec,
        train: request.train.clone(),
    }
    .write(&out_dir)?;

    let patience = request.train.early_stopping_patience;
    let total_steps = request.train.steps;
    let log_every = request.train.log_every;
    let mut trainer = Trainer::<S>::new(model_config, request.train, windows)?;
    if request.resume {
        match trainer.latest_checkpoint()? {
            Some(dir) => {
                trainer.resume(&dir)?;
                eprintln!(
                    "resumed from {} at step {}",
                    dir.display(),
                    trainer.steps_done()
                );
            }
            None => eprintln!(
                "no checkpoint in {} yet: starting afresh",
                out_dir.display()
            ),
        }
    }
    trainer.add_callback(JsonlLog::append(out_dir.join("metrics.jsonl"))?);
    if request.progress {
        trainer.add_callback(ProgressBar::new(
            total_steps,
            trainer.steps_done(),
            log_every,
        ));
    }
    if patience > 0 {
        trainer.add_callback(EarlyStopping::new(patience));
    }
    let summary = trainer.run()?;
    println!(
        "trained {} to step {}: loss {:.4}{}, traced {} time(s)",
        S::Model::NAME,
        summary.steps,
        summary.last_loss,
        summary
            .last_val_loss
            .map_or(String::new(), |loss| format!(", validation loss {loss:.4}")),
        trainer.traces()
    );
    if let Some(reason) = summary.stopped {
        println!("stopped early: {reason}");
    }
    if let Some(dir) = summary.checkpoint {
        println!("checkpoint: {}", dir.display());
    }
    Ok(())
}

/// The token stream of `paths`: token files are mapped, text and JSONL files encoded.
fn tokens(
    paths: &[PathBuf],
    tokenizer: &dyn lmx::runtime::data::Tokenizer,
) -> anyhow::Result<Arc<dyn TokenSource>> {
    if paths.is_empty() {
        anyhow::bail!("no training data: give --data FILE (text, .jsonl or .tokens)");
    }
    if paths
        .iter()
        .all(|path| path.extension().is_some_and(|ext| ext == "tokens"))
    {
        if let [path] = paths {
            return Ok(Arc::new(TokenFile::open(path)?));
        }
        anyhow::bail!("give one .tokens file at a time");
    }
    let encoder = DocumentEncoder::new(tokenizer, Separator::Eos)?;
    let format = InputFormat::from_path(&paths[0]);
    Ok(Arc::new(encoder.encode_files(paths, &format)?))
}

/// What `lmx generate` was asked to do.
pub struct GenerateRequest {
    /// The run directory.
    pub run: PathBuf,
    /// A checkpoint directory other than the run's latest.
    pub checkpoint: Option<PathBuf>,
    /// The prompt.
    pub prompt: String,
    /// Sampling settings.
    pub sampling: Sampling,
}

/// Samples from the latest checkpoint of a run of step `S`'s model.
pub fn sample<S: TrainingStep>(run: &RunFile, request: GenerateRequest) -> anyhow::Result<()> {
    let config: <S::Model as LanguageModel>::Config =
        serde_json::from_value(run.model_config.clone())?;
    let checkpoint = match request.checkpoint {
        Some(dir) => dir,
        None => checkpoint::Checkpoints::new(request.run.join("checkpoints"))
            .latest()?
            .ok_or_else(|| anyhow::anyhow!("{} has no checkpoint yet", request.run.display()))?,
    };
    let template = run.train.precision.cast(&S::Model::init(&config, 0)?)?;
    let params = checkpoint::load_tree(&checkpoint.join(MODEL_FILE), &template)?;
    let tokenizer = run.tokenizer.load(&request.run)?;
    let prompt = tokenizer.encode(&request.prompt)?;
    print!("{}", request.prompt);
    let mut pending = Vec::new();
    let generation = generate::<S::Model>(
        &params,
        &config,
        &prompt,
        &request.sampling,
        tokenizer.eos_id(),
        |token| {
            pending.push(token);
            // Print as soon as the pending ids decode (a byte tokenizer may split a character).
            if let Ok(text) = tokenizer.decode(&pending) {
                if !text.contains('\u{FFFD}') {
                    print!("{text}");
                    let _ = std::io::stdout().flush();
                    pending.clear();
                }
            }
        },
    )?;
    println!();
    eprintln!(
        "{} tokens; prompt {:.0} tok/s, decode {:.1} tok/s",
        generation.tokens.len(),
        generation.prompt_tokens_per_s,
        generation.decode_tokens_per_s
    );
    Ok(())
}
