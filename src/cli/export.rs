//! `lmx export`: a run's checkpoint, or a Hugging Face model folder loaded by lmx, written as a
//! Hugging Face model folder (`config.json`, `model.safetensors` or shards with their index, the
//! tokenizer's files) that transformers and mlx-lm load.

use super::registry::Registry;
use super::resolve::{self, Resolved};
use super::run_file::RunFile;
use super::tokenizer::{TokenizerSpec, TRAINED_FILE};
use clap::Args;
use lmx::runtime::data::{HfTokenizer, BPE_EOS};
use lmx::runtime::hf::{self, Carried, Family, HfFolder, FAMILIES};
use lmx::runtime::mlx_rs::Dtype;
use lmx::runtime::model::LanguageModel;
use lmx::runtime::tree;
use std::path::PathBuf;

/// `lmx export`'s options.
#[derive(Args)]
pub struct ExportArgs {
    /// The run directory whose checkpoint to export.
    #[arg(long, conflicts_with = "model")]
    pub run: Option<PathBuf>,
    /// A checkpoint directory of the run (default: its latest).
    #[arg(long, requires = "run")]
    pub checkpoint: Option<PathBuf>,
    /// A Hugging Face model folder to load and write again.
    #[arg(long)]
    pub model: Option<String>,
    /// The folder to write: new, or empty.
    #[arg(long)]
    pub out: PathBuf,
    /// The weights' dtype (default: the source's: the checkpoint's, or the folder's
    /// `torch_dtype`).
    #[arg(long, value_enum)]
    pub dtype: Option<DtypeArg>,
    /// The largest weights file, as transformers writes sizes (`5GB`, `500MB`, `2GiB`, or
    /// bytes); a larger model is split into shards with `model.safetensors.index.json`.
    #[arg(long, default_value = "5GB", value_parser = parse_size)]
    pub max_shard_size: u64,
}

/// The weights' dtype, as a flag.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum DtypeArg {
    /// float32.
    Float32,
    /// bfloat16.
    Bfloat16,
    /// float16.
    Float16,
}

impl From<DtypeArg> for Dtype {
    fn from(dtype: DtypeArg) -> Dtype {
        match dtype {
            DtypeArg::Float32 => Dtype::Float32,
            DtypeArg::Bfloat16 => Dtype::Bfloat16,
            DtypeArg::Float16 => Dtype::Float16,
        }
    }
}

/// A size as `save_pretrained`'s `max_shard_size` reads it: bytes, or a number with a decimal
/// (`KB`, `MB`, `GB`) or binary (`KiB`, `MiB`, `GiB`) unit.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let scale: u64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "KIB" => 1 << 10,
        "MIB" => 1 << 20,
        "GIB" => 1 << 30,
        _ => {
            return Err(format!(
                "`{text}`: the units are B, KB, MB, GB, KiB, MiB, GiB"
            ))
        }
    };
    let bytes = number
        .parse::<f64>()
        .ok()
        .map(|number| number * scale as f64)
        .filter(|bytes| bytes.is_finite() && *bytes >= 1.0)
        .ok_or_else(|| format!("`{text}` is not a size of at least one byte"))?;
    Ok(bytes as u64)
}

/// Where the exported model comes from.
pub enum Source {
    /// A run's checkpoint.
    Run {
        /// The run directory.
        dir: PathBuf,
        /// Its `run.json`.
        run: Box<RunFile>,
        /// The checkpoint (default: the run's latest).
        checkpoint: Option<PathBuf>,
    },
    /// A Hugging Face model folder.
    Folder(HfFolder),
}

/// What `lmx export` was asked to do.
pub struct ExportRequest {
    /// The model to export.
    pub source: Source,
    /// The folder to write.
    pub out: PathBuf,
    /// The weights' dtype, `None` for the source's.
    pub dtype: Option<Dtype>,
    /// The largest shard, in bytes.
    pub max_shard_bytes: u64,
}

/// Runs `lmx export` over `registry`'s models.
pub fn run(args: ExportArgs, registry: &Registry) -> anyhow::Result<()> {
    // Before the model is read, so that a taken name costs nothing.
    lmx::runtime::checkpoint::atomic::refuse_taken(&args.out)?;
    let (model, source) = match (&args.run, &args.model) {
        (Some(dir), _) => {
            let run = RunFile::read(dir)?;
            let model = match resolve::resolve(registry, &run.model)? {
                Resolved::Registered(model) => model,
                // A run of a `.lmx` file this program does not hold: the program built for the
                // file exports it (or says why its model has no Hugging Face layout).
                Resolved::File(file) => return super::model_file::run_in_built_program(&file),
                Resolved::Folder(..) => anyhow::bail!(
                    "{}'s model {} is a folder, not a model: export the folder with --model",
                    dir.display(),
                    run.model
                ),
            };
            let source = Source::Run {
                dir: dir.clone(),
                run: Box::new(run),
                checkpoint: args.checkpoint.clone(),
            };
            (model, source)
        }
        (None, Some(name)) => match resolve::resolve(registry, name)? {
            Resolved::Folder(model, folder) => (model, Source::Folder(folder)),
            _ => {
                anyhow::bail!("--model {name}: give a Hugging Face model folder (with config.json)")
            }
        },
        (None, None) => {
            anyhow::bail!("give --run RUN (a run's checkpoint) or --model DIR (a folder)")
        }
    };
    model.export(ExportRequest {
        source,
        out: args.out,
        dtype: args.dtype.map(Dtype::from),
        max_shard_bytes: args.max_shard_size,
    })
}

/// The dtype a folder's `config.json` says its weights are in (`dtype`, or `torch_dtype`).
fn stored_dtype(folder: &HfFolder) -> Option<Dtype> {
    let config = folder.config();
    let name = config
        .get("dtype")
        .or_else(|| config.get("torch_dtype"))
        .and_then(serde_json::Value::as_str)?;
    match name {
        "float32" => Some(Dtype::Float32),
        "bfloat16" => Some(Dtype::Bfloat16),
        "float16" => Some(Dtype::Float16),
        _ => None,
    }
}

/// The settings a folder written from a run carries into its `config.json` (token ids): its
/// `--init` folder's `config.json`, or else the special tokens' ids of the tokenizer it was
/// trained with (a byte-level run's end of sequence is 256, not GPT-2's 50256, which
/// transformers assumes where `config.json` says nothing).
pub(super) fn source_config(
    dir: &std::path::Path,
    run: &RunFile,
) -> anyhow::Result<serde_json::Value> {
    if let Some(init) = &run.init {
        let text = std::fs::read_to_string(init.join(hf::CONFIG_FILE))
            .map_err(|err| anyhow::anyhow!("{}: {err}", init.display()))?;
        return Ok(serde_json::from_str(&text)?);
    }
    let tokenizer = run.tokenizer.load(dir)?;
    Ok(serde_json::json!({
        "bos_token_id": tokenizer.bos_id(),
        "eos_token_id": tokenizer.eos_id(),
    }))
}

/// The tokenizer files of a run: its `--init` folder's; a Hugging Face tokenizer file it was
/// trained with, written as `tokenizer.json` whatever its name, with the tokenizer's files beside
/// it ([`hf::tokenizer_side_files`]: its `tokenizer_config.json`, ...); or the BPE tokenizer
/// trained for it or the byte tokenizer written as one, each of these two with a
/// `tokenizer_config.json` ([`byte_level_config`]).
pub(super) fn run_tokenizer_files(
    dir: &std::path::Path,
    run: &RunFile,
) -> anyhow::Result<Vec<Carried>> {
    if let Some(init) = &run.init {
        return Ok(hf::carried_files(init));
    }
    let tokenizer = match &run.tokenizer {
        TokenizerSpec::HuggingFace { path, eos } => {
            let mut files = vec![Carried::Copy {
                from: path.clone(),
                name: TRAINED_FILE.to_owned(),
            }];
            let beside = path
                .parent()
                .map(hf::tokenizer_side_files)
                .unwrap_or_default();
            for file in beside {
                files.push(match eos {
                    Some(eos) => with_eos(file, eos)?,
                    None => file,
                });
            }
            return Ok(files);
        }
        TokenizerSpec::Bpe => Carried::Copy {
            from: dir.join(TRAINED_FILE),
            name: TRAINED_FILE.to_owned(),
        },
        TokenizerSpec::Byte => Carried::Text {
            name: TRAINED_FILE.to_owned(),
            text: HfTokenizer::bytes()?.to_json()?,
        },
    };
    Ok(vec![tokenizer, byte_level_config()])
}

/// `file` with the run's end-of-sequence token `eos` (its `--eos`) where the file names one (a
/// `tokenizer_config.json` or `special_tokens_map.json`'s `eos_token`), so that the folder's
/// tokenizer ends sequences where the run's did, as its `config.json` says.
fn with_eos(file: Carried, eos: &str) -> anyhow::Result<Carried> {
    // Only JSON files name tokens; a SentencePiece `tokenizer.model` is binary, never read here.
    let Carried::Copy { from, name } = &file else {
        return Ok(file);
    };
    if from.extension().is_none_or(|ext| ext != "json") {
        return Ok(file);
    }
    let place = |err: &dyn std::fmt::Display| anyhow::anyhow!("{}: {err}", from.display());
    let text = std::fs::read_to_string(from).map_err(|err| place(&err))?;
    let mut settings: serde_json::Value = serde_json::from_str(&text).map_err(|err| place(&err))?;
    let Some(object) = settings.as_object_mut() else {
        return Ok(file);
    };
    if !object.contains_key("eos_token") && name != hf::TOKENIZER_CONFIG_FILE {
        return Ok(file);
    }
    object.insert("eos_token".into(), eos.into());
    Ok(Carried::json(name.clone(), &settings))
}

/// The `tokenizer_config.json` of lmx's byte-level tokenizers (trained BPE, bytes): without it
/// transformers (and mlx-lm through it) picks the tokenizer's class from the model's type, and a
/// LLaMA's would add its own `<s>` and `</s>` past the vocabulary and begin every text with one;
/// with it the `tokenizer.json` is read as it is, [`BPE_EOS`] ending a sequence, no text
/// beginning with a token.
fn byte_level_config() -> Carried {
    let config = serde_json::json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": BPE_EOS,
        "bos_token": null,
        "unk_token": null,
        "add_bos_token": false,
        "add_eos_token": false,
        "clean_up_tokenization_spaces": false,
    });
    Carried::json(hf::TOKENIZER_CONFIG_FILE, &config)
}

/// Exports a model `M` as a Hugging Face folder.
pub fn export<M: LanguageModel>(request: ExportRequest) -> anyhow::Result<()> {
    let family = Family::of_model(M::NAME).ok_or_else(|| {
        anyhow::anyhow!(
            "{} has no Hugging Face layout; the families lmx writes are {}",
            M::NAME,
            FAMILIES.map(Family::model_type).join(", ")
        )
    })?;
    let (config, params, carry, source_dtype, source_config) = match &request.source {
        Source::Folder(folder) => {
            let dtype = request.dtype.or_else(|| stored_dtype(folder));
            let (config, params) = hf::load_model::<M>(folder, dtype)?;
            let source = Some(folder.config().clone());
            (config, params, folder.carried_files(), dtype, source)
        }
        Source::Run {
            dir,
            run,
            checkpoint,
        } => {
            let checkpoint = super::run_file::checkpoint_of(dir, checkpoint.clone())?;
            let (config, params) =
                super::run_file::read_model::<M>(run, dir, &checkpoint, "export")?;
            // The parameters' dtype: a packed weight's `uint32` is not it.
            let dtype = tree::flatten(&params)
                .iter()
                .map(|leaf| leaf.dtype())
                .find(|dtype| matches!(dtype, Dtype::Float32 | Dtype::Bfloat16 | Dtype::Float16));
            (
                config,
                params,
                run_tokenizer_files(dir, run)?,
                dtype,
                Some(source_config(dir, run)?),
            )
        }
    };
    let spec = hf::ExportSpec {
        lmx_config: &serde_json::to_value(&config)?,
        source_config: source_config.as_ref(),
        dtype: request.dtype.or(source_dtype).unwrap_or(Dtype::Float32),
        carry: &carry,
        max_shard_bytes: request.max_shard_bytes,
    };
    hf::export(&request.out, family, &params, &spec)?;
    println!("{}", request.out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn shard_sizes_read_as_transformers_reads_them() {
        assert_eq!(parse_size("5GB"), Ok(5_000_000_000));
        assert_eq!(parse_size("40KB"), Ok(40_000));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("1.5MB"), Ok(1_500_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(
            parse_size("5 parsecs"),
            Err("`5 parsecs`: the units are B, KB, MB, GB, KiB, MiB, GiB".into())
        );
        assert_eq!(
            parse_size("0MB"),
            Err("`0MB` is not a size of at least one byte".into())
        );
    }
}
