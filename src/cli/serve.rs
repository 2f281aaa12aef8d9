//! `lmx serve`: the OpenAI-compatible server (`lmx::serve`) over a Hugging Face model folder, a
//! run's checkpoint, or a registered model's preset with fresh weights.

use super::registry::Registry;
use super::resolve::{self, Resolved};
use super::run_file::{self, RunFile};
use super::tokenizer::TokenizerSpec;
use lmx::runtime::data::sft::ChatTemplate;
use lmx::runtime::data::{ByteTokenizer, Tokenizer};
use lmx::runtime::device::{self, DeviceKind};
use lmx::runtime::generate::{BatchGenerator, BatchLimits};
use lmx::runtime::hf::{self, HfFolder, TokenizerConfig};
use lmx::runtime::model::LanguageModel;
use lmx::serve::{Loaded, Options, Text};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// `lmx serve`'s options.
#[derive(clap::Args, Clone, Debug)]
pub struct ServeArgs {
    /// A Hugging Face model folder (with `config.json`), or a registered model's name (with
    /// --preset: fresh weights, for trying the server out).
    #[arg(long, conflicts_with = "run")]
    pub model: Option<String>,
    /// A run directory: its latest checkpoint, or --checkpoint.
    #[arg(long)]
    pub run: Option<PathBuf>,
    /// A checkpoint of --run other than its latest.
    #[arg(long, requires = "run")]
    pub checkpoint: Option<PathBuf>,
    /// With a registered model's name: the preset.
    #[arg(long, requires = "model")]
    pub preset: Option<String>,
    /// With --preset: the seed of the fresh weights.
    #[arg(long, default_value_t = 0, requires = "preset")]
    pub seed: u64,
    /// With --preset: a `tokenizer.json` (default: bytes, for a vocabulary of at least 257).
    #[arg(long, requires = "preset")]
    pub tokenizer: Option<PathBuf>,
    /// The address to listen on; only this machine reaches the default.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// The port; 0 takes a free one (the address is printed).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// A key requests must give as `Authorization: Bearer KEY`.
    #[arg(long, env = "LMX_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// The model's id in the API (default: the folder's or run's name, or NAME-PRESET).
    #[arg(long)]
    pub name: Option<String>,
    /// The largest request body, in bytes (larger ones get 413).
    #[arg(long, default_value_t = 1 << 20)]
    pub max_body_bytes: usize,
    /// The largest `max_tokens` a request may ask.
    #[arg(long, default_value_t = 4096)]
    pub max_tokens: usize,
    /// `max_tokens` for a request that gives none.
    #[arg(long, default_value_t = 256)]
    pub default_max_tokens: usize,
    /// The longest prompt, in tokens (default: the model's context less one).
    #[arg(long)]
    pub max_prompt_tokens: Option<usize>,
    /// Requests waiting for a place in the batch; more get 429.
    #[arg(long, default_value_t = 256)]
    pub max_queue: usize,
    /// Sequences generated at once.
    #[arg(long, default_value_t = 32)]
    pub max_batch: usize,
    /// Seconds a shutdown (SIGINT, SIGTERM) waits for the requests in flight to finish before
    /// cancelling them.
    #[arg(long, default_value_t = 30.0)]
    pub shutdown_grace: f64,
}

/// Where the served model comes from.
pub enum Source {
    /// A Hugging Face model folder.
    Folder(PathBuf),
    /// A run's checkpoint.
    Run {
        /// The run directory.
        dir: PathBuf,
        /// The checkpoint (default: the latest).
        checkpoint: Option<PathBuf>,
    },
    /// A preset, with fresh weights.
    Preset(String),
}

/// Serves what `args` names, with the models of `registry`.
pub fn run(args: ServeArgs, registry: &Registry, device: DeviceKind) -> anyhow::Result<()> {
    let (model, source) = match (&args.model, &args.run) {
        (Some(name), _) => match resolve::resolve(registry, name)? {
            Resolved::Folder(model, folder) => {
                anyhow::ensure!(
                    args.preset.is_none(),
                    "--model {name} is a model folder, which has its own settings: --preset is \
                     for a registered model's name"
                );
                (model, Source::Folder(folder.dir().to_owned()))
            }
            Resolved::Registered(model) => match &args.preset {
                Some(preset) => (model, Source::Preset(preset.clone())),
                None => anyhow::bail!(
                    "--model {name} is a registered model: give --preset to serve one with fresh \
                     weights, or serve a trained run with --run"
                ),
            },
            Resolved::File(file) => return super::model_file::run_in_built_program(&file),
        },
        (None, Some(dir)) => {
            let run = RunFile::read(dir)?;
            match resolve::resolve(registry, &run.model)? {
                Resolved::Registered(model) => (
                    model,
                    Source::Run {
                        dir: dir.clone(),
                        checkpoint: args.checkpoint.clone(),
                    },
                ),
                Resolved::File(file) => return super::model_file::run_in_built_program(&file),
                Resolved::Folder(..) => {
                    anyhow::bail!("{}'s model is a folder, not a model", dir.display())
                }
            }
        }
        (None, None) => {
            anyhow::bail!("lmx serve needs --model DIR (or NAME --preset P) or --run DIR")
        }
    };
    model.serve(source, &args, device)
}

/// Serves a model of type `M` from `source`.
pub fn serve<M: LanguageModel>(
    source: Source,
    args: &ServeArgs,
    device: DeviceKind,
) -> anyhow::Result<()> {
    let (text, id): (Text, String) = match &source {
        Source::Folder(dir) => {
            let folder = HfFolder::open(dir)?;
            let tokenizer = super::hf_model::tokenizer(&folder)?.load(dir)?;
            let template = chat_template(folder.tokenizer_config())?;
            (
                Text {
                    tokenizer: tokenizer.into(),
                    template,
                },
                name_of(dir),
            )
        }
        Source::Run { dir, .. } => {
            let run = RunFile::read(dir)?;
            let tokenizer = run.tokenizer.load(dir)?;
            let template = match &run.tokenizer {
                TokenizerSpec::HuggingFace { path, .. } => chat_template(&TokenizerConfig::read(
                    path.parent().unwrap_or(Path::new(".")),
                )?)?,
                _ => None,
            };
            (
                Text {
                    tokenizer: tokenizer.into(),
                    template,
                },
                name_of(dir),
            )
        }
        Source::Preset(preset) => {
            let tokenizer: Arc<dyn Tokenizer> = match &args.tokenizer {
                Some(path) => TokenizerSpec::HuggingFace {
                    path: path.clone(),
                    eos: None,
                }
                .load(Path::new("."))?
                .into(),
                None => Arc::new(ByteTokenizer::with_eos()),
            };
            (
                Text {
                    tokenizer,
                    template: None,
                },
                format!("{}-{preset}", M::NAME),
            )
        }
    };
    let tokenizer_vocab = text.tokenizer.vocab_size();
    let options = Options {
        host: args.host.clone(),
        port: args.port,
        api_key: args.api_key.clone().filter(|key| !key.is_empty()),
        model_id: args.name.clone().unwrap_or(id),
        max_body_bytes: args.max_body_bytes,
        max_tokens: args.max_tokens,
        default_max_tokens: args.default_max_tokens,
        max_prompt_tokens: args.max_prompt_tokens,
        max_queue: args.max_queue,
        max_batch: args.max_batch,
        shutdown_grace: std::time::Duration::try_from_secs_f64(args.shutdown_grace).map_err(
            |_| {
                anyhow::anyhow!(
                    "--shutdown-grace {}: it must be a number of seconds",
                    args.shutdown_grace
                )
            },
        )?,
    };
    let seed = args.seed;
    let max_batch = args.max_batch;
    lmx::serve::serve(options, text, move || {
        device::select(device)?;
        let (config, params) = load::<M>(&source, seed)?;
        let vocab_size = M::vocab_size(&config);
        anyhow::ensure!(
            tokenizer_vocab <= vocab_size,
            "the tokenizer has {tokenizer_vocab} ids, more than the model's vocabulary of \
             {vocab_size}"
        );
        let context_len = M::context_len(&config);
        // The worker admits at most --max-batch sequences, running or waiting for the batch to
        // drain (a prompt longer than the running rows' filled length waits).
        let limits = BatchLimits {
            max_batch,
            max_waiting: max_batch,
        };
        let loaded: Loaded<BatchGenerator<M>> = (
            BatchGenerator::new(params, config, limits)?,
            context_len,
            vocab_size,
        );
        Ok(loaded)
    })
}

/// The configuration and parameters of the model `source` names.
fn load<M: LanguageModel>(source: &Source, seed: u64) -> anyhow::Result<(M::Config, M::Params)> {
    Ok(match source {
        Source::Folder(dir) => hf::load_model::<M>(&HfFolder::open(dir)?, None)?,
        Source::Run { dir, checkpoint } => {
            let run = RunFile::read(dir)?;
            let config: M::Config = serde_json::from_value(run.model_config.clone())?;
            M::validate(&config)?;
            let checkpoint = run_file::checkpoint_of(dir, checkpoint.clone())?;
            let params = run_file::load_params::<M>(&run, &config, &checkpoint, None)?;
            (config, params)
        }
        Source::Preset(preset) => {
            let config = M::preset(preset).ok_or_else(|| {
                anyhow::anyhow!(
                    "{} has no preset `{preset}`; its presets are {}",
                    M::NAME,
                    M::presets().join(", ")
                )
            })?;
            M::validate(&config)?;
            let params = M::init(&config, seed)?;
            (config, params)
        }
    })
}

/// The compiled chat template beside a tokenizer, if there is one.
fn chat_template(config: &TokenizerConfig) -> anyhow::Result<Option<ChatTemplate>> {
    let Some((source, path)) = config.chat_template()? else {
        return Ok(None);
    };
    Ok(Some(ChatTemplate::new(
        path.display().to_string(),
        source,
        config.bos_token().as_deref(),
        config.eos_token().as_deref(),
    )?))
}

/// A folder's name, as the model's id.
fn name_of(dir: &Path) -> String {
    dir.canonicalize()
        .ok()
        .and_then(|dir| {
            dir.file_name()
                .map(|name| name.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| dir.display().to_string())
}
