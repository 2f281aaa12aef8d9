//! The `lmx` command line.

pub mod bench;
pub mod bundled;
pub mod check;
pub mod plot;
pub mod registry;
pub mod run_file;
pub mod settings;
pub mod tokenizer;
pub mod train;

use clap::{Args, Parser, Subcommand};
use lmx::runtime::device::{self, DeviceKind};
use lmx::runtime::generate::Sampling;
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
    /// Train a bundled model on text, JSONL or token files.
    Train(TrainArgs),
    /// Sample text from a run's latest checkpoint.
    Generate(GenerateArgs),
    /// Check a `.lmx` file: diagnostics, or parameter shapes, FLOPs and memory for a preset.
    Check {
        /// The `.lmx` file (or a bundled model's name).
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
    /// Describe a model: presets, parameters, FLOPs, memory.
    Info {
        /// A bundled model's name or a `.lmx` file.
        model: String,
        /// The preset.
        #[arg(long)]
        preset: Option<String>,
    },
    /// Count a model's parameters, for one preset or all.
    Count {
        /// A bundled model's name or a `.lmx` file.
        model: String,
        /// The preset.
        #[arg(long)]
        preset: Option<String>,
    },
    /// List the bundled models.
    Models,
    /// Draw a run's loss and learning-rate curves to SVG.
    Plot {
        /// The run directory.
        run: PathBuf,
        /// The SVG file (default: RUN/curves.svg).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Show the MLX library, BLAS and backends in use.
    Platform,
    /// Measure lmx beside the Python MLX anchors: training steps, generation.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

/// `lmx train`'s options; a TOML file (`--config`) gives the defaults that flags override.
#[derive(Args)]
pub struct TrainArgs {
    /// The bundled model.
    #[arg(long, default_value = "gpt2")]
    pub model: String,
    /// Its preset.
    #[arg(long, default_value = "bpe")]
    pub preset: String,
    /// Changes a setting of the model's configuration on top of the preset (repeatable), e.g.
    /// `--set pdrop=0.1`.
    #[arg(long = "set", value_name = "NAME=VALUE")]
    pub settings: Vec<settings::Setting>,
    /// Training data: text, `.jsonl` (field "text") or `.tokens` files.
    #[arg(long, num_args = 1.., default_value = "data/shakespeare.txt")]
    pub data: Vec<PathBuf>,
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
    /// Updates to make.
    #[arg(long)]
    pub steps: Option<u64>,
    /// Sequences per update.
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Tokens per sequence.
    #[arg(long)]
    pub seq_len: Option<usize>,
    /// Peak learning rate (cosine decay to a tenth after the warm-up).
    #[arg(long)]
    pub lr: Option<f32>,
    /// Warm-up steps.
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
    /// Evaluate the validation loss every N steps.
    #[arg(long)]
    pub eval_every: Option<u64>,
    /// Save a checkpoint every N steps (and at the end).
    #[arg(long)]
    pub checkpoint_every: Option<u64>,
    /// Print a progress line every N steps when standard error is not a terminal (0: none).
    #[arg(long)]
    pub log_every: Option<u64>,
    /// Continue from the run directory's latest checkpoint.
    #[arg(long)]
    pub resume: bool,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// After training, sample this many tokens from the model (0: none).
    #[arg(long, default_value_t = 300)]
    pub sample: usize,
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
    /// A checkpoint directory (default: the run's latest).
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// The text to continue.
    #[arg(long, default_value = "ROMEO:")]
    pub prompt: String,
    /// Tokens to generate.
    #[arg(long, default_value_t = 200)]
    pub max_tokens: usize,
    /// 0 for greedy decoding.
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f32,
    /// Keep the k most likely tokens (0: all).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Nucleus sampling mass.
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Sampler seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl TrainArgs {
    /// The training settings: defaults, then the TOML file, then the flags.
    pub fn train_config(&self) -> anyhow::Result<TrainConfig> {
        let mut config = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|err| anyhow::anyhow!("{}: {err}", path.display()))?;
                toml::from_str(&text).map_err(|err| anyhow::anyhow!("{}: {err}", path.display()))?
            }
            None => TrainConfig::default(),
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
        config.compile &= !self.eager;
        if self.lr.is_some() || self.warmup.is_some() || self.steps.is_some() {
            let lr = self.lr.unwrap_or(config.schedule.peak_lr());
            let warmup_steps = self.warmup.unwrap_or(config.steps / 10);
            config.schedule = Schedule::Cosine {
                lr,
                warmup_steps,
                total_steps: config.steps,
                final_lr: lr / 10.0,
            };
        }
        Ok(config)
    }
}

impl GenerateArgs {
    /// The sampling settings.
    pub fn sampling(&self) -> Sampling {
        Sampling {
            temperature: self.temperature,
            top_k: (self.top_k > 0).then_some(self.top_k),
            top_p: self.top_p,
            seed: self.seed,
            max_tokens: self.max_tokens,
        }
    }
}

/// Runs the command.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    device::select(cli.device)?;
    match cli.command {
        Command::Train(args) => {
            let request = train::TrainRequest {
                model: args.model.clone(),
                preset: args.preset.clone(),
                settings: args.settings.clone(),
                data: args.data.clone(),
                tokenizer: tokenizer::TokenizerArg::parse(&args.tokenizer, args.eos.clone()),
                train: args.train_config()?,
                resume: args.resume,
                progress: !args.quiet,
            };
            let out_dir = request.train.out_dir.clone();
            registry::train(request)?;
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
            };
            registry::generate(&run, request)
        }
        Command::Generate(args) => {
            let run = run_file::RunFile::read(&args.run)?;
            let request = train::GenerateRequest {
                run: args.run.clone(),
                checkpoint: args.checkpoint.clone(),
                prompt: args.prompt.clone(),
                sampling: args.sampling(),
            };
            registry::generate(&run, request)
        }
        Command::Check {
            file,
            preset,
            batch,
            seq,
        } => check::check(&file, preset.as_deref(), batch, seq),
        Command::Info { model, preset } => check::info(&model, preset.as_deref()),
        Command::Count { model, preset } => check::count(&model, preset.as_deref()),
        Command::Models => check::models(),
        Command::Plot { run, out } => {
            let path = plot::plot(&run, out)?;
            println!("{}", path.display());
            Ok(())
        }
        Command::Bench(command) => bench::run(&command),
        Command::Platform => {
            println!("{}", lmx::runtime::platform::describe());
            Ok(())
        }
    }
}
