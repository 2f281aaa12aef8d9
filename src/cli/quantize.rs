//! `lmx quantize`: a model (a Hugging Face or mlx-lm folder, a run, or a run's checkpoint)
//! quantized as mlx-lm's `convert -q` does it and written in mlx-lm's layout, which both lmx
//! (`lmx generate --model DIR`) and mlx-lm load.

use super::run_file::RunFile;
use super::tokenizer::TRAINED_FILE;
use clap::Args;
use lmx::models::{
    deepseek_v2, gemma, gemma2, gemma3_text, gpt2, llama, mistral, mixtral, mpt, phi3, qwen2, qwen3,
};
use lmx::runtime::checkpoint::MODEL_FILE;
use lmx::runtime::hf::{self, Family, HfFolder, CONFIG_FILE};
use lmx::runtime::mlx_rs::Dtype;
use lmx::runtime::model::LanguageModel;
use lmx::runtime::quant::{self, Quantization};
use lmx::runtime::tree::{self, Tree};
use lmx::runtime::Array;
use std::path::{Path, PathBuf};

/// `lmx quantize`'s options.
#[derive(Args)]
pub struct QuantizeArgs {
    /// The model: a Hugging Face or mlx-lm folder (with config.json), a run directory (its
    /// latest checkpoint) or a run's checkpoint directory.
    #[arg(long)]
    pub model: PathBuf,
    /// Bits per weight: 2, 3, 4, 5, 6 or 8.
    #[arg(long, default_value_t = 4)]
    pub bits: i32,
    /// Weights per scale and offset: 32, 64 or 128.
    #[arg(long, default_value_t = 64)]
    pub group_size: i32,
    /// The folder to write: new, or empty.
    #[arg(long)]
    pub out: PathBuf,
    /// Write the model dequantized instead: every quantized layer's weights dense again (mlx-lm's
    /// `convert --dequantize`), `--bits` and `--group-size` unused.
    #[arg(long)]
    pub dequantize: bool,
    /// The dtype of the scales, offsets and the weights left unquantized: `float16` (as mlx-lm's
    /// models), `bfloat16` or `float32`.
    #[arg(long, default_value = "float16", value_parser = parse_dtype)]
    pub dtype: Dtype,
}

fn parse_dtype(text: &str) -> Result<Dtype, String> {
    match text {
        "float16" => Ok(Dtype::Float16),
        "bfloat16" => Ok(Dtype::Bfloat16),
        "float32" => Ok(Dtype::Float32),
        _ => Err(format!("`{text}`: give float16, bfloat16 or float32")),
    }
}

/// Where the model comes from.
enum Source {
    /// A model folder.
    Folder(HfFolder),
    /// A run's checkpoint: the run's record and directory, and the checkpoint directory.
    Checkpoint(Box<RunFile>, PathBuf, PathBuf),
}

impl Source {
    fn open(path: &Path) -> anyhow::Result<Source> {
        if path.join(CONFIG_FILE).exists() {
            return Ok(Source::Folder(HfFolder::open(path)?));
        }
        if path.join(super::run_file::RUN_FILE).exists() {
            let run = RunFile::read(path)?;
            let checkpoint = super::run_file::checkpoint_of(path, None)?;
            return Ok(Source::Checkpoint(
                Box::new(run),
                path.to_owned(),
                checkpoint,
            ));
        }
        // A checkpoint directory lies in RUN/checkpoints/.
        if let Some(run_dir) = path.parent().and_then(Path::parent) {
            if path.join(MODEL_FILE).exists() && run_dir.join(super::run_file::RUN_FILE).exists() {
                let run = RunFile::read(run_dir)?;
                return Ok(Source::Checkpoint(
                    Box::new(run),
                    run_dir.to_owned(),
                    path.to_owned(),
                ));
            }
        }
        anyhow::bail!(
            "--model {}: not a model folder (config.json), a run (run.json) or a run's checkpoint",
            path.display()
        )
    }

    fn model_name(&self) -> &str {
        match self {
            Source::Folder(folder) => folder.family().model_name(),
            Source::Checkpoint(run, _, _) => &run.model,
        }
    }
}

/// Runs `lmx quantize`.
pub fn run(args: QuantizeArgs) -> anyhow::Result<()> {
    let q = Quantization::new(args.group_size, args.bits)?;
    let source = Source::open(&args.model)?;
    let name = source.model_name().to_owned();
    // GPT-2's checkpoints store its Conv1D weights transposed ([in, out]), which a packed
    // weight cannot be: refused before any work rather than written wrong.
    if Family::of_model(&name) == Some(Family::Gpt2) {
        anyhow::bail!(
            "{name}: quantized GPT-2 models cannot be written in the Hugging Face layout yet"
        );
    }
    let request = Request {
        source,
        quantization: (!args.dequantize).then_some(q),
        out: &args.out,
        dtype: args.dtype,
    };
    match name.as_str() {
        gpt2::Gpt2::NAME => quantize::<gpt2::Gpt2>(request),
        llama::Llama::NAME => quantize::<llama::Llama>(request),
        gemma::Gemma::NAME => quantize::<gemma::Gemma>(request),
        mistral::Mistral::NAME => quantize::<mistral::Mistral>(request),
        mixtral::Mixtral::NAME => quantize::<mixtral::Mixtral>(request),
        mpt::Mpt::NAME => quantize::<mpt::Mpt>(request),
        qwen2::Qwen2::NAME => quantize::<qwen2::Qwen2>(request),
        qwen3::Qwen3::NAME => quantize::<qwen3::Qwen3>(request),
        gemma2::Gemma2::NAME => quantize::<gemma2::Gemma2>(request),
        gemma3_text::Gemma3Text::NAME => quantize::<gemma3_text::Gemma3Text>(request),
        phi3::Phi3::NAME => quantize::<phi3::Phi3>(request),
        deepseek_v2::DeepseekV2::NAME => quantize::<deepseek_v2::DeepseekV2>(request),
        other => anyhow::bail!("{other} models have no Hugging Face layout to write"),
    }
}

/// What to read, how to quantize it (`None`: dequantize) and where to write it.
struct Request<'a> {
    source: Source,
    quantization: Option<Quantization>,
    out: &'a Path,
    dtype: Dtype,
}

fn quantize<M: LanguageModel>(request: Request) -> anyhow::Result<()> {
    let Request {
        source,
        quantization,
        out,
        dtype,
    } = request;
    let source_config = match &source {
        Source::Folder(folder) => Some(folder.config().clone()),
        Source::Checkpoint(..) => None,
    };
    let (config, params, family, carried) = match source {
        Source::Folder(folder) => {
            let (config, params) = hf::load_model::<M>(&folder, Some(dtype))?;
            (config, params, folder.family(), folder.carried_files())
        }
        Source::Checkpoint(run, run_dir, checkpoint) => {
            let config: M::Config = serde_json::from_value(run.model_config.clone())?;
            M::validate(&config)?;
            let family = Family::of_model(M::NAME)
                .ok_or_else(|| anyhow::anyhow!("{} has no Hugging Face layout", M::NAME))?;
            super::run_file::refuse_adapters(&run, &run_dir, "quantize")?;
            let params = super::run_file::load_params::<M>(&run, &config, &checkpoint, None)?;
            let tokenizer = run_dir.join(TRAINED_FILE);
            let carried = if tokenizer.exists() {
                vec![tokenizer]
            } else {
                vec![]
            };
            (config, params, family, carried)
        }
    };
    // Cast first, as mlx-lm quantizes a model loaded in its dtype: the scales take that dtype.
    let cast = tree::flatten(&params)
        .iter()
        .map(|leaf| match leaf.dtype() {
            Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16 => leaf.as_dtype(dtype),
            _ => Ok(leaf.clone()),
        })
        .collect::<Result<Vec<Array>, _>>()?;
    let mut cast = cast.into_iter();
    let mut params = params.map_same(&mut |_| cast.next().expect("one array per leaf"));
    let before = quant::tree_bytes(&params);
    // What was done, said once the folder is written.
    let summary = match quantization {
        None => {
            let layers = quant::dequantize_tree(&mut params)?;
            format!(
                "{}: {} layers dequantized; {} -> {} bytes",
                out.display(),
                layers.len(),
                before,
                quant::tree_bytes(&params)
            )
        }
        Some(q) => {
            let report = quant::quantize_tree(&mut params, q)?;
            let after = quant::tree_bytes(&params);
            let count = quant::logical_parameter_count(&params);
            let experts = match report.experts {
                0 => String::new(),
                n => format!(" ({n} of them stacked experts)"),
            };
            let mut summary = format!(
                "{}: {} layers{experts} quantized to {} bits in groups of {}; {count} parameters, \
                 {before} -> {after} bytes ({:.3} bits per weight)",
                out.display(),
                report.quantized.len(),
                q.bits,
                q.group_size,
                after as f64 * 8.0 / count as f64,
            );
            if !report.skipped.is_empty() {
                summary.push_str(&format!(
                    "\nleft as they were (already quantized, or rows not divisible into groups \
                     of {}): {}",
                    q.group_size,
                    report.skipped.join(", ")
                ));
            }
            summary
        }
    };
    export(
        out,
        family,
        &config,
        source_config.as_ref(),
        &params,
        dtype,
        &carried,
    )?;
    println!("{summary}");
    Ok(())
}

/// Writes `params` (with `config`) as a Hugging Face folder in mlx-lm's layout, atomically,
/// keeping the source's token ids.
fn export<C: serde::Serialize, R: Tree<Array>>(
    out: &Path,
    family: Family,
    config: &C,
    source_config: Option<&serde_json::Value>,
    params: &R,
    dtype: Dtype,
    carried: &[PathBuf],
) -> anyhow::Result<()> {
    let lmx_config = serde_json::to_value(config)?;
    let spec = hf::ExportSpec {
        lmx_config: &lmx_config,
        source_config,
        dtype,
        copy: carried,
        max_shard_bytes: hf::DEFAULT_MAX_SHARD_BYTES,
    };
    hf::export(out, family, params, &spec)?;
    Ok(())
}
