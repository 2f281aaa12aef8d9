//! The `lmx` command line.

pub mod bench;
pub mod check;
pub mod decay;
pub mod derived_run;
pub mod eval;
pub mod export;
pub mod folder_info;
pub mod grpo;
pub mod hf_model;
pub mod interrupt;
pub mod launch;
pub mod lora;
pub mod model_file;
pub mod new;
pub mod objective;
pub mod parallel;
pub mod plot;
pub mod process;
pub mod quantize;
pub mod registry;
pub mod resolve;
pub mod run_dir;
pub mod run_file;
pub mod serve;
pub mod settings;
pub mod sft;
pub mod steps;
pub mod tokenizer;
pub mod train;

pub use interrupt::Interrupted;
pub use registry::Registry;

use clap::{Args, Parser, Subcommand};
use lmx::runtime::device::{self, DeviceKind};
use lmx::runtime::generate::Sampling;
use lmx::runtime::objectives::curriculum::LengthCurriculum;
use lmx::runtime::schedule::Schedule;
use lmx::runtime::train::{Overlap, Precision, StatePacking, TrainConfig};
use std::path::PathBuf;

/// Train, check and sample transformer language models declared in `.lmx` files, over MLX.
#[derive(Parser)]
#[command(name = "lmx", version, about)]
pub struct Cli {
    /// Where arrays are computed.
    #[arg(long, global = true, default_value = "cpu")]
    pub device: DeviceKind,
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand)]
pub enum Command {
    /// Train a model on text, JSONL or token files: a registered one by name, or a `.lmx` file.
    Train(TrainArgs),
    /// Train low-rank adapters on a frozen model (as `mlx_lm.lora`): `lmx train`'s options and
    /// the adapters'.
    Lora(lora::LoraArgs),
    /// Run `lmx` as several processes that train together (data parallel) over MLX's distributed
    /// backends, as `mlx.launch` does: `lmx launch -n 2 -- train ...` on this host, or one
    /// process per host of a host file.
    Launch(launch::LaunchArgs),
    /// Fuse a run's adapters into its model's weights (as `mlx_lm.fuse`), as a new run directory.
    Fuse(lora::FuseArgs),
    /// Sample text from a run's latest checkpoint, or from a Hugging Face model folder.
    Generate(GenerateArgs),
    /// Loss and perplexity of a run's checkpoint on supervised examples: the `test.jsonl` of
    /// the folder it was trained on, or a JSONL file.
    Eval(EvalArgs),
    /// Write a run's checkpoint, or a loaded Hugging Face model folder, as a Hugging Face model
    /// folder.
    Export(export::ExportArgs),
    /// Check a `.lmx` file: diagnostics, or parameter shapes, FLOPs and memory for a preset.
    Check {
        /// The `.lmx` file (or a registered model's name).
        file: String,
        /// The preset to report on.
        #[arg(long)]
        preset: Option<String>,
        /// Batch size for the memory estimate.
        #[arg(long, default_value_t = 1)]
        batch: u64,
        /// Sequence length (default: the model's context).
        #[arg(long)]
        seq: Option<u64>,
    },
    /// Describe a model: presets, parameters, FLOPs, memory; or what a Hugging Face model
    /// folder holds.
    Info {
        /// A registered model's name, a `.lmx` file or a Hugging Face model folder.
        model: String,
        /// The preset.
        #[arg(long)]
        preset: Option<String>,
    },
    /// Count a model's parameters, for one preset or all.
    Count {
        /// A registered model's name or a `.lmx` file.
        model: String,
        /// The preset.
        #[arg(long)]
        preset: Option<String>,
    },
    /// List the registered models' sources and their presets.
    Models,
    /// Write a crate of one's own: its binary is this command line over its own models.
    New {
        /// The crate's folder (new or empty); its name is the package's and the model's.
        path: PathBuf,
        /// The lmx checkout the crate depends on by path (default: the one this binary was
        /// built from).
        #[arg(long)]
        lmx_path: Option<PathBuf>,
    },
    /// Draw a run's loss and learning-rate curves to SVG.
    Plot {
        /// The run directory.
        run: PathBuf,
        /// The SVG file (default: RUN/curves.svg).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Serve a model over HTTP with the OpenAI API (completions, chat completions, models).
    Serve(serve::ServeArgs),
    /// Quantize a model (a model folder, a run or a checkpoint) into mlx-lm's quantized layout.
    Quantize(quantize::QuantizeArgs),
    /// Show the MLX library, BLAS and backends in use.
    Platform,
    /// Measure lmx beside the Python MLX anchors: training steps, generation.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

/// `lmx train`'s options; a TOML file (`--config`) gives the defaults that flags override.
#[derive(Args)]
pub struct TrainArgs {
    /// The model: a registered one's name (default: the first registered, `gpt2` for the stock
    /// binary), a `.lmx` file, which is built into a program of its own the first time, or a
    /// Hugging Face model folder, whose weights the run starts from (as --init).
    #[arg(long)]
    pub model: Option<String>,
    /// Its preset (`default`: the model's `config` defaults, which a model that declares no
    /// presets trains when none is given).
    #[arg(long, default_value = "bpe")]
    pub preset: String,
    /// Start from a Hugging Face model folder's weights and settings (its `config.json`
    /// chooses the model; its `tokenizer.json` is the tokenizer unless --tokenizer says).
    #[arg(long, value_name = "DIR", conflicts_with_all = ["model", "preset"])]
    pub init: Option<PathBuf>,
    /// Changes a setting of the model's configuration on top of the preset (repeatable), e.g.
    /// `--set pdrop=0.1`.
    #[arg(long = "set", value_name = "NAME=VALUE")]
    pub settings: Vec<settings::Setting>,
    /// Training data: text, `.jsonl` (field "text") or `.tokens` files; or one folder of
    /// supervised examples as mlx-lm reads them: `train.jsonl` and `valid.jsonl` (and
    /// `test.jsonl`, for `lmx eval`), each in the text, completions (prompt, completion) or chat
    /// (messages) format.
    #[arg(long, num_args = 1.., default_value = "data/shakespeare.txt")]
    pub data: Vec<PathBuf>,
    /// With a folder of supervised examples: the loss counts the completion (a chat's last
    /// message) only, not the prompt.
    #[arg(long)]
    pub mask_prompt: bool,
    /// With a folder of supervised examples: one example a row, padded (`pad`), or examples
    /// packed into rows of --seq-len tokens (`pack`).
    #[arg(long, value_enum)]
    pub batching: Option<BatchingArg>,
    /// With a folder of supervised examples: the chat template (a Jinja file), instead of the
    /// `chat_template` of the `tokenizer_config.json` beside --tokenizer.
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,
    /// `auto` (a BPE tokenizer of the model's vocabulary trained on the data and kept in the run
    /// directory; bytes for a 257-id vocabulary or `.tokens` data), `byte`, `bpe`, or the path of
    /// a Hugging Face `tokenizer.json`.
    #[arg(long, default_value = "auto")]
    pub tokenizer: String,
    /// The tokenizer's end-of-sequence token (Hugging Face tokenizers).
    #[arg(long)]
    pub eos: Option<String>,
    /// A TOML file of training settings (the fields of `TrainConfig`).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The run directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Updates to make; a linear or cosine schedule's length follows.
    #[arg(long)]
    pub steps: Option<u64>,
    /// Sequences per update.
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Tokens per sequence.
    #[arg(long)]
    pub seq_len: Option<usize>,
    /// Micro-batches per update, in place of the step's `accumulate` declaration: the batch is
    /// split into N equal parts whose gradients are averaged before one update (the activations
    /// of one part in memory, the update of the whole batch).
    #[arg(long, value_name = "N")]
    pub accumulate: Option<usize>,
    /// A length curriculum: train the first steps on the first L1 tokens of each sequence, the
    /// next on L2, ..., the last stage until the end (each at most --seq-len, non-decreasing;
    /// one compiled trace per length).
    #[arg(long, value_name = "L1,L2,...", value_delimiter = ',')]
    pub length_stages: Option<Vec<usize>>,
    /// With --length-stages: steps per stage (by default the run's steps over the stages).
    #[arg(long)]
    pub stage_steps: Option<usize>,
    /// Peak learning rate of the configured schedule (by default a cosine decay to a tenth
    /// after the warm-up), which keeps its kind and warm-up; its final rate scales with it.
    #[arg(long)]
    pub lr: Option<f32>,
    /// Warm-up steps of the configured schedule.
    #[arg(long)]
    pub warmup: Option<u64>,
    /// Seed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Run the step uncompiled (same numbers, slower; for debugging).
    #[arg(long)]
    pub eager: bool,
    /// Parameter precision.
    #[arg(long, value_enum)]
    pub precision: Option<PrecisionArg>,
    /// How far the host runs ahead of the device; without it, the settings file's `overlap`, or
    /// `submit`.
    #[arg(long, value_enum)]
    pub overlap: Option<OverlapArg>,
    /// How the step's state is laid out; without it, the settings file's `state_packing`, or
    /// `auto` (flat on a CUDA GPU).
    #[arg(long, value_enum)]
    pub state_packing: Option<StatePackingArg>,
    /// Which parameters weight decay applies to; without it, the settings file's `decay`, or
    /// `weights`: lmx decays weight matrices only, not biases, norms or embeddings (as nanoGPT and
    /// Hugging Face's trainer do). `all` decays every parameter, as MLX's AdamW does (and
    /// PyTorch's, handed all of a model's parameters).
    #[arg(long, value_enum)]
    pub decay: Option<decay::DecayArg>,
    /// Evaluate the validation loss every N steps.
    #[arg(long)]
    pub eval_every: Option<u64>,
    /// Save a checkpoint every N steps (and at the end).
    #[arg(long)]
    pub checkpoint_every: Option<u64>,
    /// Print a progress line every N steps when standard error is not a terminal (0: none).
    #[arg(long)]
    pub log_every: Option<u64>,
    /// Continue the run in the run directory from its latest checkpoint, with its recorded
    /// settings: the same losses as an uninterrupted run. Settings given that differ from the
    /// recorded ones are an error, unless --allow-changes.
    #[arg(long)]
    pub resume: bool,
    /// Continue the run from this checkpoint of it (the one a diverged run names); its later
    /// checkpoints and metrics are removed. Implies --resume.
    #[arg(long, value_name = "CHECKPOINT")]
    pub resume_from: Option<PathBuf>,
    /// With --resume: accept settings that differ from the run's recorded ones, listed in a
    /// warning (e.g. more --steps, which stretches the schedule from where the run is).
    #[arg(long)]
    pub allow_changes: bool,
    /// Replace the run in a run directory that is not empty: its run.json, metrics.jsonl,
    /// checkpoints/ and curves.svg are removed before training (other files are left alone).
    #[arg(long, conflicts_with_all = ["resume", "resume_from"])]
    pub overwrite: bool,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// After training, sample this many tokens from the model (0: none).
    #[arg(long, default_value_t = 300)]
    pub sample: usize,
    /// Train an objective over frozen models instead of the model's own step: `dpo` (--data
    /// one JSONL file of `prompt`, `chosen`, `rejected`; each response gets --seq-len tokens,
    /// against a frozen copy of the starting parameters), `distill` (with --teacher), or `mtp`:
    /// the model with multi-token heads (--n-predict, --mtp-weight), its own optimizer.
    #[arg(long, value_name = "OBJECTIVE")]
    pub step: Option<String>,
    /// Distil from this frozen teacher: a run directory (its latest checkpoint) or a Hugging
    /// Face folder of the same model, of any size.
    #[arg(long, value_name = "DIR")]
    pub teacher: Option<PathBuf>,
    /// With --step dpo: how far the policy may move from its reference (lmxlab's beta, 0.1).
    #[arg(long)]
    pub beta: Option<f32>,
    /// With --teacher: the softmax temperature of the soft targets (4).
    #[arg(long)]
    pub temperature: Option<f32>,
    /// With --teacher: the weight of the soft loss against the hard one (0.7).
    #[arg(long)]
    pub alpha: Option<f32>,
    /// With --step grpo: the reward of a completion: `exact` (it is the prompt's `answer`),
    /// `regex:PATTERN` (the whole completion matches) or `length[:CHARS]` (closeness to a length,
    /// --seq-len characters by default).
    #[arg(long, value_name = "REWARD")]
    pub reward: Option<String>,
    /// With --step grpo: completions sampled per prompt (8).
    #[arg(long)]
    pub group: Option<usize>,
    /// A difficulty curriculum: easy text or token files whose rows every batch mixes with
    /// --data's (the hard data), from all easy at the start to all hard after
    /// --curriculum-warmup of the run (lmxlab's difficulty_curriculum); validation on --data's.
    #[arg(long, value_name = "FILE", num_args = 1..)]
    pub curriculum_easy: Vec<PathBuf>,
    /// With --curriculum-easy: the fraction of the run over which the hard share grows to all
    /// of the batch (0.5).
    #[arg(long, value_name = "FRACTION")]
    pub curriculum_warmup: Option<f64>,
    /// With --step mtp: how many multi-token heads (lmxlab's n_predict, 2); the model
    /// configuration's `n_predict`, as `--set n_predict=N`.
    #[arg(long, value_name = "N")]
    pub n_predict: Option<usize>,
    /// With --step mtp: the weight of the heads' mean loss in the total (0.3); the model
    /// configuration's `mtp_weight`.
    #[arg(long, value_name = "WEIGHT")]
    pub mtp_weight: Option<f32>,
    /// The ids of the options given on the command line (not defaulted): on --resume the
    /// others are the run's recorded ones.
    #[arg(skip)]
    pub given: Vec<String>,
}

/// Precision, as a flag.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum PrecisionArg {
    /// float32.
    Float32,
    /// bfloat16 parameters, moments and activations.
    Bfloat16,
    /// float32 parameters and optimizer state, bfloat16 activations.
    Mixed,
}

/// [`Batching`](lmx::runtime::data::sft::Batching), as a flag.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum BatchingArg {
    /// One example a row, padded to --seq-len.
    Pad,
    /// Examples packed one after another into rows of --seq-len.
    Pack,
}

impl From<BatchingArg> for lmx::runtime::data::sft::Batching {
    fn from(batching: BatchingArg) -> Self {
        match batching {
            BatchingArg::Pad => Self::Pad,
            BatchingArg::Pack => Self::Pack,
        }
    }
}

/// [`Overlap`], as a flag.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum OverlapArg {
    /// One step at a time.
    Off,
    /// Build the next step's graph while the device computes a step; at most one step is on
    /// the device.
    Build,
    /// Also hand the next step to the device before a step is done; faster where the host's
    /// encoding is on the step's critical path; on CUDA within one step's memory, elsewhere
    /// with two steps' buffers alive at once.
    Submit,
}

impl From<OverlapArg> for Overlap {
    fn from(overlap: OverlapArg) -> Self {
        match overlap {
            OverlapArg::Off => Overlap::Off,
            OverlapArg::Build => Overlap::Build,
            OverlapArg::Submit => Overlap::Submit,
        }
    }
}

/// [`StatePacking`], as a flag.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum StatePackingArg {
    /// Flat on a CUDA GPU where the optimizer and step allow it, per parameter otherwise.
    Auto,
    /// Parameters and optimizer state packed into flat buffers: one update for the whole model.
    Flat,
    /// One array per parameter and per optimizer state array.
    PerParameter,
}

impl From<StatePackingArg> for StatePacking {
    fn from(packing: StatePackingArg) -> Self {
        match packing {
            StatePackingArg::Auto => StatePacking::Auto,
            StatePackingArg::Flat => StatePacking::Flat,
            StatePackingArg::PerParameter => StatePacking::PerParameter,
        }
    }
}

/// `lmx generate`'s options.
#[derive(Args)]
pub struct GenerateArgs {
    /// The run directory.
    #[arg(long, default_value = "runs/latest")]
    pub run: PathBuf,
    /// A Hugging Face model folder (with `config.json`) to sample from instead of a run.
    #[arg(long, value_name = "DIR", conflicts_with = "checkpoint")]
    pub model: Option<String>,
    /// A checkpoint directory (default: the run's latest).
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// The text to continue.
    #[arg(long, default_value = "ROMEO:")]
    pub prompt: String,
    /// Tokens to generate.
    #[arg(long, default_value_t = 200)]
    pub max_tokens: usize,
    /// 0 for greedy decoding; otherwise a finite positive number.
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true)]
    pub temperature: f32,
    /// Keep the k most likely tokens (0: all).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Nucleus sampling mass, in (0, 1].
    #[arg(long, allow_negative_numbers = true)]
    pub top_p: Option<f32>,
    /// Keep the tokens at least this fraction as likely as the most likely one, in [0, 1].
    #[arg(long, allow_negative_numbers = true)]
    pub min_p: Option<f32>,
    /// Divide the logits of recent tokens by this (above 1 discourages repeats).
    #[arg(long, allow_negative_numbers = true)]
    pub repetition_penalty: Option<f32>,
    /// Subtract this from the logits of recent tokens.
    #[arg(long, allow_negative_numbers = true)]
    pub presence_penalty: Option<f32>,
    /// Subtract this from the logits of recent tokens once for each time they occur.
    #[arg(long, allow_negative_numbers = true)]
    pub frequency_penalty: Option<f32>,
    /// How many recent tokens (prompt included) the penalties look at.
    #[arg(long, default_value_t = 20)]
    pub penalty_context: usize,
    /// Add AMOUNT to token ID's logit (repeatable).
    #[arg(long, value_name = "ID=AMOUNT", value_parser = parse_bias, allow_negative_numbers = true)]
    pub logit_bias: Vec<(u32, f32)>,
    /// End the text at this string, left out (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Sampler seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// With --model DIR: the prompt is a user's message, rendered through the folder's chat
    /// template with the assistant's turn opened (as mlx-lm's `generate` renders it).
    #[arg(long)]
    pub chat: bool,
    /// An adapter folder (`adapters.safetensors`, `adapter_config.json`, as `lmx lora` and
    /// `mlx_lm.lora` write it) to load on top of the run's model.
    #[arg(long)]
    pub adapter: Option<PathBuf>,
    /// Speculative decoding: a smaller model of the same family and tokenizer drafts tokens that
    /// the model checks in one pass (greedy output is the model's own, token for token; sampled
    /// output is distributed as the model's). A Hugging Face folder with --model DIR, a run
    /// directory (its latest checkpoint) with --run.
    #[arg(long, value_name = "MODEL")]
    pub draft: Option<PathBuf>,
    /// With --draft: tokens the draft proposes at a time.
    #[arg(long, default_value_t = 4, requires = "draft")]
    pub draft_tokens: usize,
    /// Hold at most N positions in each layer's key-value cache: the first --keep and the
    /// latest (mlx-lm's `--max-kv-size`, a rotating cache), so that a long generation's memory
    /// stays bounded; a query then sees those positions alone.
    #[arg(long, value_name = "N", conflicts_with = "draft")]
    pub max_kv_size: Option<usize>,
    /// With --max-kv-size: the first positions the cache keeps for good.
    #[arg(long, default_value_t = 4, requires = "max_kv_size")]
    pub keep: usize,
}

/// `lmx eval`'s options.
#[derive(Args)]
pub struct EvalArgs {
    /// The run directory.
    #[arg(long, default_value = "runs/latest")]
    pub run: PathBuf,
    /// A checkpoint directory (default: the run's latest).
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// A JSONL file of examples (default: `test.jsonl` of the run's data folder), read as the
    /// run read its examples (prompt masking, rows).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Rows per forward pass (default: the run's batch size).
    #[arg(long)]
    pub batch_size: Option<usize>,
}

impl Cli {
    /// Parses the command line, noting which of `train`'s options it gives.
    pub fn parse_noting_given() -> Cli {
        use clap::{parser::ValueSource, CommandFactory, FromArgMatches};
        let matches = Cli::command().get_matches();
        let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|err| err.exit());
        let args = match (&mut cli.command, matches.subcommand()) {
            (Command::Train(args), Some(("train", train))) => Some((args, train)),
            (Command::Lora(args), Some(("lora", train))) => Some((&mut args.train, train)),
            _ => None,
        };
        if let Some((args, train)) = args {
            args.given = train
                .ids()
                .filter(|id| train.value_source(id.as_str()) == Some(ValueSource::CommandLine))
                .map(|id| id.to_string())
                .collect();
        }
        cli
    }
}

impl TrainArgs {
    /// What to train (`default_model` unless `--model` says): on `--resume`, the run's recorded
    /// settings with those given changed.
    pub fn request(&self, registry: &Registry) -> anyhow::Result<train::TrainRequest> {
        let default_model = registry.names().first().copied().unwrap_or_default();
        let resume = match (&self.resume_from, self.resume) {
            (Some(checkpoint), _) => Some(train::Resume::From(checkpoint.clone())),
            (None, true) => Some(train::Resume::Latest),
            (None, false) => None,
        };
        let out_dir = self.out_dir()?;
        let recorded = match resume {
            Some(_) if out_dir.join(run_file::RUN_FILE).exists() => {
                Some(run_file::RunFile::read(&out_dir)?)
            }
            _ => None,
        };
        let given = |id: &str| self.given.iter().any(|given| given == id);
        let base = recorded.as_ref().map(|run| run.train.clone());
        let mut train = self.train_config(base.unwrap_or_default())?;
        train.out_dir = out_dir;
        let mut request = train::TrainRequest {
            model: self
                .model
                .clone()
                .unwrap_or_else(|| default_model.to_owned()),
            preset: self.preset.clone(),
            preset_given: given("preset"),
            model_config: None,
            init: None,
            settings: self.settings.clone(),
            data: self.data.clone(),
            sft: self.sft_settings(),
            tokenizer: tokenizer::TokenizerArg::parse(&self.tokenizer, self.eos.clone()),
            train,
            resume,
            recorded: None,
            allow_changes: self.allow_changes,
            overwrite: self.overwrite,
            progress: !self.quiet,
            lora: None,
            // Known once the model is: `--step NAME` picks among its declared steps first.
            objective: None,
            teacher: None,
            curriculum: (!self.curriculum_easy.is_empty()).then(|| run_file::DifficultySettings {
                easy: self.curriculum_easy.clone(),
                warmup_fraction: self.curriculum_warmup.unwrap_or(0.5),
                easy_tokens: None,
            }),
        };
        let mut recorded_objective = None;
        if let Some(run) = recorded {
            recorded_objective = run.objective.clone();
            if request.curriculum.is_none() {
                request.curriculum = run.curriculum.clone();
            }
            if !given("model") {
                request.model = run.model.clone();
            }
            if !given("preset") && !given("model") {
                request.preset = run.preset.clone();
                request.model_config = Some(run.model_config.clone());
            }
            if !given("tokenizer") && !given("eos") {
                request.tokenizer = tokenizer::TokenizerArg::recorded(run.tokenizer.clone());
            }
            if !given("data") && !run.data.is_empty() {
                request.data = run.data.clone();
            }
            if let Some(recorded) = &run.sft {
                if request.sft.is_some() || !given("data") {
                    let mut sft = recorded.clone();
                    if given("mask_prompt") {
                        sft.mask_prompt = self.mask_prompt;
                    }
                    if let Some(batching) = self.batching {
                        sft.batching = batching.into();
                    }
                    if let Some(template) = &self.chat_template {
                        sft.chat_template = Some(template.clone());
                    }
                    request.sft = Some(sft);
                }
            }
            if !given("init") && !given("model") {
                request.init = run.init.clone();
            }
            request.recorded = Some(run);
        }
        // A Hugging Face folder given as the model is a start from its weights, as --init.
        let folder_model = self
            .model
            .as_deref()
            .map(PathBuf::from)
            .filter(|dir| dir.join(lmx::runtime::hf::CONFIG_FILE).is_file());
        if let Some(dir) = self.init.as_ref().or(folder_model.as_ref()) {
            let folder = lmx::runtime::hf::HfFolder::open(dir)?;
            request.model = folder.family().model_name().to_owned();
            request.preset = dir.display().to_string();
            request.init = Some(dir.clone());
            if !given("tokenizer") && !given("eos") {
                request.tokenizer =
                    tokenizer::TokenizerArg::recorded(hf_model::tokenizer(&folder)?);
            }
        }
        let flags = objective::ObjectiveFlags {
            step: self.step.as_deref(),
            teacher: self.teacher.as_deref(),
            beta: self.beta,
            temperature: self.temperature,
            alpha: self.alpha,
            chat_template: self.chat_template.as_deref(),
            reward: self.reward.as_deref(),
            group: self.group,
        };
        let steps = match flags.step {
            Some(_) => steps::DeclaredSteps::of(registry, &request.model)?,
            None => steps::DeclaredSteps {
                model: request.model.clone(),
                names: Vec::new(),
            },
        };
        request.objective = flags.settings(&steps)?.or(recorded_objective);
        match (&mut request.curriculum, self.curriculum_warmup) {
            (Some(curriculum), Some(warmup)) => curriculum.warmup_fraction = warmup,
            (None, Some(_)) => anyhow::bail!("--curriculum-warmup applies to --curriculum-easy"),
            _ => {}
        }
        // The heads' settings are the model configuration's, recorded with it.
        let heads = [("n_predict", self.n_predict.map(|n| n.to_string()))]
            .into_iter()
            .chain([("mtp_weight", self.mtp_weight.map(|w| w.to_string()))])
            .filter_map(|(name, value)| value.map(|value| (name, value)));
        for (name, value) in heads {
            if !request.objective.as_ref().is_some_and(|o| o.multi_token()) {
                anyhow::bail!("--n-predict and --mtp-weight apply to --step mtp");
            }
            request.settings.push(settings::Setting {
                name: name.to_owned(),
                value,
            });
        }
        let sft_flags = ["mask_prompt", "batching", "chat_template"];
        // DPO reads its pairs through the chat template too.
        let pairs = request.objective.as_ref().is_some_and(|o| o.reads_pairs());
        let sft_flags = &sft_flags[..if pairs { 2 } else { 3 }];
        if request.sft.is_none() {
            if let Some(flag) = sft_flags.iter().find(|flag| given(flag)) {
                anyhow::bail!(
                    "--{} applies to a folder of supervised examples (--data DIR with \
                     train.jsonl), not to text or token files",
                    flag.replace('_', "-")
                );
            }
        }
        Ok(request)
    }

    /// How supervised examples are read, when the data is one folder of them.
    fn sft_settings(&self) -> Option<sft::SftSettings> {
        let [dir] = &self.data[..] else {
            return None;
        };
        dir.is_dir().then(|| sft::SftSettings {
            mask_prompt: self.mask_prompt,
            batching: self.batching.map(Into::into).unwrap_or_default(),
            chat_template: self.chat_template.clone(),
            keys: Default::default(),
        })
    }

    /// The training settings: `base` (the defaults, or a resumed run's recorded settings), then
    /// the settings the TOML file gives, then the flags.
    pub fn train_config(&self, base: TrainConfig) -> anyhow::Result<TrainConfig> {
        let mut config = match &self.config {
            Some(path) => over_toml(base, path)?,
            None => base,
        };
        if let Some(steps) = self.steps {
            config.steps = steps;
        }
        if let Some(batch_size) = self.batch_size {
            config.batch_size = batch_size;
        }
        if let Some(seq_len) = self.seq_len {
            config.seq_len = seq_len;
        }
        if let Some(parts) = self.accumulate {
            config.accumulation = Some(parts);
        }
        if let Some(seed) = self.seed {
            config.seed = seed;
        }
        if let Some(every) = self.eval_every {
            config.eval_every = every;
        }
        if let Some(every) = self.checkpoint_every {
            config.checkpoint_every = every;
        }
        if let Some(every) = self.log_every {
            config.log_every = every;
        }
        if let Some(out) = &self.out {
            config.out_dir = out.clone();
        }
        if let Some(precision) = self.precision {
            config.precision = match precision {
                PrecisionArg::Float32 => Precision::Float32,
                PrecisionArg::Bfloat16 => Precision::Bfloat16,
                PrecisionArg::Mixed => Precision::Mixed,
            };
        }
        if let Some(overlap) = self.overlap {
            config.overlap = overlap.into();
        }
        if let Some(packing) = self.state_packing {
            config.state_packing = packing.into();
        }
        if let Some(decay) = self.decay {
            config.decay = decay.into();
        }
        config.compile &= !self.eager;
        config.schedule = adjusted(config.schedule, self.steps, self.lr, self.warmup);
        match (&self.length_stages, self.stage_steps) {
            (Some(lengths), per_stage) => {
                let stages = lengths.len().max(1) as u64;
                let per_stage = per_stage.unwrap_or(config.steps.div_ceil(stages) as usize);
                config.length_stages = Some(LengthCurriculum::new(lengths.clone(), per_stage)?);
            }
            (None, Some(_)) => anyhow::bail!("--stage-steps applies to --length-stages"),
            (None, None) => {}
        }
        Ok(config)
    }

    /// Where the run goes: `--out`, else the TOML file's `out_dir`, else the default.
    pub fn out_dir(&self) -> anyhow::Result<PathBuf> {
        Ok(self.train_config(TrainConfig::default())?.out_dir)
    }
}

/// `base` with the settings `path` gives; the file is read whole as a `TrainConfig` first, so
/// that its errors name their place in it.
fn over_toml(base: TrainConfig, path: &std::path::Path) -> anyhow::Result<TrainConfig> {
    let error = |err: &dyn std::fmt::Display| anyhow::anyhow!("{}: {err}", path.display());
    let text = std::fs::read_to_string(path).map_err(|err| error(&err))?;
    toml::from_str::<TrainConfig>(&text).map_err(|err| error(&err))?;
    let given: serde_json::Value = toml::from_str(&text).map_err(|err| error(&err))?;
    let mut merged = serde_json::to_value(base)?;
    if let (Some(merged), Some(given)) = (merged.as_object_mut(), given.as_object()) {
        merged.extend(given.clone());
    }
    serde_json::from_value(merged).map_err(|err| error(&err))
}

/// `schedule` with the flags' length, peak rate and warm-up: it keeps its kind, and its final
/// rate keeps its ratio to the peak.
fn adjusted(
    schedule: Schedule,
    steps: Option<u64>,
    peak: Option<f32>,
    warmup: Option<u64>,
) -> Schedule {
    let scale = |lr: f32, final_lr: f32| match peak {
        Some(peak) if lr > 0.0 => {
            let ratio = f64::from(final_lr) / f64::from(lr);
            (peak, (f64::from(peak) * ratio) as f32)
        }
        Some(peak) => (peak, final_lr),
        None => (lr, final_lr),
    };
    match schedule {
        Schedule::Constant { lr, warmup_steps } => Schedule::Constant {
            lr: peak.unwrap_or(lr),
            warmup_steps: warmup.unwrap_or(warmup_steps),
        },
        Schedule::Linear {
            lr,
            warmup_steps,
            total_steps,
            final_lr,
        } => {
            let (lr, final_lr) = scale(lr, final_lr);
            Schedule::Linear {
                lr,
                warmup_steps: warmup.unwrap_or(warmup_steps),
                total_steps: steps.unwrap_or(total_steps),
                final_lr,
            }
        }
        Schedule::Cosine {
            lr,
            warmup_steps,
            total_steps,
            final_lr,
        } => {
            let (lr, final_lr) = scale(lr, final_lr);
            Schedule::Cosine {
                lr,
                warmup_steps: warmup.unwrap_or(warmup_steps),
                total_steps: steps.unwrap_or(total_steps),
                final_lr,
            }
        }
    }
}

/// `ID=AMOUNT` of `--logit-bias`.
fn parse_bias(text: &str) -> Result<(u32, f32), String> {
    let (id, amount) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not ID=AMOUNT"))?;
    let id = id
        .trim()
        .parse()
        .map_err(|_| format!("{id:?} is not a token id"))?;
    let amount = amount
        .trim()
        .parse()
        .map_err(|_| format!("{amount:?} is not a number"))?;
    Ok((id, amount))
}

impl GenerateArgs {
    /// The draft model of speculative decoding, if one was given.
    pub fn draft(&self) -> anyhow::Result<Option<train::Draft>> {
        let Some(path) = &self.draft else {
            return Ok(None);
        };
        anyhow::ensure!(
            self.draft_tokens > 0,
            "--draft-tokens 0: the draft must propose at least one token at a time"
        );
        Ok(Some(train::Draft {
            path: path.clone(),
            tokens: self.draft_tokens,
        }))
    }

    /// The bound on the key-value cache, if `--max-kv-size` sets one.
    pub fn max_kv(&self) -> Option<train::MaxKv> {
        self.max_kv_size.map(|size| train::MaxKv {
            size,
            keep: self.keep,
        })
    }

    /// The sampling settings; one out of range is an error naming its flag.
    pub fn sampling(&self) -> anyhow::Result<Sampling> {
        let sampling = Sampling {
            temperature: self.temperature,
            top_k: (self.top_k > 0).then_some(self.top_k),
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            penalty_context: self.penalty_context,
            logit_bias: self.logit_bias.iter().copied().collect(),
            seed: self.seed,
            max_tokens: self.max_tokens,
        };
        sampling.validate().map_err(|err| match err {
            lmx::runtime::Error::Setting {
                name,
                value,
                expected,
            } => anyhow::anyhow!(
                "--{} {value}: it must be {expected}",
                name.replace('_', "-")
            ),
            other => other.into(),
        })?;
        Ok(sampling)
    }
}

/// Runs the command over `registry`'s models.
pub fn run(cli: Cli, registry: &Registry) -> anyhow::Result<()> {
    // Writing a crate needs no device: `lmx new` works where MLX has none to offer.
    if !matches!(cli.command, Command::New { .. }) {
        device::select(cli.device)?;
    }
    match cli.command {
        Command::Train(args) => train_and_sample(registry, &args, None),
        Command::Lora(args) => train_and_sample(registry, &args.train, Some(&args)),
        Command::Fuse(args) => {
            let run = run_file::RunFile::read(&args.run)?;
            match resolve::resolve(registry, &run.model)? {
                resolve::Resolved::Registered(model) => model.fuse(&run, &args),
                resolve::Resolved::File(file) => model_file::run_in_built_program(&file),
                resolve::Resolved::Folder(..) => anyhow::bail!(
                    "{}: the run's model is a folder; fuse adapters into a run",
                    args.run.display()
                ),
            }
        }
        Command::Generate(args) => {
            let sampling = args.sampling()?;
            let draft = args.draft()?;
            if let Some(name) = &args.model {
                return match resolve::resolve(registry, name)? {
                    resolve::Resolved::Folder(model, folder) => model.generate_folder(
                        &folder,
                        hf_model::FolderGenerateRequest {
                            prompt: args.prompt.clone(),
                            sampling,
                            stop: args.stop.clone(),
                            chat: args.chat,
                            draft,
                            max_kv: args.max_kv(),
                        },
                    ),
                    _ => anyhow::bail!(
                        "--model {name}: lmx generate samples a Hugging Face model folder (with \
                         config.json); a run is sampled with --run"
                    ),
                };
            }
            if args.chat {
                anyhow::bail!(
                    "--chat renders the prompt through a Hugging Face folder's chat template: \
                     give the folder with --model DIR"
                );
            }
            let run = run_file::RunFile::read(&args.run)?;
            let model = match resolve::resolve(registry, &run.model)? {
                resolve::Resolved::Registered(model) => model,
                resolve::Resolved::File(file) => return model_file::run_in_built_program(&file),
                resolve::Resolved::Folder(..) => {
                    anyhow::bail!("{}'s model is a folder, not a model", args.run.display())
                }
            };
            let request = train::GenerateRequest {
                run: args.run.clone(),
                checkpoint: args.checkpoint.clone(),
                prompt: args.prompt.clone(),
                sampling,
                stop: args.stop.clone(),
                adapter: args.adapter.clone(),
                draft,
                max_kv: args.max_kv(),
            };
            model.generate(&run, request)
        }
        Command::Eval(args) => {
            let run = run_file::RunFile::read(&args.run)?;
            let model = match resolve::resolve(registry, &run.model)? {
                resolve::Resolved::Registered(model) => model,
                resolve::Resolved::File(file) => return model_file::run_in_built_program(&file),
                resolve::Resolved::Folder(..) => {
                    anyhow::bail!("{}'s model is a folder, not a model", args.run.display())
                }
            };
            let request = eval::EvalRequest {
                run: args.run,
                checkpoint: args.checkpoint,
                data: args.data,
                batch_size: args.batch_size,
            };
            model.evaluate(&run, request)
        }
        Command::Check {
            file,
            preset,
            batch,
            seq,
        } => check::check(registry, &file, preset.as_deref(), batch, seq),
        Command::Info { model, preset } => {
            let dir = std::path::Path::new(&model);
            if dir.join(lmx::runtime::hf::CONFIG_FILE).is_file() {
                folder_info::describe(&lmx::runtime::hf::HfFolder::open(dir)?)
            } else {
                check::info(registry, &model, preset.as_deref())
            }
        }
        Command::Count { model, preset } => check::count(registry, &model, preset.as_deref()),
        Command::Models => check::models(registry),
        Command::Export(args) => export::run(args, registry),
        Command::New { path, lmx_path } => new::new(&path, lmx_path.as_deref()),
        Command::Plot { run, out } => {
            let path = plot::plot(&run, out)?;
            println!("{}", path.display());
            Ok(())
        }
        Command::Bench(command) => bench::run(&command),
        Command::Launch(args) => launch::run(&args),
        Command::Quantize(args) => quantize::run(args, registry),
        Command::Serve(args) => serve::run(args, registry, cli.device),
        Command::Platform => {
            println!("{}", lmx::runtime::platform::describe());
            Ok(())
        }
    }
}

/// `lmx train` (`lora` is `None`) or `lmx lora`: trains, then samples from the run.
fn train_and_sample(
    registry: &Registry,
    args: &TrainArgs,
    lora: Option<&lora::LoraArgs>,
) -> anyhow::Result<()> {
    let mut request = args.request(registry)?;
    // A run `lmx quantize` wrote has packed weights and no training state: said before the
    // data is read, rather than when the trainer finds no optimizer state to resume.
    let quantized = request
        .recorded
        .as_ref()
        .filter(|run| run.quantization.is_some() && run.lora.is_none() && run.init.is_none());
    if let (Some(_), None) = (quantized, lora) {
        anyhow::bail!(
            "{} is a quantized run, with no training state to resume (and packed weights that \
             do not train): train adapters over it in a new run (`lmx lora --base {0} --out \
             NEW`)",
            request.train.out_dir.display()
        );
    }
    if let Some(lora) = lora {
        let run = lora.lora_run(&request.train.out_dir, request.recorded.as_ref())?;
        lora::on_base(&mut request, &run)?;
        request.lora = Some(run);
    }
    // A folder given as --model was read as --init: the request names its family's model.
    let model = match resolve::resolve(registry, &request.model)? {
        resolve::Resolved::Registered(model) | resolve::Resolved::Folder(model, _) => model,
        resolve::Resolved::File(file) => return model_file::run_in_built_program(&file),
    };
    if let Some(objective::ObjectiveSettings::Distill { teacher, .. }) = &request.objective {
        request.teacher = Some(*objective::teacher_model(registry, teacher)?);
    }
    let out_dir = request.train.out_dir.clone();
    if !model.train(request)? {
        return Ok(());
    }
    if args.sample == 0 {
        return Ok(());
    }
    println!("\nsample:");
    let run = run_file::RunFile::read(&out_dir)?;
    let request = train::GenerateRequest {
        run: out_dir,
        checkpoint: None,
        prompt: "ROMEO:".into(),
        sampling: lmx::runtime::generate::Sampling {
            max_tokens: args.sample,
            ..Default::default()
        },
        stop: Vec::new(),
        adapter: None,
        draft: None,
        max_kv: None,
    };
    model.generate(&run, request)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn train_args(args: &[&str]) -> TrainArgs {
        let cli = Cli::try_parse_from([&["lmx", "train"][..], args].concat()).unwrap();
        match cli.command {
            Command::Train(args) => args,
            _ => unreachable!("a train command"),
        }
    }

    #[test]
    fn steps_lr_and_warmup_flags_change_the_configured_schedule_and_keep_its_kind() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("train.toml");
        std::fs::write(
            &config,
            "steps = 100\n[schedule]\nkind = \"linear\"\nlr = 0.5\nwarmup_steps = 7\n\
             total_steps = 100\nfinal_lr = 0.25\n",
        )
        .unwrap();
        let config = config.to_str().unwrap();
        let linear = train_args(&["--config", config, "--steps", "50", "--lr", "0.25"])
            .train_config(TrainConfig::default())
            .unwrap();
        assert_eq!(linear.steps, 50);
        assert_eq!(
            linear.schedule,
            Schedule::Linear {
                lr: 0.25,
                warmup_steps: 7,
                total_steps: 50,
                final_lr: 0.125,
            }
        );
        std::fs::write(
            dir.path().join("constant.toml"),
            "[schedule]\nkind = \"constant\"\nlr = 1e-3\nwarmup_steps = 5\n",
        )
        .unwrap();
        let constant = dir.path().join("constant.toml");
        let constant = train_args(&["--config", constant.to_str().unwrap(), "--warmup", "2"])
            .train_config(TrainConfig::default())
            .unwrap();
        assert_eq!(
            constant.schedule,
            Schedule::Constant {
                lr: 1e-3,
                warmup_steps: 2,
            }
        );
    }

    #[test]
    fn a_resumed_run_s_settings_are_the_base_that_the_file_and_flags_change() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("train.toml");
        std::fs::write(&config, "eval_every = 5\n").unwrap();
        let recorded = TrainConfig {
            steps: 40,
            batch_size: 3,
            ..TrainConfig::default()
        };
        let merged = train_args(&["--config", config.to_str().unwrap(), "--seed", "9"])
            .train_config(recorded)
            .unwrap();
        assert_eq!(
            (
                merged.steps,
                merged.batch_size,
                merged.eval_every,
                merged.seed
            ),
            (40, 3, 5, 9)
        );
    }
}
