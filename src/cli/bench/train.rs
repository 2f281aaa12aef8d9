//! `lmx bench train`: the reference GPT (models/gpt2.lmx at the anchors' four configs) trained through
//! the real trainer, side by side with the Python MLX anchor in the same invocation.

use lmx::models::gpt2;
use lmx::runtime::data::{rng::SplitMix64, Windows};
use lmx::runtime::model::LanguageModel;
use lmx::runtime::optim::DecayScope;
use lmx::runtime::schedule::Schedule;
use lmx::runtime::train::{Callback, Control, Precision, StepReport, TrainConfig, Trainer};
use lmx::runtime::Result as RuntimeResult;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use super::anchor::{device_name, json_lines_last_first, output_of};
use super::report;
use crate::cli::{OverlapArg, StatePackingArg};

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
    /// The Python MLX anchor script (shared/bench/anchor_mlx.py) to run beside each row; with
    /// --same-init, bench/anchor_same_init.py.
    #[arg(long)]
    pub anchor: Option<PathBuf>,
    /// Start the anchor from lmx's initial parameters and train it on lmx's batch, then show both
    /// loss curves step by step (every step, the warm-up's too) with their relative difference.
    #[arg(long, requires = "anchor")]
    pub same_init: bool,
    /// The Python interpreter for the anchor.
    #[arg(long, default_value = "python3")]
    pub python: String,
    /// How far lmx's host work runs ahead of the device (`off` runs one step at a time, as the
    /// anchor does).
    #[arg(long, value_enum, default_value = "submit")]
    pub overlap: OverlapArg,
    /// How lmx lays out the step's state (`auto`: flat on a CUDA GPU).
    #[arg(long, value_enum, default_value = "auto")]
    pub state_packing: StatePackingArg,
    /// Runs of each row, alternating lmx and the anchor; the table shows the median run.
    #[arg(long, default_value_t = 1)]
    pub repeats: usize,
    /// Also write every run as a JSON line here, as it ends (`lmx bench report` reads them).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Also draw the lmx/anchor speedups of the rows to this SVG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Measure the one row named by --configs, --modes and --dtypes in this process and print it
    /// as a JSON line: how each lmx run is made in a fresh process, as each anchor run is.
    #[arg(long, hide = true)]
    pub one_row: bool,
    /// With --one-row: write the initial parameters and the batch to this safetensors file before
    /// the first step, and report every step's loss.
    #[arg(long, hide = true, requires = "one_row")]
    pub init_out: Option<PathBuf>,
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
    /// Median milliseconds per step that the host spent building the step's graph, before
    /// handing it to the device (lmx only).
    #[serde(default, alias = "host_ms", skip_serializing_if = "Option::is_none")]
    pub build_ms: Option<f64>,
    /// Median milliseconds per step that the host spent handing the step to the device (on a
    /// GPU, MLX encoding it; lmx only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submit_ms: Option<f64>,
    /// Median milliseconds per step that the host waited for the device (lmx only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<f64>,
    /// Median milliseconds per step inside `mx.eval`: handing the step to the device and waiting
    /// for it, which lmx reports apart as submit and wait (the anchor only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_ms: Option<f64>,
    /// Which of the repeated runs this is (0-based).
    #[serde(default)]
    pub repeat: usize,
    /// The trainer's run order, `--overlap` (lmx only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<String>,
    /// How the step's state was laid out, `flat` or `per-parameter` (lmx only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Every step's loss, the warm-up's included (--same-init).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub losses: Option<Vec<f64>>,
}

/// Runs every row, the anchor beside each when asked, and prints the tables.
pub fn bench(args: &BenchArgs) -> anyhow::Result<()> {
    if args.repeats == 0 {
        anyhow::bail!("--repeats must be at least 1");
    }
    if args.steps == 0 {
        anyhow::bail!("--steps must be at least 1: the timed steps give each row its median");
    }
    if args.one_row {
        let (config, mode, dtype) = match (&args.configs[..], &args.modes[..], &args.dtypes[..]) {
            ([config], [mode], [dtype]) => (config, mode, dtype),
            _ => anyhow::bail!("--one-row measures one config, one mode and one dtype"),
        };
        let row = measure(
            args,
            config,
            dtype,
            compiled(mode)?,
            args.init_out.as_deref(),
        )?;
        println!("{}", serde_json::to_string(&row)?);
        return Ok(());
    }
    let mut json = args.json.as_deref().map(RunLog::create).transpose()?;
    let mut runs = Vec::new();
    let mut record = |row: Row| -> anyhow::Result<()> {
        eprintln!("{}", serde_json::to_string(&row)?);
        if let Some(json) = &mut json {
            json.append(&row)?;
        }
        runs.push(row);
        Ok(())
    };
    for config in &args.configs {
        for dtype in &args.dtypes {
            for mode in &args.modes {
                let compile = compiled(mode)?;
                for repeat in 0..args.repeats {
                    // Where lmx leaves its initial parameters and batch for the anchor.
                    let init = args.same_init.then(|| {
                        std::env::temp_dir().join(format!(
                            "lmx-same-init-{}-{config}-{dtype}-{mode}.safetensors",
                            std::process::id()
                        ))
                    });
                    let ours = Row {
                        repeat,
                        ..measure_apart(args, config, dtype, mode, init.as_deref())?
                    };
                    record(ours.clone())?;
                    if let Some(script) = &args.anchor {
                        let theirs = anchor(args, script, config, dtype, compile, init.as_deref());
                        if let Some(init) = &init {
                            let _ = std::fs::remove_file(init);
                        }
                        let theirs = Row { repeat, ..theirs? };
                        record(theirs.clone())?;
                        if args.same_init {
                            super::curves::print(&ours, &theirs)?;
                        }
                    }
                }
            }
        }
    }
    let rows = report::rows_of(&runs);
    report::print(&rows);
    if let Some(path) = &args.plot {
        super::chart::speedups(&rows, path)?;
    }
    Ok(())
}

/// `--json`'s file, one line per run written as the run ends, so that an invocation cut short
/// keeps the runs it finished (`lmx bench report` makes the tables from them).
struct RunLog {
    file: std::fs::File,
    path: PathBuf,
}

impl RunLog {
    fn create(path: &Path) -> anyhow::Result<Self> {
        let file = std::fs::File::create(path)
            .map_err(|err| anyhow::anyhow!("cannot create {}: {err}", path.display()))?;
        Ok(RunLog {
            file,
            path: path.to_owned(),
        })
    }

    /// Appends `row` as one line, in one write.
    fn append(&mut self, row: &Row) -> anyhow::Result<()> {
        let line = serde_json::to_string(row)? + "\n";
        self.file
            .write_all(line.as_bytes())
            .map_err(|err| anyhow::anyhow!("cannot write {}: {err}", self.path.display()))
    }
}

/// Whether `mode` is the compiled step.
fn compiled(mode: &str) -> anyhow::Result<bool> {
    match mode {
        "compiled" => Ok(true),
        "eager" => Ok(false),
        other => anyhow::bail!("unknown mode `{other}`: use compiled or eager"),
    }
}

/// One row of lmx measured by a fresh `lmx` process, so that a row's peak memory and speed do not
/// depend on the rows run before it in the same process (MLX's CUDA allocator keeps what they
/// left behind), and each run starts as the anchor's does.
fn measure_apart(
    args: &BenchArgs,
    config: &str,
    dtype: &str,
    mode: &str,
    init_out: Option<&Path>,
) -> anyhow::Result<Row> {
    let mut command = Command::new(std::env::current_exe()?);
    command
        .args(["--device", device_name(), "bench", "train", "--one-row"])
        .args(["--configs", config, "--modes", mode, "--dtypes", dtype])
        .args([
            "--batch",
            &args.batch.to_string(),
            "--seq",
            &args.seq.to_string(),
        ])
        .args(["--steps", &args.steps.to_string()])
        .args(["--warmup", &args.warmup.to_string()])
        .args(["--peak-tflops", &args.peak_tflops.to_string()]);
    command.args(["--overlap", &flag_value(args.overlap)]);
    command.args(["--state-packing", &flag_value(args.state_packing)]);
    if let Some(path) = init_out {
        command.arg("--init-out").arg(path);
    }
    let output = command.output().map_err(|err| {
        anyhow::anyhow!("cannot start lmx for the {config} {mode} {dtype} row: {err}")
    })?;
    if !output.status.success() {
        anyhow::bail!(
            "measuring lmx's {config} {mode} {dtype} row failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = json_lines_last_first(&stdout)
        .next()
        .ok_or_else(|| anyhow::anyhow!("the {config} {mode} {dtype} row printed no JSON line"))?;
    Ok(serde_json::from_str(line)?)
}

/// A flag's value as written on the command line.
fn flag_value(value: impl clap::ValueEnum) -> String {
    value
        .to_possible_value()
        .expect("lmx's flags skip no value")
        .get_name()
        .to_owned()
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
fn measure(
    args: &BenchArgs,
    name: &str,
    dtype: &str,
    compile: bool,
    init_out: Option<&Path>,
) -> anyhow::Result<Row> {
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
        overlap: args.overlap.into(),
        state_packing: args.state_packing.into(),
        validation_fraction: 0.0,
        eval_every: 0,
        checkpoint_every: 0,
        out_dir: out_dir.clone(),
        peak_tflops: args.peak_tflops,
        // The anchor's MLX AdamW decays every parameter.
        decay: DecayScope::All,
        ..TrainConfig::default()
    };
    mlx_rs::memory::reset_peak_memory()?;
    let reports = Arc::new(Mutex::new(Vec::new()));
    let mut trainer = Trainer::<gpt2::Anchor>::new(config.clone(), train, windows.clone())?;
    if let Some(path) = init_out {
        super::curves::save_start(path, &trainer.state().params, &windows)?;
    }
    trainer.add_callback(Collect(reports.clone()));
    trainer.run()?;
    let peak = mlx_rs::memory::peak_memory()? as f64 / (1024.0 * 1024.0);
    let _ = std::fs::remove_dir_all(&out_dir);
    let params = count(&trainer.state().params);
    let flat = trainer.flat_state();
    let reports = reports.lock().expect("not poisoned").clone();
    let timed = &reports[args.warmup as usize..];
    let median_of = |field: fn(&StepReport) -> f64| {
        let mut values: Vec<f64> = timed.iter().map(field).collect();
        median(&mut values)
    };
    let tokens = (args.batch * args.seq) as f64;
    let median_ms = median_of(|report| 1e3 / report.tokens_per_s) * tokens;
    let tokens_per_s = tokens / (median_ms / 1e3);
    let flops_per_token = 6.0 * params as f64
        + 12.0 * (config.n_layers as f64) * (config.d_model as f64) * args.seq as f64;
    Ok(Row {
        implementation: "lmx".into(),
        device: device_name().into(),
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
        build_ms: Some(median_of(|report| report.build_ms)),
        submit_ms: Some(median_of(|report| report.submit_ms)),
        wait_ms: Some(median_of(|report| report.wait_ms)),
        eval_ms: None,
        repeat: 0,
        overlap: Some(flag_value(args.overlap)),
        state: Some(if flat { "flat" } else { "per-parameter" }.into()),
        losses: init_out.map(|_| reports.iter().map(|report| report.loss as f64).collect()),
    })
}

/// The median of `values` (the upper middle one for an even count), NaN when empty.
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

fn count(params: &gpt2::Params) -> u64 {
    let mut total = 0;
    lmx::runtime::tree::Tree::for_each(params, &mut |leaf: &mlx_rs::Array| {
        total += leaf.size() as u64
    });
    total
}

/// One row of the Python MLX anchor, with the same BLAS as this process on the CPU.
fn anchor(
    args: &BenchArgs,
    script: &Path,
    config: &str,
    dtype: &str,
    compile: bool,
    init: Option<&Path>,
) -> anyhow::Result<Row> {
    let mut command = Command::new(&args.python);
    command.args(["-c", WITH_MEASUREMENTS]).arg(script).args([
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
        device_name(),
        "--peak_tflops",
        &args.peak_tflops.to_string(),
    ]);
    if let Some(init) = init {
        command.arg("--init").arg(init);
    }
    let stdout = output_of(command, &script.display().to_string())?;
    let json_line = |field: &str| {
        json_lines_last_first(&stdout)
            .find(|line| line.contains(field))
            .ok_or_else(|| anyhow::anyhow!("the anchor printed no JSON line with `{field}`"))
    };
    let mut row: Row = serde_json::from_str(json_line("\"median_ms\"")?)?;
    let measured: serde_json::Value = serde_json::from_str(json_line("\"peak_memory\"")?)?;
    row.device = device_name().into();
    row.peak_mib = measured["peak_memory"]
        .as_f64()
        .map(|bytes| bytes / (1024.0 * 1024.0));
    row.eval_ms = measured["eval_ms"].as_f64();
    Ok(row)
}

/// Runs the anchor script given as the first argument with the rest as its arguments, then
/// prints what the anchor itself does not measure as one more JSON line: MLX's peak memory, and
/// the median time of the timed steps' `mx.eval` calls (the anchor calls it once per step, after
/// building the step's graph, and once before its first step).
const WITH_MEASUREMENTS: &str = "\
import json, runpy, statistics, sys, time
import mlx.core as mx
sys.argv = sys.argv[1:]
steps = int(sys.argv[sys.argv.index('--steps') + 1])
evals, untimed_eval = [], mx.eval
def timed_eval(*arrays):
    start = time.perf_counter()
    untimed_eval(*arrays)
    evals.append(time.perf_counter() - start)
mx.eval = timed_eval
runpy.run_path(sys.argv[0], run_name='__main__')
print(json.dumps({'peak_memory': mx.get_peak_memory(),
                  'eval_ms': statistics.median(evals[-steps:]) * 1e3}))
";
