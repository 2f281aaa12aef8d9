//! `lmx bench train`: the reference GPT (models/gpt2.lmx at the anchors' four configs) trained through
//! the real trainer, side by side with the Python MLX anchor in the same invocation.

use lmx::models::gpt2;
use lmx::runtime::data::{rng::SplitMix64, Windows};
use lmx::runtime::device::{default_kind, DeviceKind};
use lmx::runtime::model::LanguageModel;
use lmx::runtime::schedule::Schedule;
use lmx::runtime::train::{Callback, Control, Precision, StepReport, TrainConfig, Trainer};
use lmx::runtime::{platform, Result as RuntimeResult};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

/// What to measure.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// Anchor configs: tiny, small, medium, gpt2.
    #[arg(long, value_delimiter = ',', default_value = "tiny,small,medium")]
    pub configs: Vec<String>,
    /// Modes: compiled, eager.
    #[arg(long, value_delimiter = ',', default_value = "compiled,eager")]
    pub modes: Vec<String>,
    /// Precisions: float32, bfloat16.
    #[arg(long, value_delimiter = ',', default_value = "float32")]
    pub dtypes: Vec<String>,
    /// Sequences per step.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 256)]
    pub seq: usize,
    /// Timed steps.
    #[arg(long, default_value_t = 20)]
    pub steps: u64,
    /// Untimed steps first (compilation, caches).
    #[arg(long, default_value_t = 5)]
    pub warmup: u64,
    /// Peak device TFLOP/s for MFU (989: an H100's or H200's dense bf16).
    #[arg(long, default_value_t = 989.0)]
    pub peak_tflops: f64,
    /// The Python MLX anchor script (shared/bench/anchor_mlx.py) to run beside each row.
    #[arg(long)]
    pub anchor: Option<PathBuf>,
    /// The Python interpreter for the anchor.
    #[arg(long, default_value = "python3")]
    pub python: String,
    /// Also write the rows as JSON lines here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// One measurement, with the anchors' JSON fields.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Row {
    /// `lmx` or `python-mlx`.
    #[serde(rename = "impl")]
    pub implementation: String,
    /// The device.
    pub device: String,
    /// The anchor config.
    pub config: String,
    /// Sequences per step.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq: usize,
    /// float32 or bfloat16.
    pub dtype: String,
    /// Compiled step.
    pub compile: bool,
    /// Parameters.
    pub params: u64,
    /// Median milliseconds per step.
    pub median_ms: f64,
    /// Tokens per second at the median.
    pub tokens_per_s: f64,
    /// Model FLOPs utilisation (6N + 12LdT per token) against the peak.
    pub mfu: f64,
    /// The first step's loss.
    pub loss_first: f64,
    /// The last step's loss.
    pub loss_last: f64,
    /// Peak memory in MiB, where measured.
    #[serde(default)]
    pub peak_mib: Option<f64>,
}

/// Runs every row, the anchor beside each when asked, and prints the table.
pub fn bench(args: &BenchArgs) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    for config in &args.configs {
        for dtype in &args.dtypes {
            for mode in &args.modes {
                let compile = match mode.as_str() {
                    "compiled" => true,
                    "eager" => false,
                    other => anyhow::bail!("unknown mode `{other}`: use compiled or eager"),
                };
                let ours = measure(args, config, dtype, compile)?;
                eprintln!("{}", serde_json::to_string(&ours)?);
                let anchor = match &args.anchor {
                    Some(script) => {
                        let row = anchor(args, script, config, dtype, compile)?;
                        eprintln!("{}", serde_json::to_string(&row)?);
                        Some(row)
                    }
                    None => None,
                };
                rows.push((ours, anchor));
            }
        }
    }
    if let Some(path) = &args.json {
        let lines: Vec<String> = rows
            .iter()
            .flat_map(|(ours, anchor)| std::iter::once(ours).chain(anchor))
            .map(serde_json::to_string)
            .collect::<Result<_, _>>()?;
        std::fs::write(path, lines.join("\n") + "\n")?;
    }
    print_table(&rows);
    Ok(())
}

/// Collects the step reports of a run.
struct Collect(Arc<Mutex<Vec<StepReport>>>);

impl Callback for Collect {
    fn on_step(&mut self, report: &StepReport) -> RuntimeResult<Control> {
        self.0.lock().expect("not poisoned").push(report.clone());
        Ok(Control::Continue)
    }
}

/// One row of lmx: the anchor's model and data shapes, through `Trainer`.
fn measure(args: &BenchArgs, name: &str, dtype: &str, compile: bool) -> anyhow::Result<Row> {
    let mut config = gpt2::Config::preset(name)
        .ok_or_else(|| anyhow::anyhow!("models/gpt2.lmx has no preset `{name}`"))?;
    // The anchor's positional table is as long as the run's sequences.
    config.ctx = args.seq as _;
    let precision = match dtype {
        "float32" => Precision::Float32,
        "bfloat16" => Precision::Bfloat16,
        other => anyhow::bail!("unknown dtype `{other}`: use float32 or bfloat16"),
    };
    let vocab = gpt2::Gpt2::vocab_size(&config) as u64;
    let mut rng = SplitMix64::new(0);
    // One batch of random tokens, drawn once, as the anchor does.
    let tokens: Vec<u32> = (0..args.batch * args.seq + 1)
        .map(|_| rng.below(vocab) as u32)
        .collect();
    let windows = Windows::new(Arc::new(tokens), args.seq)?;
    let out_dir = std::env::temp_dir().join(format!("lmx-bench-{}", std::process::id()));
    let train = TrainConfig {
        steps: args.warmup + args.steps,
        batch_size: args.batch,
        seq_len: args.seq,
        schedule: Schedule::Constant {
            lr: 3e-4,
            warmup_steps: 0,
        },
        compile,
        precision,
        validation_fraction: 0.0,
        eval_every: 0,
        out_dir: out_dir.clone(),
        peak_tflops: args.peak_tflops,
        ..TrainConfig::default()
    };
    mlx_rs::memory::reset_peak_memory()?;
    let reports = Arc::new(Mutex::new(Vec::new()));
    let mut trainer = Trainer::<gpt2::Train>::new(config.clone(), train, windows)?;
    trainer.add_callback(Collect(reports.clone()));
    trainer.run()?;
    let peak = mlx_rs::memory::peak_memory()? as f64 / (1024.0 * 1024.0);
    let _ = std::fs::remove_dir_all(&out_dir);
    let params = count(&trainer.state().params);
    let reports = reports.lock().expect("not poisoned").clone();
    let mut times: Vec<f64> = reports[args.warmup as usize..]
        .iter()
        .map(|report| (args.batch * args.seq) as f64 / report.tokens_per_s * 1e3)
        .collect();
    times.sort_by(f64::total_cmp);
    let median_ms = times[times.len() / 2];
    let tokens_per_s = (args.batch * args.seq) as f64 / (median_ms / 1e3);
    let flops_per_token = 6.0 * params as f64
        + 12.0 * (config.n_layers as f64) * (config.d_model as f64) * args.seq as f64;
    Ok(Row {
        implementation: "lmx".into(),
        device: device_name(),
        config: name.into(),
        batch: args.batch,
        seq: args.seq,
        dtype: dtype.into(),
        compile,
        params,
        median_ms,
        tokens_per_s,
        mfu: flops_per_token * tokens_per_s / (args.peak_tflops * 1e12),
        loss_first: reports
            .first()
            .map_or(f64::NAN, |report| report.loss as f64),
        loss_last: reports.last().map_or(f64::NAN, |report| report.loss as f64),
        peak_mib: Some(peak),
    })
}

fn count(params: &gpt2::Params) -> u64 {
    let mut total = 0;
    lmx::runtime::tree::Tree::for_each(params, &mut |leaf: &mlx_rs::Array| {
        total += leaf.size() as u64
    });
    total
}

fn device_name() -> String {
    match default_kind() {
        Ok(DeviceKind::Gpu) => "gpu".into(),
        _ => "cpu".into(),
    }
}

/// One row of the Python MLX anchor, with the same BLAS as this process on the CPU.
fn anchor(
    args: &BenchArgs,
    script: &Path,
    config: &str,
    dtype: &str,
    compile: bool,
) -> anyhow::Result<Row> {
    let mut command = Command::new(&args.python);
    command.arg(script).args([
        "--config",
        config,
        "--batch",
        &args.batch.to_string(),
        "--seq",
        &args.seq.to_string(),
        "--steps",
        &args.steps.to_string(),
        "--warmup",
        &args.warmup.to_string(),
        "--compile",
        if compile { "1" } else { "0" },
        "--dtype",
        dtype,
        "--device",
        &device_name(),
        "--peak_tflops",
        &args.peak_tflops.to_string(),
    ]);
    if device_name() == "cpu" {
        if let Some(blas) = platform::blas_library() {
            command.env("LD_PRELOAD", blas);
        }
    }
    let output = command
        .output()
        .map_err(|err| anyhow::anyhow!("cannot run {}: {err}", args.python))?;
    if !output.status.success() {
        anyhow::bail!(
            "the anchor failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|line| line.starts_with('{'))
        .ok_or_else(|| anyhow::anyhow!("the anchor printed no JSON"))?;
    let mut row: Row = serde_json::from_str(line)?;
    row.device = device_name();
    Ok(row)
}

fn print_table(rows: &[(Row, Option<Row>)]) {
    println!(
        "{:<8} {:<9} {:<9} {:>10} {:>12} {:>8} {:>12} {:>7} {:>17} {:>10}",
        "config",
        "mode",
        "dtype",
        "lmx ms",
        "anchor ms",
        "speedup",
        "lmx tok/s",
        "MFU",
        "loss first→last",
        "peak MiB"
    );
    for (ours, anchor) in rows {
        let (anchor_ms, speedup) = match anchor {
            Some(anchor) => (
                format!("{:.3}", anchor.median_ms),
                format!("{:.2}x", anchor.median_ms / ours.median_ms),
            ),
            None => ("-".into(), "-".into()),
        };
        println!(
            "{:<8} {:<9} {:<9} {:>10.3} {:>12} {:>8} {:>12.0} {:>6.1}% {:>8.3}→{:<8.3} {:>10.1}",
            ours.config,
            if ours.compile { "compiled" } else { "eager" },
            ours.dtype,
            ours.median_ms,
            anchor_ms,
            speedup,
            ours.tokens_per_s,
            ours.mfu * 100.0,
            ours.loss_first,
            ours.loss_last,
            ours.peak_mib.unwrap_or(f64::NAN)
        );
    }
}
