//! `lmx train --step grpo --data prompts.jsonl --reward exact|regex:PATTERN|length[:CHARS]`:
//! GRPO through `objectives::GrpoRun`. Each update takes `--batch-size` prompts (in order,
//! wrapping around), samples `--group` completions of each of up to `--seq-len` tokens at
//! `--temperature` from the current policy, scores them with the reward and trains on them
//! against a frozen copy of the run's start (`--beta`). Checkpoints and `--resume` as for plain
//! training: what an update draws depends only on its index.

use super::interrupt::{Interrupted, StopSignals};
use super::objective::{parse_reward, ObjectiveSettings};
use super::parallel::Rank;
use super::run_dir::RunDir;
use super::run_file::RunFile;
use super::tokenizer::ForTraining;
use super::train::{Resume, TrainRequest};
use lmx::runtime::checkpoint::Checkpoints;
use lmx::runtime::data::Tokenizer;
use lmx::runtime::model::{LanguageModel, TrainingStep};
use lmx::runtime::objectives::{GrpoConfig, GrpoRun, Prompt};
use lmx::runtime::train::{Callback, Control, JsonlLog, ProgressBar, StepReport};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The prompts of the one JSONL file `paths` names (`prompt`, and `answer` where the reward
/// compares with one), encoded with `tokenizer`; and how many ids they hold.
pub fn prompts(paths: &[PathBuf], tokenizer: &dyn Tokenizer) -> anyhow::Result<(Vec<Prompt>, u64)> {
    let [path] = paths else {
        anyhow::bail!("--step grpo reads one JSONL file of prompts (`prompt`, `answer`)");
    };
    let text = std::fs::read_to_string(path)
        .map_err(|err| anyhow::anyhow!("{}: {err}", path.display()))?;
    let mut prompts = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{}:{}", path.display(), index + 1);
        let value: serde_json::Value =
            serde_json::from_str(line).map_err(|err| anyhow::anyhow!("{}: {err}", at()))?;
        let Some(prompt) = value["prompt"].as_str().filter(|p| !p.is_empty()) else {
            anyhow::bail!("{}: no `prompt` text", at());
        };
        let answer = match &value["answer"] {
            serde_json::Value::Null => None,
            serde_json::Value::String(answer) => Some(answer.clone()),
            other => anyhow::bail!("{}: `answer` is {other}, not text", at()),
        };
        let ids = tokenizer
            .encode(prompt)
            .map_err(|err| anyhow::anyhow!("{}: {err}", at()))?;
        prompts.push(Prompt { ids, answer });
    }
    if prompts.is_empty() {
        anyhow::bail!("{}: no prompts", path.display());
    }
    let tokens = prompts.iter().map(|p| p.ids.len() as u64).sum();
    Ok((prompts, tokens))
}

/// Sets a flag when SIGINT or SIGTERM arrives, and stops the run after the update in flight.
struct StopOn(Arc<AtomicBool>);

impl Callback for StopOn {
    fn on_step(&mut self, _: &StepReport) -> lmx::runtime::Result<Control> {
        Ok(match self.0.load(Ordering::SeqCst) {
            true => Control::Stop("stopped on request".into()),
            false => Control::Continue,
        })
    }
}

/// What the shared part of `lmx train` prepared for a GRPO run.
pub struct Prepared<'a, S: TrainingStep> {
    pub request: &'a TrainRequest,
    pub model_config: <S::Model as LanguageModel>::Config,
    pub start: <S::Model as LanguageModel>::Params,
    pub prompts: Vec<Prompt>,
    pub run_dir: RunDir,
    pub run_file: RunFile,
    pub tokenizer: ForTraining,
    /// This process's rank of a data-parallel run.
    pub rank: Option<Rank>,
}

/// Trains the GRPO run `prepared` describes; `Ok(false)` when there was nothing to train.
pub fn train<S: TrainingStep>(prepared: Prepared<'_, S>) -> anyhow::Result<bool>
where
    <<S::Model as LanguageModel>::Params as lmx::runtime::tree::Tree<lmx::runtime::Array>>::Of<
        Option<<S::Optimizer as lmx::runtime::optim::Optimizer>::Leaf>,
    >: Clone + 'static,
{
    let Prepared {
        request,
        model_config,
        start,
        prompts,
        run_dir,
        run_file,
        tokenizer,
        rank,
    } = prepared;
    let leader = rank.as_ref().is_none_or(Rank::leads);
    let Some(ObjectiveSettings::Grpo {
        reward,
        group,
        temperature,
        beta,
    }) = &request.objective
    else {
        anyhow::bail!("a GRPO run without its settings");
    };
    let out_dir = request.train.out_dir.clone();
    let train = &request.train;
    let config = GrpoConfig {
        steps: train.steps,
        prompts_per_step: train.batch_size,
        group: *group,
        temperature: *temperature,
        max_tokens: train.seq_len,
        stop: None,
        beta: *beta,
        epsilon: 0.2,
        schedule: train.schedule.clone(),
        seed: train.seed,
        checkpoint_every: train.checkpoint_every,
        out_dir: out_dir.clone(),
        state_packing: train.state_packing,
    };
    let reward = parse_reward(reward, train.seq_len)?;
    // Only rank 0 writes the run folder.
    if leader {
        if request.overwrite {
            run_dir.clear()?;
        }
        run_dir.probe()?;
        tokenizer.save(&out_dir)?;
    }
    let decoder = tokenizer.tokenizer;
    let decode = move |ids: &[u32]| decoder.decode(ids).unwrap_or_default();
    let mut run = GrpoRun::<S::Model, S::Optimizer>::data_parallel(
        model_config,
        config,
        train.precision.cast(&start)?,
        S::optimizer(),
        S::options(),
        prompts,
        reward,
        Box::new(decode),
        rank.as_ref().map(|rank| rank.parallel.clone()),
    )?;
    let checkpoint = match &request.resume {
        Some(Resume::From(dir)) => Some(run_dir.own_checkpoint(dir)?),
        Some(Resume::Latest) => run.latest_checkpoint()?,
        None => None,
    };
    if let Some(dir) = &checkpoint {
        run.resume(dir)?;
    }
    let done = run.steps_done();
    let signals = StopSignals::install()?;
    run.add_callback(StopOn(signals.flag()));
    if let Some(rank) = rank {
        run.add_callback(rank.progress());
        if !leader {
            run.run()?;
            return Ok(false);
        }
    }
    if done >= train.steps {
        eprintln!(
            "nothing to train: the run in {} has made {done} of its {} steps",
            out_dir.display(),
            train.steps
        );
        return Ok(false);
    }
    if let Some(Resume::From(_)) = &request.resume {
        for removed in Checkpoints::new(run_dir.checkpoints()).remove_after(done)? {
            eprintln!("removed {}, a later checkpoint", removed.display());
        }
    }
    run_file.write(&out_dir)?;
    run.add_callback(JsonlLog::continue_at(out_dir.join("metrics.jsonl"), done)?);
    if let Some(dir) = &checkpoint {
        eprintln!("resumed from {} at step {done}", dir.display());
    }
    if request.progress {
        run.add_callback(ProgressBar::new(train.steps, done, train.log_every));
    }
    run.run()?;
    println!(
        "trained {} with GRPO to step {}",
        S::Model::NAME,
        run.steps_done()
    );
    if let Some(signal) = signals.received() {
        return Err(Interrupted {
            signal,
            step: run.steps_done(),
            checkpoint: run.latest_checkpoint()?,
            run: out_dir,
        }
        .into());
    }
    print_checkpoint(&run.latest_checkpoint()?);
    Ok(true)
}

fn print_checkpoint(checkpoint: &Option<PathBuf>) {
    if let Some(dir) = checkpoint.as_deref().map(Path::display) {
        println!("checkpoint: {dir}");
    }
}
