//! `lmx bench generate`: generation speed of the bundled GPT-2 and LLaMA (random weights, greedy
//! decoding through `lmx_runtime::generate::generate`, or `BatchGenerator` for a batch above 1,
//! optionally quantized), side by side with an anchor at the same sizes, the two runs
//! alternating: mlx-lm's own `stream_generate` and `batch_generate` (`bench/generate_mlx_lm.py`)
//! or the mlx-lm-style Python MLX loop (`bench/generate_anchor.py`, batch 1 unquantized only).

use lmx::models::{gpt2, llama};
use lmx::runtime::data::rng::SplitMix64;
use lmx::runtime::generate::{
    generate, speculative_generate, BatchGenerator, BatchLimits, Models, Request, Sampling,
};
use lmx::runtime::model::LanguageModel;
use lmx::runtime::nn::Quantization;
use lmx::runtime::quant;
use lmx::runtime::train::Precision;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use super::anchor::{device_name, json_lines_last_first, output_of};

/// What to measure.
#[derive(clap::Args)]
pub struct GenerateBenchArgs {
    /// Models: gpt2, llama.
    #[arg(long, value_delimiter = ',', default_value = "gpt2,llama")]
    pub models: Vec<String>,
    /// The preset of models/gpt2.lmx.
    #[arg(long, default_value = "124m")]
    pub gpt2_preset: String,
    /// The preset of models/llama.lmx.
    #[arg(long, default_value = "tiny")]
    pub llama_preset: String,
    /// Precisions: float32, bfloat16.
    #[arg(long, value_delimiter = ',', default_value = "float32")]
    pub dtypes: Vec<String>,
    /// Sequences decoded together (each a row of the table; above 1 through `BatchGenerator`).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub batch: Vec<usize>,
    /// Quantize the weights to this many bits (group size 64), as `lmx quantize` does.
    #[arg(long)]
    pub bits: Option<i32>,
    /// Prompt tokens (random).
    #[arg(long, default_value_t = 128)]
    pub prompt: usize,
    /// Tokens to generate.
    #[arg(long, default_value_t = 128)]
    pub tokens: usize,
    /// Timed generations of each implementation (after one untimed warm-up); medians are reported.
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// The Python MLX anchor script (bench/generate_anchor.py), run after each timed lmx run.
    #[arg(long)]
    pub anchor: Option<PathBuf>,
    /// The Python interpreter for the anchor.
    #[arg(long, default_value = "python3")]
    pub python: String,
    /// Also write the rows as JSON lines here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Decode speculatively (batch 1), drafted by the model's first N layers with its embedding,
    /// final norm and head: a truncated copy of the model, the same tokenizer by construction (with
    /// random weights, the only kind of draft that agrees with the model often enough to
    /// measure). The anchor, when given, decodes without a draft.
    #[arg(long, value_name = "N")]
    pub draft_layers: Option<usize>,
    /// With --draft-layers: tokens the draft proposes at a time.
    #[arg(long, default_value_t = 4)]
    pub draft_tokens: usize,
}

/// One measurement (medians over the repeats), with the anchor's JSON fields.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Row {
    /// `lmx`, or the anchor's own name (`mlx-lm`, `python-mlx`).
    #[serde(rename = "impl")]
    pub implementation: String,
    /// `gpt2` or `llama`.
    pub model: String,
    /// The lmx preset whose sizes both implementations use.
    #[serde(default)]
    pub preset: String,
    /// Prompt tokens.
    pub prompt: usize,
    /// Generated tokens.
    pub tokens: usize,
    /// float32 or bfloat16.
    pub dtype: String,
    /// Sequences decoded together.
    #[serde(default = "one")]
    pub batch: usize,
    /// Bits of the quantized weights (none: unquantized).
    #[serde(default)]
    pub bits: Option<i32>,
    /// Prompt tokens per second: the prompt's forward pass and the first token.
    pub prompt_tokens_per_s: f64,
    /// Generated tokens per second after the first.
    pub decode_tokens_per_s: f64,
    /// The device.
    #[serde(default)]
    pub device: String,
    /// Prompt tokens per second of each timed run, in order.
    #[serde(default)]
    pub prompt_runs: Vec<f64>,
    /// Decode tokens per second of each timed run, in order.
    #[serde(default)]
    pub decode_runs: Vec<f64>,
    /// Layers of the speculative draft (none: no draft).
    #[serde(default)]
    pub draft_layers: Option<usize>,
    /// The share of drafted tokens the model kept, over the timed runs.
    #[serde(default)]
    pub acceptance: Option<f64>,
}

fn one() -> usize {
    1
}

/// The model sizes the anchor takes as flags, read from an lmx configuration.
struct Sizes {
    dim: i64,
    layers: i64,
    heads: i64,
    kv_heads: i64,
    hidden: i64,
    vocab: i64,
    ctx: i64,
}

impl Sizes {
    fn gpt2(config: &gpt2::Config) -> anyhow::Result<Sizes> {
        anyhow::ensure!(
            config.eps == 1e-5,
            "the anchor's GPT-2 normalises with eps 1e-5, the preset with {}",
            config.eps
        );
        Ok(Sizes {
            dim: config.d_model,
            layers: config.n_layers,
            heads: config.n_heads,
            kv_heads: config.n_heads,
            hidden: config.d_ff(),
            vocab: config.vocab,
            ctx: config.ctx,
        })
    }

    fn llama(config: &llama::Config) -> anyhow::Result<Sizes> {
        anyhow::ensure!(
            config.rope_base == 10000.0 && config.eps == 1e-5,
            "the anchor's LLaMA has rope base 10000 and eps 1e-5, the preset {} and {}",
            config.rope_base,
            config.eps
        );
        Ok(Sizes {
            dim: config.d_model,
            layers: config.n_layers,
            heads: config.n_heads,
            kv_heads: config.n_kv_heads,
            hidden: config.d_ff,
            vocab: config.vocab,
            ctx: config.ctx,
        })
    }

    /// The anchor's flags for these sizes.
    fn flags(&self) -> Vec<String> {
        [
            ("--dim", self.dim),
            ("--layers", self.layers),
            ("--heads", self.heads),
            ("--kv-heads", self.kv_heads),
            ("--hidden", self.hidden),
            ("--vocab", self.vocab),
            ("--ctx", self.ctx),
        ]
        .into_iter()
        .flat_map(|(flag, value)| [flag.to_string(), value.to_string()])
        .collect()
    }
}

/// One model at one precision: which, at which sizes.
struct Case<'a> {
    model: &'a str,
    preset: &'a str,
    dtype: &'a str,
    precision: Precision,
    batch: usize,
    sizes: Sizes,
}

/// Runs every model at every precision, the anchor alternating with lmx when asked, and prints
/// the table.
pub fn bench(args: &GenerateBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.prompt > 0 && args.tokens > 0 && args.repeats > 0 && !args.batch.contains(&0),
        "--prompt, --tokens, --repeats and --batch must be at least 1"
    );
    let mut rows = Vec::new();
    for model in &args.models {
        for (dtype, &batch) in args
            .dtypes
            .iter()
            .flat_map(|dtype| args.batch.iter().map(move |batch| (dtype, batch)))
        {
            let precision = match dtype.as_str() {
                "float32" => Precision::Float32,
                "bfloat16" => Precision::Bfloat16,
                other => anyhow::bail!("unknown dtype `{other}`: use float32 or bfloat16"),
            };
            let row = match model.as_str() {
                "gpt2" => {
                    let config = preset::<gpt2::Gpt2>(&args.gpt2_preset)?;
                    let case = Case {
                        model,
                        preset: &args.gpt2_preset,
                        dtype,
                        precision,
                        batch,
                        sizes: Sizes::gpt2(&config)?,
                    };
                    measure::<gpt2::Gpt2>(args, &case, &config, |params, config, layers| {
                        let mut params = params.clone();
                        params.h.truncate(layers);
                        let config = gpt2::Config {
                            n_layers: layers as i64,
                            ..config.clone()
                        };
                        (params, config)
                    })?
                }
                "llama" => {
                    let config = preset::<llama::Llama>(&args.llama_preset)?;
                    let case = Case {
                        model,
                        preset: &args.llama_preset,
                        dtype,
                        precision,
                        batch,
                        sizes: Sizes::llama(&config)?,
                    };
                    measure::<llama::Llama>(args, &case, &config, |params, config, layers| {
                        let mut params = params.clone();
                        params.model.layers.truncate(layers);
                        let config = llama::Config {
                            n_layers: layers as i64,
                            ..config.clone()
                        };
                        (params, config)
                    })?
                }
                other => anyhow::bail!("unknown model `{other}`: use gpt2 or llama"),
            };
            rows.push(row);
        }
    }
    if let Some(path) = &args.json {
        let lines: Vec<String> = rows
            .iter()
            .flat_map(|(ours, anchor)| std::iter::once(ours).chain(anchor))
            .map(serde_json::to_string)
            .collect::<Result<_, _>>()?;
        std::fs::write(path, lines.join("\n") + "\n")
            .map_err(|err| anyhow::anyhow!("{}: {err}", path.display()))?;
    }
    print_table(&rows);
    Ok(())
}

/// `M`'s preset `name`.
fn preset<M: LanguageModel>(name: &str) -> anyhow::Result<M::Config> {
    M::preset(name).ok_or_else(|| {
        anyhow::anyhow!(
            "models/{}.lmx has no preset `{name}` (it has {})",
            M::NAME,
            M::presets().join(", ")
        )
    })
}

/// One row of lmx and, with `--anchor`, one of the anchor: a warm-up generation, then the timed
/// generations of lmx, each followed by one run of the anchor; medians of each.
/// `truncate` makes the draft of `--draft-layers` from the (cast, quantized) model.
fn measure<M: LanguageModel>(
    args: &GenerateBenchArgs,
    case: &Case<'_>,
    config: &M::Config,
    truncate: impl Fn(&M::Params, &M::Config, usize) -> (M::Params, M::Config),
) -> anyhow::Result<(Row, Option<Row>)> {
    anyhow::ensure!(
        args.draft_layers.is_none() || case.batch == 1 && args.draft_tokens > 0,
        "--draft-layers decodes one sequence (--batch 1), drafting at least one token at a time"
    );
    anyhow::ensure!(
        args.prompt + args.tokens <= M::context_len(config),
        "{} at {}: {} prompt and {} generated tokens do not fit its context of {}",
        case.model,
        case.preset,
        args.prompt,
        args.tokens,
        M::context_len(config)
    );
    let mut params = case.precision.cast(&M::init(config, 0)?)?;
    if let Some(bits) = args.bits {
        quant::quantize_tree(
            &mut params,
            Quantization {
                group_size: 64,
                bits,
            },
        )?;
    }
    let vocab = M::vocab_size(config) as u64;
    let mut rng = SplitMix64::new(0);
    let prompts: Vec<Vec<u32>> = (0..case.batch)
        .map(|_| (0..args.prompt).map(|_| rng.below(vocab) as u32).collect())
        .collect();
    let sampling = Sampling {
        temperature: 0.0,
        top_k: None,
        max_tokens: args.tokens,
        ..Sampling::default()
    };
    let draft = args
        .draft_layers
        .map(|layers| truncate(&params, config, layers));
    let drafted = std::cell::Cell::new((0usize, 0usize));
    let run = || -> anyhow::Result<(f64, f64)> {
        if case.batch > 1 {
            return batched::<M>(&params, config, &prompts, &sampling);
        }
        let generation = match &draft {
            Some((draft_params, draft_config)) => {
                let models = Models::<M, M> {
                    target: (&params, config),
                    draft: (draft_params, draft_config),
                };
                let speculation = speculative_generate(
                    models,
                    &prompts[0],
                    &sampling,
                    args.draft_tokens,
                    None,
                    |_| (),
                )?;
                let (kept, proposed) = drafted.get();
                drafted.set((kept + speculation.accepted, proposed + speculation.drafted));
                speculation.generation
            }
            None => generate::<M>(&params, config, &prompts[0], &sampling, None, |_| ())?,
        };
        anyhow::ensure!(
            generation.tokens.len() == args.tokens,
            "lmx generated {} tokens, not {}",
            generation.tokens.len(),
            args.tokens
        );
        Ok((
            generation.prompt_tokens_per_s,
            generation.decode_tokens_per_s,
        ))
    };
    run()?;
    drafted.set((0, 0));
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    let mut anchor_name = String::from("python-mlx");
    for _ in 0..args.repeats {
        ours.push(run()?);
        if let Some(script) = &args.anchor {
            let (prompt, decode, name) = anchor(args, script, case)?;
            theirs.push((prompt, decode));
            anchor_name = name;
        }
    }
    let row = |implementation: &str, samples: &[(f64, f64)]| Row {
        implementation: implementation.into(),
        model: case.model.into(),
        preset: case.preset.into(),
        prompt: args.prompt,
        tokens: args.tokens,
        dtype: case.dtype.into(),
        batch: case.batch,
        bits: args.bits,
        prompt_tokens_per_s: median(samples.iter().map(|sample| sample.0)),
        decode_tokens_per_s: median(samples.iter().map(|sample| sample.1)),
        device: device_name().into(),
        prompt_runs: samples.iter().map(|sample| sample.0).collect(),
        decode_runs: samples.iter().map(|sample| sample.1).collect(),
        draft_layers: None,
        acceptance: None,
    };
    let (kept, proposed) = drafted.get();
    let ours = Row {
        draft_layers: args.draft_layers,
        acceptance: args
            .draft_layers
            .map(|_| kept as f64 / proposed.max(1) as f64),
        ..row("lmx", &ours)
    };
    eprintln!("{}", serde_json::to_string(&ours)?);
    let theirs = (!theirs.is_empty()).then(|| row(&anchor_name, &theirs));
    if let Some(theirs) = &theirs {
        eprintln!("{}", serde_json::to_string(theirs)?);
    }
    Ok((ours, theirs))
}

/// Every prompt decoded together through a `BatchGenerator`: prompt tokens per second over the
/// first step (every prompt fed, every first token read), decode tokens per second over the
/// tokens of the remaining steps.
fn batched<M: LanguageModel>(
    params: &M::Params,
    config: &M::Config,
    prompts: &[Vec<u32>],
    sampling: &Sampling,
) -> anyhow::Result<(f64, f64)> {
    let limits = BatchLimits {
        max_batch: prompts.len(),
        ..BatchLimits::default()
    };
    let mut generator = BatchGenerator::<M>::new(params.clone(), config.clone(), limits)?;
    for prompt in prompts {
        generator.insert(Request {
            prompt: prompt.clone(),
            sampling: sampling.clone(),
            stop_tokens: Vec::new(),
        })?;
    }
    let started = Instant::now();
    let first = generator.step()?.len();
    let prompt_seconds = started.elapsed().as_secs_f64();
    let decode_started = Instant::now();
    let mut decoded = 0;
    while generator.active() > 0 {
        decoded += generator.step()?.len();
    }
    let decode_seconds = decode_started.elapsed().as_secs_f64();
    anyhow::ensure!(
        first + decoded == prompts.len() * sampling.max_tokens,
        "lmx generated {} tokens, not {}",
        first + decoded,
        prompts.len() * sampling.max_tokens
    );
    let prompt_tokens: usize = prompts.iter().map(Vec::len).sum();
    Ok((
        prompt_tokens as f64 / prompt_seconds.max(f64::MIN_POSITIVE),
        decoded as f64 / decode_seconds.max(f64::MIN_POSITIVE),
    ))
}

/// The median of `values` (the mean of the middle two for an even count).
fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    if values.len() % 2 == 1 {
        values[middle]
    } else {
        (values[middle - 1] + values[middle]) / 2.0
    }
}

/// One run of the anchor (its own warm-up and one timed generation) at `case`'s sizes, with the
/// same BLAS as this process on the CPU: its prompt and decode tokens per second, and its name.
fn anchor(
    args: &GenerateBenchArgs,
    script: &Path,
    case: &Case<'_>,
) -> anyhow::Result<(f64, f64, String)> {
    let mut command = Command::new(&args.python);
    command
        .arg(script)
        .args(["--model", case.model])
        .args(case.sizes.flags())
        .args(["--prompt", &args.prompt.to_string()])
        .args(["--tokens", &args.tokens.to_string()])
        .args(["--dtype", case.dtype])
        .args(["--device", device_name()]);
    // Only mlx-lm's anchor takes these; the plain one runs batch 1, unquantized.
    if case.batch > 1 {
        command.args(["--batch", &case.batch.to_string()]);
    }
    if let Some(bits) = args.bits {
        command.args(["--bits", &bits.to_string()]);
    }
    let stdout = output_of(command, &script.display().to_string())?;
    let line = json_lines_last_first(&stdout)
        .next()
        .ok_or_else(|| anyhow::anyhow!("the anchor printed no JSON:\n{stdout}"))?;
    let row: Row = serde_json::from_str(line)
        .map_err(|err| anyhow::anyhow!("the anchor's line `{line}`: {err}"))?;
    Ok((
        row.prompt_tokens_per_s,
        row.decode_tokens_per_s,
        row.implementation,
    ))
}

fn print_table(rows: &[(Row, Option<Row>)]) {
    println!(
        "{:<6} {:<7} {:<9} {:>5} {:>4} {:>14} {:>14} {:>7} {:>14} {:>14} {:>7}",
        "model",
        "preset",
        "dtype",
        "batch",
        "bits",
        "lmx prompt t/s",
        "anchor prompt",
        "ratio",
        "lmx decode t/s",
        "anchor decode",
        "ratio"
    );
    let cell = |anchor: Option<f64>, ours: f64| match anchor {
        Some(anchor) => (format!("{anchor:.1}"), format!("{:.2}x", ours / anchor)),
        None => ("-".into(), "-".into()),
    };
    for (ours, anchor) in rows {
        let (prompt, prompt_ratio) = cell(
            anchor.as_ref().map(|row| row.prompt_tokens_per_s),
            ours.prompt_tokens_per_s,
        );
        let (decode, decode_ratio) = cell(
            anchor.as_ref().map(|row| row.decode_tokens_per_s),
            ours.decode_tokens_per_s,
        );
        println!(
            "{:<6} {:<7} {:<9} {:>5} {:>4} {:>14.1} {:>14} {:>7} {:>14.1} {:>14} {:>7}",
            ours.model,
            ours.preset,
            ours.dtype,
            ours.batch,
            ours.bits.map_or("-".into(), |bits| bits.to_string()),
            ours.prompt_tokens_per_s,
            prompt,
            prompt_ratio,
            ours.decode_tokens_per_s,
            decode,
            decode_ratio
        );
        if let (Some(layers), Some(acceptance)) = (ours.draft_layers, ours.acceptance) {
            println!(
                "       speculative: drafted by the first {layers} layers, {:.1}% of the drafted \
                 tokens kept",
                100.0 * acceptance
            );
        }
    }
}
