//! `lmx lora` (training low-rank adapters on a frozen model, as `mlx_lm.lora`) and `lmx fuse`
//! (the adapters folded into the model's weights, as `mlx_lm.fuse`).

use super::run_file::RunFile;
use super::TrainArgs;
use clap::Args;
use lmx::runtime::checkpoint::{self, MODEL_FILE};
use lmx::runtime::hf::HfFolder;
use lmx::runtime::lora::{self, AdapterConfig, FineTuneType, LoraParameters};
use lmx::runtime::model::{LanguageModel, TrainingStep};
use lmx::runtime::tree::{self, Tree};
use lmx::runtime::Array;
use std::path::{Path, PathBuf};

/// `lmx lora`'s options: `lmx train`'s, and the adapters' (mlx-lm's flags and defaults).
#[derive(Args)]
pub struct LoraArgs {
    #[command(flatten)]
    pub train: TrainArgs,
    /// The adapters' rank.
    #[arg(long, default_value_t = 8)]
    pub rank: i32,
    /// The scale of the adapters' output (mlx-lm's `scale`, LoRA's alpha / rank).
    #[arg(long, default_value_t = 20.0)]
    pub scale: f32,
    /// Dropout on the adapters' input in training (mlx-lm's `lora_parameters.dropout`), its
    /// masks drawn from the step's random key.
    #[arg(long, alias = "lora-dropout", default_value_t = 0.0)]
    pub dropout: f32,
    /// The kind of adapter: `lora`, or `dora` (a magnitude per output row as well, as
    /// mlx-lm's `--fine-tune-type dora`).
    #[arg(long, value_parser = fine_tune_type, default_value = "lora")]
    pub fine_tune_type: FineTuneType,
    /// The layers adapted, by their name within a block (`self_attn.q_proj`), comma-separated;
    /// by default every linear layer and stacked expert projection of the blocks, as mlx-lm.
    #[arg(long, value_delimiter = ',')]
    pub keys: Option<Vec<String>>,
    /// How many blocks, counted from the last, get adapters (-1: all).
    #[arg(long, default_value_t = 16, allow_negative_numbers = true)]
    pub num_layers: i64,
    /// Where `adapters.safetensors` and `adapter_config.json` are written (default: the run
    /// directory's `adapters/`).
    #[arg(long)]
    pub adapter_path: Option<PathBuf>,
    /// The frozen model: a run directory (its latest checkpoint) or a checkpoint directory of
    /// one, whose model, configuration and tokenizer the adapters train on. Without it, the
    /// model is a Hugging Face folder's (`--init DIR`), or `--model` at `--preset`, initialised
    /// from `--seed`.
    #[arg(long, conflicts_with_all = ["model", "preset", "settings", "tokenizer", "init"])]
    pub base: Option<PathBuf>,
}

/// `--fine-tune-type`'s values.
fn fine_tune_type(value: &str) -> Result<FineTuneType, String> {
    match value {
        "lora" => Ok(FineTuneType::Lora),
        "dora" => Ok(FineTuneType::Dora),
        other => Err(format!(
            "`{other}` is not an adapter kind: `lora` or `dora` (mlx-lm's `full` trains the \
             whole model: use `lmx train`)"
        )),
    }
}

/// A LoRA run's adapters, as `run.json` records them.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LoraRun {
    /// LoRA or DoRA.
    #[serde(default)]
    pub fine_tune_type: FineTuneType,
    /// Rank, scale, dropout, keys.
    pub parameters: LoraParameters,
    /// The blocks adapted, from the last (-1: all).
    pub num_layers: i64,
    /// Where the adapters are written at the end of the run.
    pub adapter_path: PathBuf,
    /// The checkpoint of the frozen model, when it is not initialised.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<PathBuf>,
}

impl LoraRun {
    /// The adapters' `adapter_config.json`.
    pub fn adapter_config(&self) -> AdapterConfig {
        AdapterConfig {
            fine_tune_type: self.fine_tune_type,
            num_layers: self.num_layers,
            lora_parameters: self.parameters.clone(),
            other: Default::default(),
        }
    }
}

impl LoraArgs {
    /// The adapters asked for: a resumed run (`recorded`) keeps its recorded adapters' settings
    /// where no flag gives one; the run directory gives the default adapter folder.
    pub fn lora_run(&self, out_dir: &Path, recorded: Option<&RunFile>) -> anyhow::Result<LoraRun> {
        let given = |id: &str| self.train.given.iter().any(|given| given == id);
        let recorded = recorded.and_then(|run| run.lora.as_ref());
        let kept = |id: &str| if given(id) { None } else { recorded };
        Ok(LoraRun {
            fine_tune_type: kept("fine_tune_type")
                .map_or(self.fine_tune_type, |lora| lora.fine_tune_type),
            parameters: LoraParameters {
                rank: kept("rank").map_or(self.rank, |lora| lora.parameters.rank),
                scale: kept("scale").map_or(self.scale, |lora| lora.parameters.scale),
                dropout: kept("dropout").map_or(self.dropout, |lora| lora.parameters.dropout),
                keys: kept("keys").map_or(self.keys.clone(), |lora| lora.parameters.keys.clone()),
            },
            num_layers: kept("num_layers").map_or(self.num_layers, |lora| lora.num_layers),
            adapter_path: match (&self.adapter_path, recorded) {
                (Some(path), _) => path.clone(),
                (None, Some(lora)) => lora.adapter_path.clone(),
                (None, None) => out_dir.join("adapters"),
            },
            base: match (&self.base, recorded) {
                (Some(base), _) => Some(run_checkpoint(base)?.1),
                (None, recorded) => recorded.and_then(|lora| lora.base.clone()),
            },
        })
    }
}

/// The run directory and checkpoint `path` names: a run directory (its latest checkpoint) or a
/// checkpoint of one (`RUN/checkpoints/step-N`).
fn run_checkpoint(path: &Path) -> anyhow::Result<(PathBuf, PathBuf)> {
    super::run_file::run_checkpoint(path)?.ok_or_else(|| {
        anyhow::anyhow!(
            "{}: not a run directory (run.json) or a checkpoint of one (RUN/checkpoints/step-N)",
            path.display()
        )
    })
}

/// `request` made to train on top of the base run of `lora`: its model, configuration and
/// tokenizer (a tokenizer trained for the base run is read from its folder).
pub fn on_base(request: &mut super::train::TrainRequest, lora: &LoraRun) -> anyhow::Result<()> {
    let Some(checkpoint) = &lora.base else {
        return Ok(());
    };
    let (dir, _) = run_checkpoint(checkpoint)?;
    let base = RunFile::read(&dir)?;
    request.model = base.model;
    request.preset = base.preset;
    request.model_config = Some(base.model_config);
    request.settings.clear();
    request.tokenizer = super::tokenizer::TokenizerArg::recorded(match base.tokenizer {
        super::tokenizer::TokenizerSpec::Bpe => super::tokenizer::TokenizerSpec::HuggingFace {
            path: dir.join(super::tokenizer::TRAINED_FILE),
            eos: Some(lmx::runtime::data::BPE_EOS.into()),
        },
        other => other,
    });
    Ok(())
}

/// The frozen model's parameters for a run of `M`: the base checkpoint's, or initialised from
/// `seed`.
pub fn base_params<M: LanguageModel>(
    lora: Option<&LoraRun>,
    config: &M::Config,
    seed: u64,
) -> anyhow::Result<M::Params> {
    let Some(checkpoint) = lora.and_then(|lora| lora.base.as_ref()) else {
        return Ok(M::init(config, seed)?);
    };
    let base = RunFile::read(&run_checkpoint(checkpoint)?.0)?;
    if base.lora.is_some() {
        anyhow::bail!(
            "{} is a LoRA run's checkpoint, which holds adapters over its own base: fuse them \
             into the weights first (`lmx fuse --run RUN --out FUSED`) and give FUSED as --base",
            checkpoint.display()
        );
    }
    let folder = base.init.as_deref().map(HfFolder::open).transpose()?;
    let place = super::run_file::run_file_of(checkpoint);
    let template = super::run_file::template::<M>(&base, config, seed, folder.as_ref(), &place)?;
    Ok(checkpoint::load_tree(
        &checkpoint.join(MODEL_FILE),
        &template,
    )?)
}

/// The training state's size, as `lmx lora` reports it when it starts: what trains, what stays
/// frozen, and the optimizer's state (held for the trainable parameters only).
pub fn state_size<P: Tree<Array>>(params: &P, optimizer_bytes: usize) -> String {
    let trainable = tree::parameter_count(params, |spec| spec.trainable);
    let frozen = tree::parameter_count(params, |spec| !spec.trainable);
    format!(
        "trainable parameters {} ({:.3}% of {}), frozen {}, optimizer state {}",
        super::check::group_digits(trainable as u64),
        100.0 * trainable as f64 / (trainable + frozen).max(1) as f64,
        super::check::group_digits((trainable + frozen) as u64),
        super::check::group_digits(frozen as u64),
        super::check::bytes(optimizer_bytes as u64),
    )
}

/// `lmx fuse`'s options.
#[derive(Args)]
pub struct FuseArgs {
    /// The run directory of the base model.
    #[arg(long, default_value = "runs/latest")]
    pub run: PathBuf,
    /// A checkpoint directory (default: the run's latest).
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// An adapter folder (`adapters.safetensors`, `adapter_config.json`) to fuse; a LoRA run's
    /// own adapters are fused without it.
    #[arg(long)]
    pub adapter: Option<PathBuf>,
    /// The new run directory: the fused model as a checkpoint that `lmx generate` samples.
    #[arg(long)]
    pub out: PathBuf,
}

/// Fuses the adapters of a run of step `S`'s model (its own, or `--adapter`'s) into its weights
/// and writes the result as a new run directory: `run.json` (without adapters), the tokenizer,
/// and a checkpoint holding `model.safetensors`.
pub fn fuse<S: TrainingStep>(run: &RunFile, args: &FuseArgs) -> anyhow::Result<()> {
    let config: <S::Model as LanguageModel>::Config =
        serde_json::from_value(run.model_config.clone())?;
    S::Model::validate(&config)?;
    let checkpoint = super::run_file::checkpoint_of(&args.run, args.checkpoint.clone())?;
    lmx::runtime::checkpoint::atomic::refuse_taken(&args.out)?;
    let mut params = super::run_file::load_params::<S::Model>(
        run,
        &config,
        &checkpoint,
        args.adapter.as_deref(),
    )?;
    let fused = lora::fuse(&mut params)?;
    if fused == 0 {
        anyhow::bail!(
            "{} has no adapters to fuse: give --adapter DIR, or the run of `lmx lora`",
            checkpoint.display()
        );
    }
    let record = RunFile {
        lora: None,
        quantization: lmx::runtime::quant::layout::record(&params),
        ..run.clone()
    };
    super::derived_run::write(&args.out, &args.run, &record, &checkpoint, &params)?;
    println!(
        "fused {fused} adapter(s) of {} into {}",
        checkpoint.display(),
        args.out.display()
    );
    Ok(())
}
