//! `lmx train` and `lmx generate` for one model, generic over its declared training step.

use super::interrupt::{Interrupted, StopSignals};
use super::objective::ObjectiveSettings;
use super::run_dir::RunDir;
use super::run_file::{DifficultySettings, RunFile};
use super::sft::SftSettings;
use super::tokenizer::{TokenizerArg, TokenizerSpec};
use lmx::runtime::checkpoint::Checkpoints;
use lmx::runtime::data::{
    DocumentEncoder, InputFormat, Separator, TokenFile, TokenSource, Windows,
};
use lmx::runtime::generate::text::TextStream;
use lmx::runtime::generate::{
    check_prompt, generate_cached, speculative_generate, Models, PromptCache, Sampling,
};
use lmx::runtime::hf::{self, Family, HfFolder};
use lmx::runtime::model::{LanguageModel, TrainingStep};
use lmx::runtime::objectives::curriculum::DifficultyCurriculum;
use lmx::runtime::objectives::{self, Backbone, DifficultyRows, Mtp, MtpStep};
use lmx::runtime::train::{
    EarlyStopping, JsonlLog, Objective, ProgressBar, TrainConfig, TrainData, Trainer,
};
use lmx::runtime::tree::Tree;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What `lmx train` was asked to do, once flags, the TOML file and (on `--resume`) the run's
/// record are merged.
pub struct TrainRequest {
    /// The bundled model's name.
    pub model: String,
    /// Its preset.
    pub preset: String,
    /// Whether `preset` was asked for (`--preset`, the TOML file); otherwise it is the default
    /// name, which a model without a preset of that name reads as its configuration's defaults.
    pub preset_given: bool,
    /// The configuration to start from instead of the preset's: a resumed run's recorded one.
    pub model_config: Option<serde_json::Value>,
    /// A Hugging Face model folder whose settings and weights the run starts from.
    pub init: Option<PathBuf>,
    /// Settings changed on top of the preset (or the recorded configuration).
    pub settings: Vec<super::settings::Setting>,
    /// Text (`.txt`), JSONL (`.jsonl`) or token (`.tokens`) files, or one folder of supervised
    /// examples (`train.jsonl`, `valid.jsonl`).
    pub data: Vec<PathBuf>,
    /// How supervised examples are read: set when `data` is a folder.
    pub sft: Option<SftSettings>,
    /// The tokenizer.
    pub tokenizer: TokenizerArg,
    /// The training settings.
    pub train: TrainConfig,
    /// Continue the run in the run directory, and from which checkpoint.
    pub resume: Option<Resume>,
    /// The run directory's `run.json`, when resuming a run that has one.
    pub recorded: Option<RunFile>,
    /// Accept settings that differ from `recorded`'s, with a warning.
    pub allow_changes: bool,
    /// Replace the run in a run directory that is not empty.
    pub overwrite: bool,
    /// Show a progress bar.
    pub progress: bool,
    /// Train adapters on the frozen model instead of the model (`lmx lora`).
    pub lora: Option<super::lora::LoraRun>,
    /// Train an objective over frozen models instead of the model's own step.
    pub objective: Option<ObjectiveSettings>,
    /// The registered model of the distillation's teacher (`--teacher`), which reads its weights
    /// when the run is built; any model, not only the student's.
    pub teacher: Option<super::registry::Registered>,
    /// Mix easy data into the batches, from all easy to all hard (the data).
    pub curriculum: Option<DifficultySettings>,
}

/// Which checkpoint a resumed run continues from.
pub enum Resume {
    /// The latest one (none: the run starts afresh).
    Latest,
    /// This one; the later ones are removed.
    From(PathBuf),
}

/// Trains the model of step `S`; `false` when the run had nothing left to train.
///
/// Everything is checked before anything in the run directory changes: the model, tokenizer and
/// data, the lock, what the directory holds, the resumed checkpoint, the settings a resumed run
/// would change, and that checkpoints can be written. Only then are `run.json` written and
/// `metrics.jsonl` cut back to the step the run continues from.
pub fn train<S: TrainingStep>(request: TrainRequest) -> anyhow::Result<bool>
where
    <<S::Model as LanguageModel>::Params as Tree<lmx::runtime::Array>>::Of<
        Option<<S::Optimizer as lmx::runtime::optim::Optimizer>::Leaf>,
    >: Clone + 'static,
{
    train_with::<S>(request, None)
}

/// `lmx train --step mtp`: step `S`'s model with multi-token heads ([`MtpStep`]), its loss
/// and the heads' losses reported by [`objectives::mtp`]; otherwise a run as [`train`]'s.
pub fn train_mtp<S: TrainingStep>(request: TrainRequest) -> anyhow::Result<bool>
where
    S::Model: Backbone,
    <<Mtp<S::Model> as LanguageModel>::Params as Tree<lmx::runtime::Array>>::Of<
        Option<<S::Optimizer as lmx::runtime::optim::Optimizer>::Leaf>,
    >: Clone + 'static,
{
    if request.init.is_some() {
        anyhow::bail!(
            "--step mtp starts from the model's initialisation: multi-token heads over a Hugging \
             Face folder's weights (--init) are not supported yet"
        );
    }
    train_with::<MtpStep<S>>(request, Some(objectives::mtp::<S::Model>))
}

/// The preset every model has: its `config` block's defaults.
const DEFAULTS: &str = "default";

/// The preset a run trains: `requested`, or, where it was not given (the default name, the
/// bundled GPT-2's `bpe`) and the model declares no presets (a user's file may not), its
/// config's defaults. A model that declares presets but not the default name is asked which
/// (its defaults may be a large model).
fn preset_name<'a>(requested: &'a str, given: bool, presets: &[&str]) -> &'a str {
    if !given && presets.is_empty() {
        DEFAULTS
    } else {
        requested
    }
}

const NOT_TEXT_CURRICULUM: &str = "--curriculum-easy mixes text or token files into the \
     batches of --data's text: not with supervised examples, --step dpo or --step grpo";

/// The model configuration's objective of a step that reports metrics beside its loss
/// ([`objectives::mtp`] for `--step mtp`).
type OwnObjective<M> = fn(&<M as LanguageModel>::Config) -> Objective<M>;

fn train_with<S: TrainingStep>(
    mut request: TrainRequest,
    own: Option<OwnObjective<S::Model>>,
) -> anyhow::Result<bool>
where
    <<S::Model as LanguageModel>::Params as Tree<lmx::runtime::Array>>::Of<
        Option<<S::Optimizer as lmx::runtime::optim::Optimizer>::Leaf>,
    >: Clone + 'static,
{
    request.train.validate()?;
    // A rank of a data-parallel run joins the others first; only rank 0 writes the run folder.
    let rank = super::parallel::Rank::from_environment()?;
    let leader = rank.as_ref().is_none_or(|rank| rank.leads());
    let rank_name = rank.as_ref().map(|rank| rank.name());
    let init = request.init.as_deref().map(HfFolder::open).transpose()?;
    let model_config = match (&request.model_config, &init) {
        (Some(recorded), _) => serde_json::from_value(recorded.clone())
            .map_err(|err| anyhow::anyhow!("the recorded model configuration: {err}"))?,
        (None, Some(folder)) => hf::model_config::<S::Model>(folder)?,
        (None, None) => {
            request.preset =
                preset_name(&request.preset, request.preset_given, S::Model::presets()).to_owned();
            S::Model::preset(&request.preset).ok_or_else(|| {
                let presets = S::Model::presets().iter().chain([&DEFAULTS]);
                anyhow::anyhow!(
                    "{} has no preset `{}`; its presets are {}",
                    S::Model::NAME,
                    request.preset,
                    presets.copied().collect::<Vec<_>>().join(", ")
                )
            })?
        }
    };
    let model_config = super::settings::apply(&model_config, &request.settings, S::Model::NAME)?;
    S::Model::validate(&model_config)?;
    let vocab = S::Model::vocab_size(&model_config);
    let out_dir = request.train.out_dir.clone();
    let tokenizer_spec = request.tokenizer.resolve(vocab, &request.data);
    if request.sft.is_some() && tokenizer_spec == TokenizerSpec::Bpe {
        anyhow::bail!(
            "supervised examples are read with the model's own tokenizer: give --tokenizer \
             tokenizer.json (or byte for a model of 257 ids)"
        );
    }
    let prepared =
        tokenizer_spec.for_training(&out_dir, &request.data, vocab, request.resume.is_some())?;
    let tokenizer = &prepared.tokenizer;
    if tokenizer.vocab_size() > vocab {
        anyhow::bail!(
            "the tokenizer has {} ids but {} (preset {}) has a vocabulary of {vocab}",
            tokenizer.vocab_size(),
            S::Model::NAME,
            request.preset
        );
    }
    if let Some(ObjectiveSettings::Distill { teacher, .. }) = &request.objective {
        super::objective::check_teacher_tokenizer(teacher, tokenizer.as_ref())?;
    }
    let context = S::Model::context_len(&model_config);
    if request.train.seq_len > context {
        anyhow::bail!(
            "seq_len {} is longer than the context of {} (preset {}), {context} tokens: give \
             --seq-len {context} or less",
            request.train.seq_len,
            S::Model::NAME,
            request.preset
        );
    }
    if request.objective.is_some() && request.lora.is_some() {
        anyhow::bail!("adapters train with the model's own step: leave --step and --teacher out");
    }
    let pairs = request.objective.as_ref().is_some_and(|o| o.reads_pairs());
    let prompts = matches!(request.objective, Some(ObjectiveSettings::Grpo { .. }));
    if request.curriculum.is_some() && (pairs || prompts || request.sft.is_some()) {
        anyhow::bail!(NOT_TEXT_CURRICULUM);
    }
    if pairs && request.sft.is_some() {
        anyhow::bail!("--step dpo reads one JSONL file of preference pairs, not a folder");
    }
    let (data, data_tokens) = match (&request.sft, &request.objective) {
        (None, Some(ObjectiveSettings::Grpo { .. })) => {
            let (prompts, tokens) = super::grpo::prompts(&request.data, tokenizer.as_ref())?;
            (Data::Prompts(prompts), tokens)
        }
        (Some(_), Some(ObjectiveSettings::Grpo { .. })) => {
            anyhow::bail!("--step grpo reads one JSONL file of prompts, not a folder")
        }
        (_, Some(objective)) if objective.reads_pairs() => {
            let chat_template = objective.chat_template();
            let tokenizer_file = match &tokenizer_spec {
                TokenizerSpec::HuggingFace { path, .. } => Some(path.as_path()),
                _ => None,
            };
            let (data, tokens) = super::objective::preference_data(
                &request.data,
                request.train.seq_len,
                request.train.validation_fraction,
                tokenizer.as_ref(),
                chat_template,
                tokenizer_file,
            )?;
            (Data::Rows(data), tokens)
        }
        (Some(settings), _) => supervised(&request, settings, &tokenizer_spec, tokenizer.as_ref())?,
        (None, _) => {
            let source = tokens(&request.data, tokenizer.as_ref(), vocab)?;
            let data_tokens = source.len() as u64;
            (
                Data::Windows(Windows::new(source, request.train.seq_len)?),
                data_tokens,
            )
        }
    };
    let (data, curriculum) = match (&request.curriculum, data) {
        (None, data) => (data, None),
        (Some(settings), Data::Windows(hard)) => {
            let easy = tokens(&settings.easy, tokenizer.as_ref(), vocab)?;
            let recorded = DifficultySettings {
                easy_tokens: Some(easy.len() as u64),
                ..settings.clone()
            };
            let easy = Windows::new(easy, request.train.seq_len)?;
            let hard = TrainData::split(hard, request.train.validation_fraction, vocab)?;
            let schedule =
                DifficultyCurriculum::new(request.train.steps as usize, settings.warmup_fraction)?;
            let rows = DifficultyRows::new(
                Arc::new(easy),
                hard.train,
                schedule,
                request.train.batch_size,
                request.train.seed,
            )?;
            let data = TrainData {
                train: Arc::new(rows),
                validation: hard.validation,
            };
            (Data::Rows(data), Some(recorded))
        }
        (Some(_), _) => anyhow::bail!(NOT_TEXT_CURRICULUM),
    };
    let mut run_file = RunFile {
        model: request.model.clone(),
        preset: request.preset.clone(),
        model_config: serde_json::to_value(&model_config)?,
        tokenizer: tokenizer_spec,
        data: request.data.clone(),
        data_tokens: Some(data_tokens),
        sft: request.sft.clone(),
        train: request.train.clone(),
        lora: request.lora.clone(),
        init: request.init.clone(),
        init_weights: init
            .as_ref()
            .map(|folder| folder.weights().fingerprint())
            .transpose()?,
        objective: request.objective.clone(),
        curriculum,
        quantization: None,
    };

    let run_dir = match leader {
        true => RunDir::lock(&out_dir)?,
        false => RunDir::of_rank_0(&out_dir),
    };
    if leader && request.resume.is_none() && !request.overwrite {
        run_dir.refuse_unless_empty()?;
    }
    let changed_schedule = match &request.recorded {
        Some(recorded) => accept_changes(recorded, &run_file, &request)?,
        None => None,
    };
    let patience = request.train.early_stopping_patience;
    let total_steps = request.train.steps;
    let log_every = request.train.log_every;
    // A run from a folder's weights starts from them unless it continues from a checkpoint.
    let from_folder = match (&init, &request.resume) {
        (Some(folder), None) => Some(folder),
        (Some(folder), Some(Resume::Latest)) => Checkpoints::new(run_dir.checkpoints())
            .latest()?
            .is_none()
            .then_some(folder),
        _ => None,
    };
    let data = match data {
        Data::Windows(windows) => TrainData::split(
            windows,
            request.train.validation_fraction,
            S::Model::vocab_size(&model_config),
        )?,
        Data::Rows(data) => data,
        Data::Prompts(prompts) => {
            // The reference is the run's start, also when it resumes.
            let start = match &init {
                Some(folder) => hf::load_model::<S::Model>(folder, None)?.1,
                None => S::Model::init(&model_config, request.train.seed)?,
            };
            return super::grpo::train::<S>(super::grpo::Prepared {
                request: &request,
                model_config,
                start,
                prompts,
                run_dir,
                run_file,
                tokenizer: prepared,
                rank,
            })
            .map_err(|err| in_rank(err, &rank_name));
        }
    };
    // A LoRA run over a folder reads its frozen base from there even when it resumes: its
    // checkpoints hold the adapters alone. (A resumed run whose folder's weights changed was
    // refused above, its recorded `init_weights` against the folder's now.)
    let lora_over_folder = request.lora.is_some() && init.is_some();
    let base_folder = match lora_over_folder {
        true => init.as_ref(),
        false => from_folder,
    };
    let mut params = match base_folder {
        Some(folder) => hf::load_model::<S::Model>(folder, None)?.1,
        None => super::lora::base_params::<S::Model>(
            request.lora.as_ref(),
            &model_config,
            request.train.seed,
        )?,
    };
    // What of the model is packed (a quantized base or folder), for its checkpoints' readers;
    // a resumed run whose parameters are read from its checkpoint later keeps its record.
    run_file.quantization = lmx::runtime::quant::layout::record(&params).or_else(|| {
        let recorded = request.recorded.as_ref();
        recorded.and_then(|run| run.quantization.clone())
    });
    if let Some(lora) = &request.lora {
        lmx::runtime::lora::attach(
            &mut params,
            &lora.parameters,
            lora.num_layers,
            request.train.seed,
            lora.fine_tune_type,
        )?;
    }
    // A row of preference pairs holds two responses of seq_len tokens each.
    let mut config = request.train.clone();
    if pairs {
        config.seq_len *= 2;
    }
    // A step the model declares trains as its default one does: `S` is that step.
    let built_in = request.objective.as_ref().filter(|o| !o.declared_step());
    let objective = match built_in {
        None if S::FROZEN.is_empty() => None,
        None => {
            // The step's own frozen models (`frozen reference = policy`), through the
            // objective the command line's `--step dpo` also trains.
            let start = run_start::<S>(&init, from_folder, &params)?;
            Some(Objective::declared::<S>(&start).expect("the step declares some"))
        }
        Some(ObjectiveSettings::Mtp {}) => {
            let own = own.ok_or_else(|| {
                anyhow::anyhow!("--step mtp trains through the model's multi-token registration")
            })?;
            let objective = own(&model_config);
            let heads: usize = lmx::runtime::tree::specs(&params)
                .iter()
                .zip(lmx::runtime::tree::flatten(&params))
                .filter(|(spec, _)| objectives::is_head_tensor(&spec.name))
                .map(|(_, leaf)| leaf.size())
                .sum();
            if leader {
                eprintln!(
                    "multi-token heads: {heads} parameters, trained with optimizer state beside \
                     the model's (metrics {})",
                    objective.metrics.join(", ")
                );
            }
            Some(objective)
        }
        Some(objective) => {
            let start = run_start::<S>(&init, from_folder, &params)?;
            let teacher = super::objective::run_teacher(objective, request.teacher)?;
            let (teacher, report) = teacher.unzip();
            let built = objective.build::<S::Model>(&model_config, &start, teacher)?;
            if let Some(report) = report.filter(|_| leader) {
                eprintln!("{report}");
            }
            Some(built)
        }
    };
    let mut trainer = match (&rank, objective) {
        (Some(rank), None) => Trainer::<S>::data_parallel(
            model_config,
            config,
            data,
            Some(params),
            rank.parallel.clone(),
        )?,
        (Some(rank), Some(objective)) => Trainer::<S>::data_parallel_with_objective(
            model_config,
            config,
            data,
            params,
            objective,
            rank.parallel.clone(),
        )?,
        (None, None) => Trainer::<S>::with_params(model_config, config, data, params)?,
        (None, Some(objective)) => {
            Trainer::<S>::with_objective(model_config, config, data, params, objective)?
        }
    };
    if lora_over_folder {
        trainer.omit_frozen_from_checkpoints();
    }
    if request.lora.is_some() {
        let state = trainer.state();
        let optimizer_bytes: usize = state
            .declaration()
            .iter()
            .zip(state.flatten())
            .filter(|(name, _)| name.starts_with("opt."))
            .map(|(_, array)| array.nbytes())
            .sum();
        eprintln!(
            "{}",
            super::lora::state_size(&trainer.state().params, optimizer_bytes)
        );
    }
    let checkpoint = match &request.resume {
        Some(Resume::From(dir)) => Some(run_dir.own_checkpoint(dir)?),
        Some(Resume::Latest) => trainer.latest_checkpoint()?,
        None => None,
    };
    match (&checkpoint, &init) {
        (Some(dir), _) => trainer.resume(dir)?,
        (None, Some(folder)) => {
            eprintln!("starting from the weights of {}", folder.dir().display())
        }
        (None, None) if request.resume.is_some() => {
            eprintln!(
                "no checkpoint in {} yet: starting afresh",
                out_dir.display()
            )
        }
        (None, None) => {}
    }
    let done = trainer.steps_done();
    if done >= total_steps {
        eprintln!(
            "nothing to train: the run in {} has made {done} of its {total_steps} steps \
             (checkpoint {}); to train on, give more --steps with --allow-changes",
            out_dir.display(),
            checkpoint.as_deref().unwrap_or(Path::new("-")).display(),
        );
        return Ok(false);
    }
    if let Some(old) = changed_schedule {
        eprintln!(
            "warning: from step {} on the learning rate follows the new schedule: {:.3e} \
             where the recorded one gives {:.3e}",
            done + 1,
            run_file.train.schedule.lr(done),
            old.lr(done)
        );
    }

    if let Some(rank) = rank {
        let leads = rank.leads();
        trainer.add_callback(rank.progress());
        if !leads {
            let signals = StopSignals::install()?;
            trainer.stop_when(signals.flag());
            trainer
                .run()
                .map_err(|err| in_rank(err.into(), &rank_name))?;
            return Ok(false);
        }
    }
    if request.overwrite {
        run_dir.clear()?;
    }
    run_dir.probe()?;
    if let Some(Resume::From(_)) = &request.resume {
        for removed in Checkpoints::new(run_dir.checkpoints()).remove_after(done)? {
            eprintln!("removed {}, a later checkpoint", removed.display());
        }
    }
    prepared.save(&out_dir)?;
    run_file.write(&out_dir)?;
    trainer.add_callback(JsonlLog::continue_at(out_dir.join("metrics.jsonl"), done)?);
    if let Some(dir) = &checkpoint {
        eprintln!("resumed from {} at step {done}", dir.display());
    }
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
    let signals = StopSignals::install()?;
    trainer.stop_when(signals.flag());
    let summary = trainer
        .run()
        .map_err(|err| in_rank(with_hint(err, &out_dir), &rank_name))?;
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
    if let Some(signal) = signals.received() {
        return Err(Interrupted {
            signal,
            step: summary.steps,
            checkpoint: summary.checkpoint,
            run: out_dir,
        }
        .into());
    }
    if let Some(reason) = summary.stopped {
        println!("stopped early: {reason}");
    }
    if let Some(dir) = summary.checkpoint {
        println!("checkpoint: {}", dir.display());
    }
    if let Some(lora) = &request.lora {
        lmx::runtime::lora::save_adapters(
            &lora.adapter_path,
            &trainer.state().params,
            &lora.adapter_config(),
            Family::of_model(<S::Model as LanguageModel>::NAME),
        )?;
        println!("adapters: {}", lora.adapter_path.display());
    }
    Ok(true)
}

/// Fails on the settings `new` changes of the `recorded` run, or with `--allow-changes` warns of
/// them; returns the recorded schedule where it changed.
/// The parameters the run started from, which a frozen copy of the policy holds (DPO's
/// reference), also when the run resumes from a checkpoint: `--init`'s weights, else the
/// seed's initialisation (`params` when the run does not start from a folder's weights).
fn run_start<S: TrainingStep>(
    init: &Option<HfFolder>,
    from_folder: Option<&HfFolder>,
    params: &<S::Model as LanguageModel>::Params,
) -> anyhow::Result<<S::Model as LanguageModel>::Params> {
    Ok(match (init, from_folder) {
        (Some(folder), None) => hf::load_model::<S::Model>(folder, None)?.1,
        _ => params.clone(),
    })
}

fn accept_changes(
    recorded: &RunFile,
    new: &RunFile,
    request: &TrainRequest,
) -> anyhow::Result<Option<lmx::runtime::schedule::Schedule>> {
    let changes = recorded.changes(new);
    if changes.is_empty() {
        return Ok(None);
    }
    let list: String = changes
        .iter()
        .map(|change| format!("\n  {change}"))
        .collect();
    let run = request.train.out_dir.display();
    if !request.allow_changes {
        anyhow::bail!(
            "resuming would change the run in {run}:{list}\nleave these settings out to \
             continue the run as recorded, or give --allow-changes"
        );
    }
    eprintln!("warning: continuing the run in {run} with changed settings:{list}");
    Ok((recorded.train.schedule != new.train.schedule).then(|| recorded.train.schedule.clone()))
}

/// `err` naming the rank that met it, in a data-parallel run.
fn in_rank(err: anyhow::Error, rank: &Option<String>) -> anyhow::Error {
    match rank {
        Some(rank) => err.context(rank.clone()),
        None => err,
    }
}

/// A diverged run's error, with the command that continues from the checkpoint it names.
fn with_hint(err: lmx::runtime::Error, run: &Path) -> anyhow::Error {
    match &err {
        lmx::runtime::Error::Diverged {
            resume_from: Some((dir, _)),
            ..
        } => anyhow::anyhow!(
            "{err}; to continue from it at a lower learning rate: lmx train --out {} \
             --resume-from {} --lr LR --allow-changes",
            run.display(),
            dir.display()
        ),
        _ => err.into(),
    }
}

/// What a run trains on.
enum Data {
    /// Windows of a token stream, split for validation by the run's validation fraction.
    Windows(Windows),
    /// Supervised examples: `train.jsonl`'s rows, validated on `valid.jsonl`'s.
    Rows(TrainData),
    /// GRPO's prompts, whose completions each update samples.
    Prompts(Vec<lmx::runtime::objectives::Prompt>),
}

/// The rows of the folder of supervised examples `request.data` names, and how many tokens its
/// training examples hold.
fn supervised(
    request: &TrainRequest,
    settings: &SftSettings,
    tokenizer_spec: &TokenizerSpec,
    tokenizer: &dyn lmx::runtime::data::Tokenizer,
) -> anyhow::Result<(Data, u64)> {
    let [dir] = &request.data[..] else {
        anyhow::bail!("give one folder of supervised examples (train.jsonl, valid.jsonl)");
    };
    let tokenizer_file = match tokenizer_spec {
        TokenizerSpec::HuggingFace { path, .. } => Some(path.as_path()),
        _ => None,
    };
    let template = super::sft::template(settings, tokenizer_file)?;
    let train_file = dir.join("train.jsonl");
    if !train_file.is_file() {
        anyhow::bail!("{}: no train.jsonl in the folder", dir.display());
    }
    let seq_len = request.train.seq_len;
    let train = super::sft::load(&train_file, settings, tokenizer, template.as_ref())?;
    let data_tokens = train.examples.iter().map(|e| e.ids.len() as u64).sum();
    let rows = super::sft::rows(&train, seq_len, settings.batching)?;
    let valid_file = dir.join("valid.jsonl");
    let validation = if valid_file.is_file() {
        let valid = super::sft::load(&valid_file, settings, tokenizer, template.as_ref())?;
        let rows = super::sft::rows(&valid, seq_len, settings.batching)?;
        Some(Arc::new(rows) as Arc<dyn lmx::runtime::data::Rows>)
    } else {
        eprintln!(
            "warning: {}: no valid.jsonl: training without validation",
            dir.display()
        );
        None
    };
    let data = TrainData {
        train: Arc::new(rows),
        validation,
    };
    Ok((Data::Rows(data), data_tokens))
}

/// The token stream of `paths`: token files are mapped, text and JSONL files encoded; every id
/// must be below the model's `vocab` size.
fn tokens(
    paths: &[PathBuf],
    tokenizer: &dyn lmx::runtime::data::Tokenizer,
    vocab: usize,
) -> anyhow::Result<Arc<dyn TokenSource>> {
    if paths.is_empty() {
        anyhow::bail!("no training data: give --data FILE (text, .jsonl or .tokens)");
    }
    if paths
        .iter()
        .all(|path| path.extension().is_some_and(|ext| ext == "tokens"))
    {
        let [path] = paths else {
            anyhow::bail!("give one .tokens file at a time");
        };
        let file = TokenFile::open(path)?;
        file.check_vocab(0..file.len(), vocab)?;
        return Ok(Arc::new(file));
    }
    let encoder = DocumentEncoder::new(tokenizer, Separator::Eos)?;
    let format = InputFormat::from_path(&paths[0]);
    let tokens = encoder.encode_files(paths, &format)?;
    tokens.check_vocab(0..tokens.len(), vocab)?;
    Ok(Arc::new(tokens))
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
    /// Strings that end the text (left out of it).
    pub stop: Vec<String>,
    /// An adapter folder to load on top of the model.
    pub adapter: Option<PathBuf>,
    /// A draft run for speculative decoding.
    pub draft: Option<Draft>,
    /// A bound on the key-value cache (`--max-kv-size`).
    pub max_kv: Option<MaxKv>,
}

/// A key-value cache of at most `size` positions a layer: the first `keep` and the latest
/// (`lmx generate --max-kv-size N --keep K`, mlx-lm's rotating cache).
#[derive(Clone, Copy)]
pub struct MaxKv {
    /// Positions a layer holds at most.
    pub size: usize,
    /// The first positions, kept for good.
    pub keep: usize,
}

impl MaxKv {
    /// The empty cache of `max_kv`'s bound (unbounded without one); a bound that keeps all its
    /// positions for good is an error naming the flags.
    fn cache(max_kv: Option<MaxKv>) -> anyhow::Result<PromptCache> {
        let Some(MaxKv { size, keep }) = max_kv else {
            return Ok(PromptCache::new());
        };
        PromptCache::bounded(size, keep).map_err(|_| {
            anyhow::anyhow!(
                "--max-kv-size {size} with --keep {keep}: the cache must hold more positions \
                 than it keeps for good"
            )
        })
    }
}

/// The draft model of speculative decoding (`lmx generate --draft`).
pub struct Draft {
    /// A Hugging Face folder or a run directory of the target's model.
    pub path: PathBuf,
    /// Tokens proposed at a time (at least 1).
    pub tokens: usize,
}

/// Samples from the latest checkpoint of a run of step `S`'s model.
pub fn sample<S: TrainingStep>(run: &RunFile, request: GenerateRequest) -> anyhow::Result<()> {
    let config: <S::Model as LanguageModel>::Config =
        serde_json::from_value(run.model_config.clone())?;
    let checkpoint = super::run_file::checkpoint_of(&request.run, request.checkpoint)?;
    S::Model::validate(&config)?;
    request.sampling.validate()?;
    let tokenizer: Arc<dyn lmx::runtime::data::Tokenizer> =
        Arc::from(run.tokenizer.load(&request.run)?);
    let prompt = tokenizer.encode(&request.prompt)?;
    // Everything that can be wrong with the request fails before the prompt is shown.
    check_prompt::<S::Model>(&config, &prompt)?;
    let params = super::run_file::load_params::<S::Model>(
        run,
        &config,
        &checkpoint,
        request.adapter.as_deref(),
    )?;
    let draft = match &request.draft {
        Some(draft) => Some(draft_run::<S::Model>(run, draft)?),
        None => None,
    };
    stream::<S::Model>(
        &params,
        &config,
        tokenizer,
        &request.prompt,
        &prompt,
        &request.sampling,
        &request.stop,
        draft.as_ref().map(|(p, c, k)| (p, c, *k)),
        request.max_kv,
    )
}

/// The parameters and configuration of `draft`'s run (its latest checkpoint), which must train
/// the same model as `run`, and its token count.
fn draft_run<M: LanguageModel>(
    run: &RunFile,
    draft: &Draft,
) -> anyhow::Result<(M::Params, M::Config, usize)> {
    let shown = draft.path.display();
    let draft_file =
        RunFile::read(&draft.path).map_err(|err| anyhow::anyhow!("--draft {shown}: {err}"))?;
    anyhow::ensure!(
        draft_file.model == run.model,
        "--draft {shown}: its model is `{}`, the run's `{}`: the draft must be a run of the same \
         model",
        draft_file.model,
        run.model
    );
    let config: M::Config = serde_json::from_value(draft_file.model_config.clone())?;
    M::validate(&config)?;
    let checkpoint = super::run_file::checkpoint_of(&draft.path, None)?;
    let params = super::run_file::load_params::<M>(&draft_file, &config, &checkpoint, None)?;
    Ok((params, config, draft.tokens))
}

/// Prints `text` (encoded as `prompt`) and its continuation by `params`, token by token, up to
/// the tokenizer's end-of-sequence token or the first of `stop` (left out), then the speeds.
/// With `draft` (parameters, configuration, tokens per proposal), decoding is speculative and
/// the draft's acceptance rate is reported too.
#[allow(clippy::too_many_arguments)]
pub fn stream<M: LanguageModel>(
    params: &M::Params,
    config: &M::Config,
    tokenizer: Arc<dyn lmx::runtime::data::Tokenizer>,
    text: &str,
    prompt: &[u32],
    sampling: &Sampling,
    stop: &[String],
    draft: Option<(&M::Params, &M::Config, usize)>,
    max_kv: Option<MaxKv>,
) -> anyhow::Result<()> {
    let mut cache = MaxKv::cache(max_kv)?;
    print!("{text}");
    let eos = tokenizer.eos_id();
    let mut text = TextStream::new(tokenizer, stop.to_vec());
    let mut show = |token| {
        if let Some(piece) = text.push(token) {
            print!("{piece}");
            let _ = std::io::stdout().flush();
        }
        !text.stopped()
    };
    let (generation, acceptance) = match draft {
        Some((draft_params, draft_config, draft_tokens)) => {
            // The speculative loop cannot be stopped early: tokens after a stop string are
            // generated but no longer shown.
            let speculation = speculative_generate::<M, M>(
                Models {
                    target: (params, config),
                    draft: (draft_params, draft_config),
                },
                prompt,
                sampling,
                draft_tokens,
                eos,
                |token| {
                    show(token);
                },
            )?;
            let acceptance = format!(
                "; draft acceptance {:.1}% ({} of {} drafted tokens kept)",
                100.0 * speculation.accepted as f64 / speculation.drafted.max(1) as f64,
                speculation.accepted,
                speculation.drafted
            );
            (speculation.generation, acceptance)
        }
        None => {
            let generation =
                generate_cached::<M>(params, config, &mut cache, prompt, sampling, eos, show)?;
            (generation, String::new())
        }
    };
    println!("{}", text.finish());
    eprintln!(
        "{} tokens; prompt {:.0} tok/s, decode {:.1} tok/s{acceptance}",
        generation.tokens.len(),
        generation.prompt_tokens_per_s,
        generation.decode_tokens_per_s
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::preset_name;

    #[test]
    fn a_model_without_presets_trains_its_defaults_unless_a_preset_is_named() {
        // A user's file with a config block only, no --preset: its defaults.
        assert_eq!(preset_name("bpe", false, &[]), "default");
        // Named, the preset is looked up as asked (and refused when unknown).
        assert_eq!(preset_name("bpe", true, &[]), "bpe");
        assert_eq!(preset_name("tiny", true, &["tiny"]), "tiny");
        // A model with presets, none named: the default name, which GPT-2 has and others refuse
        // with their list, rather than silently training a large default.
        assert_eq!(preset_name("bpe", false, &["bpe", "124m"]), "bpe");
        assert_eq!(preset_name("bpe", false, &["tiny", "7b"]), "bpe");
    }
}
