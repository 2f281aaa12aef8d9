//! Callbacks: what the training loop tells the outside world, and how it can be stopped.

use crate::error::{Error, Result};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// One step, reported once its loss is on the host.
///
/// Unless [`TrainConfig::overlap`](super::TrainConfig::overlap) is `Off`, the trainer reads a
/// step's loss only after it has built the next step's graph, so that the host's graph building
/// overlaps the device's work: a report arrives one step late, and a [`Control::Stop`] returned
/// from [`Callback::on_step`] takes effect after the step already built.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct StepReport {
    /// The number of updates made, counting this one.
    pub step: u64,
    /// The total number of updates of the run.
    pub total_steps: u64,
    /// The training loss before this update.
    pub loss: f32,
    /// The gradient norm before clipping.
    pub grad_norm: f32,
    /// The learning rate of this update.
    pub lr: f32,
    /// Tokens per second over this step: its tokens over the time since the previous report.
    pub tokens_per_s: f64,
    /// Milliseconds the host spent building this step's graph (the batch arrays, the compiled
    /// call) before handing it to the device.
    pub build_ms: f64,
    /// Milliseconds the host spent handing this step to the device (MLX's `async_eval`). On a
    /// GPU that is MLX encoding the step's kernels and library calls into command buffers, on
    /// this thread; on the CPU it covers most of the computation, since MLX queues only a few
    /// tasks ahead of its CPU stream. With [`Overlap::Off`](super::Overlap::Off) the step runs to
    /// completion here (MLX's synchronous `eval`), so this holds the device's time too and
    /// `wait_ms` is near zero.
    pub submit_ms: f64,
    /// Milliseconds the host waited for the device to finish this step before reading its loss.
    /// Near zero while the step's other times add up to the step's own, the run is bound by
    /// the host; large, by the device.
    pub wait_ms: f64,
    /// Model FLOPs utilisation against the configured peak, when one is configured.
    pub mfu: Option<f64>,
    /// Seconds since the run started.
    pub elapsed_s: f64,
}

/// A validation pass.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct EvalReport {
    /// The number of updates made.
    pub step: u64,
    /// The mean validation loss.
    pub val_loss: f32,
}

/// Whether the run goes on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Control {
    /// Go on.
    Continue,
    /// Stop, for the reason given: after this step from [`Callback::on_eval`], after the step in
    /// flight from [`Callback::on_step`].
    Stop(String),
}

/// Something that watches a run: logs, progress, early stopping.
pub trait Callback {
    /// After every step.
    fn on_step(&mut self, _report: &StepReport) -> Result<Control> {
        Ok(Control::Continue)
    }

    /// After every validation pass.
    fn on_eval(&mut self, _report: &EvalReport) -> Result<Control> {
        Ok(Control::Continue)
    }

    /// When the run ends, normally or not.
    fn on_end(&mut self) -> Result<()> {
        Ok(())
    }
}

/// Appends every report as one JSON line to a file (`metrics.jsonl`).
pub struct JsonlLog {
    path: PathBuf,
    out: BufWriter<File>,
}

impl JsonlLog {
    /// Logs to `path`, appending (a resumed run continues its log).
    pub fn append(path: impl AsRef<Path>) -> Result<JsonlLog> {
        let path = path.as_ref().to_path_buf();
        let file = File::options()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|cause| Error::Io {
                path: path.clone(),
                cause,
            })?;
        Ok(JsonlLog {
            path,
            out: BufWriter::new(file),
        })
    }

    fn write(&mut self, kind: &str, value: impl serde::Serialize) -> Result<()> {
        let mut line = serde_json::to_value(value).map_err(|err| Error::Config(err.to_string()))?;
        line["kind"] = kind.into();
        writeln!(self.out, "{line}")
            .and_then(|()| self.out.flush())
            .map_err(|cause| Error::Io {
                path: self.path.clone(),
                cause,
            })
    }
}

impl Callback for JsonlLog {
    fn on_step(&mut self, report: &StepReport) -> Result<Control> {
        self.write("step", report)?;
        Ok(Control::Continue)
    }

    fn on_eval(&mut self, report: &EvalReport) -> Result<Control> {
        self.write("eval", report)?;
        Ok(Control::Continue)
    }
}

/// Stops the run when the validation loss has not improved for `patience` evaluations.
pub struct EarlyStopping {
    patience: usize,
    best: f32,
    stale: usize,
}

impl EarlyStopping {
    /// Stops after `patience` evaluations without improvement.
    pub fn new(patience: usize) -> EarlyStopping {
        EarlyStopping {
            patience,
            best: f32::INFINITY,
            stale: 0,
        }
    }
}

impl Callback for EarlyStopping {
    fn on_eval(&mut self, report: &EvalReport) -> Result<Control> {
        if report.val_loss < self.best {
            self.best = report.val_loss;
            self.stale = 0;
            return Ok(Control::Continue);
        }
        self.stale += 1;
        if self.stale >= self.patience {
            return Ok(Control::Stop(format!(
                "early stopping: validation loss {:.4} has not improved on {:.4} for {} evaluations",
                report.val_loss, self.best, self.stale
            )));
        }
        Ok(Control::Continue)
    }
}
