//! `lmx quantize`: a model (a Hugging Face or mlx-lm folder, a run, or a run's checkpoint)
//! quantized as mlx-lm's `convert -q` does it. A model with a Hugging Face layout is written in
//! mlx-lm's (which both lmx, `lmx generate --model DIR`, and mlx-lm load; a dequantized GPT-2
//! goes back to its published checkpoints' layout, which transformers, mlx-lm and lmx load), with
//! the run's tokenizer files as `lmx export` writes them; a run of a model without one (a model
//! of one's own) becomes a new run directory whose checkpoint holds the packed weights and whose
//! record names them, which `lmx generate --run`, `serve`, `eval` and `lora --base` read as they
//! read any run.

use super::registry::Registry;
use super::resolve::{self, Resolved};
use super::run_file::RunFile;
use clap::Args;
use lmx::runtime::hf::{self, Family, HfFolder, CONFIG_FILE};
use lmx::runtime::mlx_rs::Dtype;
use lmx::runtime::model::LanguageModel;
use lmx::runtime::quant::{self, Quantization};
use lmx::runtime::train::Precision;
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
    /// The folder to write (new, or empty): a model folder in mlx-lm's layout, or, for a run of a
    /// model with no Hugging Face layout (one's own), a run directory.
    #[arg(long)]
    pub out: PathBuf,
    /// Write the model dequantized instead: every quantized layer's weights dense again (mlx-lm's
    /// `convert --dequantize`), `--bits` and `--group-size` unused.
    #[arg(long)]
    pub dequantize: bool,
    /// The dtype of the scales, offsets and the weights left unquantized: `float16` (as mlx-lm's
    /// models; a folder's default), `bfloat16` or `float32` (a run's default: its parameters'
    /// dtype; a run keeps float32 or bfloat16).
    #[arg(long, value_parser = parse_dtype)]
    pub dtype: Option<Dtype>,
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
pub enum Source {
    /// A model folder.
    Folder(HfFolder),
    /// A run's checkpoint.
    Checkpoint {
        /// The run's record.
        run: Box<RunFile>,
        /// The run directory.
        dir: PathBuf,
        /// The checkpoint directory.
        checkpoint: PathBuf,
    },
}

/// The run and checkpoint that `path` names: a run directory (its latest checkpoint) or a
/// checkpoint directory of one (`RUN/checkpoints/step-N`).
fn checkpoint_source(path: &Path) -> anyhow::Result<Source> {
    let Some((dir, checkpoint)) = super::run_file::run_checkpoint(path)? else {
        anyhow::bail!(
            "--model {}: not a model folder (config.json), a run (run.json) or a run's checkpoint",
            path.display()
        )
    };
    Ok(Source::Checkpoint {
        run: Box::new(RunFile::read(&dir)?),
        dir,
        checkpoint,
    })
}

/// What `lmx quantize` was asked to do.
pub struct QuantizeRequest {
    /// The model.
    pub source: Source,
    /// How to quantize it; `None` dequantizes it.
    pub quantization: Option<Quantization>,
    /// The folder to write.
    pub out: PathBuf,
    /// `--dtype`, `None` for the default of what is written.
    pub dtype: Option<Dtype>,
}

/// Runs `lmx quantize` over `registry`'s models.
pub fn run(args: QuantizeArgs, registry: &Registry) -> anyhow::Result<()> {
    let q = Quantization::new(args.group_size, args.bits)?;
    let path = args.model.to_string_lossy();
    let (model, source) = if args.model.join(CONFIG_FILE).exists() {
        // Opened as the folder it is, even where its path is also a registered model's name.
        let folder = HfFolder::open(&args.model)?;
        let name = folder.family().model_name();
        let model = registry.step(name).ok_or_else(|| {
            anyhow::anyhow!("{path} holds a {name} model, which this program does not register")
        })?;
        (model, Source::Folder(folder))
    } else {
        let source = checkpoint_source(&args.model)?;
        let Source::Checkpoint { run, dir, .. } = &source else {
            unreachable!("checkpoint_source gives checkpoints")
        };
        match resolve::resolve(registry, &run.model)? {
            Resolved::Registered(model) => (model, source),
            // A run of a `.lmx` file this program does not hold: the program built for the
            // file quantizes it.
            Resolved::File(file) => return super::model_file::run_in_built_program(&file),
            Resolved::Folder(..) => anyhow::bail!(
                "{}'s model {} is a folder, not a model: quantize the folder itself",
                dir.display(),
                run.model
            ),
        }
    };
    lmx::runtime::checkpoint::atomic::refuse_taken(&args.out)?;
    model.quantize(QuantizeRequest {
        source,
        quantization: (!args.dequantize).then_some(q),
        out: args.out,
        dtype: args.dtype,
    })
}

/// The Hugging Face layout `M`'s quantized weights can be written in (mlx-lm's): none for a model
/// of one's own.
fn writable_family<M: LanguageModel>() -> Option<Family> {
    Family::of_model(M::NAME)
}

/// Quantizes (or dequantizes) a model `M` as `request` says.
pub fn quantize<M: LanguageModel>(request: QuantizeRequest) -> anyhow::Result<()> {
    match (&request.source, writable_family::<M>()) {
        (Source::Checkpoint { .. }, None) => quantize_run::<M>(request),
        (_, Some(family)) => quantize_folder::<M>(request, family),
        (Source::Folder(folder), None) => anyhow::bail!(
            "{}: a {} model's quantized weights cannot be written in the Hugging Face layout \
             yet; a run of lmx's {} quantizes into a run directory (`lmx quantize --model RUN`)",
            folder.dir().display(),
            folder.family().model_type(),
            M::NAME
        ),
    }
}

/// `params` with every floating-point leaf cast to `dtype`: as mlx-lm quantizes a model loaded
/// in its dtype, the scales take that dtype.
fn cast_floats<R: Tree<Array>>(params: &R, dtype: Dtype) -> anyhow::Result<R> {
    let cast = tree::flatten(params)
        .iter()
        .map(|leaf| match leaf.dtype() {
            Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16 => leaf.as_dtype(dtype),
            _ => Ok(leaf.clone()),
        })
        .collect::<Result<Vec<Array>, _>>()?;
    let mut cast = cast.into_iter();
    Ok(params.map_same(&mut |_| cast.next().expect("one array per leaf")))
}

/// Quantizes (or dequantizes, `None`) `params` in place; what was done, for the summary.
fn apply<R: Tree<Array>>(
    params: &mut R,
    quantization: Option<Quantization>,
    out: &Path,
) -> anyhow::Result<String> {
    let before = quant::tree_bytes(params);
    let Some(q) = quantization else {
        let layers = quant::dequantize_tree(params)?;
        return Ok(format!(
            "{}: {} layers dequantized; {} -> {} bytes",
            out.display(),
            layers.len(),
            before,
            quant::tree_bytes(params)
        ));
    };
    let report = quant::quantize_tree(params, q)?;
    let after = quant::tree_bytes(params);
    let count = quant::logical_parameter_count(params);
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
            "\nleft as they were (already quantized, or rows not divisible into groups of {}): {}",
            q.group_size,
            report.skipped.join(", ")
        ));
    }
    Ok(summary)
}

/// A model with a Hugging Face layout, written as a folder in mlx-lm's layout.
fn quantize_folder<M: LanguageModel>(
    request: QuantizeRequest,
    family: Family,
) -> anyhow::Result<()> {
    let QuantizeRequest {
        source,
        quantization,
        out,
        dtype,
    } = request;
    let dtype = dtype.unwrap_or(Dtype::Float16);
    let (config, params, source_config, carried) = match source {
        Source::Folder(folder) => {
            let (config, params) = hf::load_model::<M>(&folder, Some(dtype))?;
            (
                config,
                params,
                Some(folder.config().clone()),
                folder.carried_files(),
            )
        }
        Source::Checkpoint {
            run,
            dir,
            checkpoint,
        } => {
            let (config, params) =
                super::run_file::read_model::<M>(&run, &dir, &checkpoint, "quantize")?;
            let carried = super::export::run_tokenizer_files(&dir, &run)?;
            let source = super::export::source_config(&dir, &run)?;
            (config, params, Some(source), carried)
        }
    };
    let mut params = cast_floats(&params, dtype)?;
    let summary = apply(&mut params, quantization, &out)?;
    let lmx_config = serde_json::to_value(&config)?;
    let spec = hf::ExportSpec {
        lmx_config: &lmx_config,
        source_config: source_config.as_ref(),
        dtype,
        carry: &carried,
        max_shard_bytes: hf::DEFAULT_MAX_SHARD_BYTES,
    };
    hf::export(&out, family, &params, &spec)?;
    println!("{summary}");
    Ok(())
}

/// A run of a model without a Hugging Face layout, written as a new run directory: the packed
/// weights in a checkpoint named as the source's, their layout in the record.
fn quantize_run<M: LanguageModel>(request: QuantizeRequest) -> anyhow::Result<()> {
    let QuantizeRequest {
        source,
        quantization,
        out,
        dtype,
    } = request;
    let Source::Checkpoint {
        run,
        dir,
        checkpoint,
    } = source
    else {
        unreachable!("a folder has a Hugging Face layout")
    };
    let precision = match (dtype, run.train.precision) {
        (None, precision) => precision,
        (Some(Dtype::Float32), Precision::Mixed) => Precision::Mixed,
        (Some(Dtype::Float32), _) => Precision::Float32,
        (Some(Dtype::Bfloat16), _) => Precision::Bfloat16,
        (Some(_), _) => anyhow::bail!(
            "--dtype float16: a run keeps its parameters in float32 or bfloat16 (float16 is for \
             model folders)"
        ),
    };
    let (_, params) = super::run_file::read_model::<M>(&run, &dir, &checkpoint, "quantize")?;
    let mut params = cast_floats(&params, precision.dtype())?;
    let summary = apply(&mut params, quantization, &out)?;
    // The checkpoint holds the whole model: the run no longer reads its `--init` folder, whose
    // layout (packed or not) is not the checkpoint's.
    let mut record = RunFile {
        quantization: quant::layout::record(&params),
        init: None,
        init_weights: None,
        ..*run
    };
    record.train.precision = precision;
    super::derived_run::write(&out, &dir, &record, &checkpoint, &params)?;
    println!("{summary}");
    println!(
        "a run directory: `lmx generate --run {0}` samples it, `lmx lora --base {0}` trains \
         adapters over it",
        out.display()
    );
    Ok(())
}
