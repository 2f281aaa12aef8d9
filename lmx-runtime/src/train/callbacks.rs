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
    /// The objective's own metrics by name (DPO's `reward_margin` and `accuracy`), computed in
    /// the step with the loss; logged beside it.
    #[serde(flatten)]
    pub metrics: std::collections::BTreeMap<&'static str, f32>,
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
    /// The most memory MLX's allocator has held in this process so far, in MiB (device memory
    /// on a GPU), as mlx-lm's trainer reports it.
    pub peak_memory_mib: f64,
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
    /// Logs to `path`, appending (a resumed run continues its log); the folder is created if
    /// missing.
    pub fn append(path: impl AsRef<Path>) -> Result<JsonlLog> {
        let path = path.as_ref().to_path_buf();
        create_folder_of(&path)?;
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

    /// Logs to `path` after cutting it back to the lines of steps up to `step`, the step a run
    /// continues from: the lines a stopped or killed run wrote after its checkpoint, and a
    /// partial last line, are dropped, so that each step is logged once and the log agrees with
    /// the checkpoints. `step` 0 starts the log afresh. The folder is created if missing.
    pub fn continue_at(path: impl AsRef<Path>, step: u64) -> Result<JsonlLog> {
        let path = path.as_ref();
        let io = |cause| Error::Io {
            path: path.to_owned(),
            cause,
        };
        create_folder_of(path)?;
        let kept = match std::fs::read(path) {
            Ok(bytes) => kept_lines(&bytes, step),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(err) => return Err(io(err)),
        };
        crate::checkpoint::atomic::write_file(path, &kept, &mut crate::checkpoint::DurableWriter)?;
        Self::append(path)
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

/// Creates the folder `path` goes in: a log is often the first file of a new run directory.
fn create_folder_of(path: &Path) -> Result<()> {
    match path.parent() {
        Some(folder) if !folder.as_os_str().is_empty() => {
            std::fs::create_dir_all(folder).map_err(|cause| Error::Io {
                path: folder.to_owned(),
                cause,
            })
        }
        _ => Ok(()),
    }
}

/// The complete lines of a log whose step is at most `step`. A line without its newline is one a
/// run was stopped writing; a line that is no JSON is kept, for `lmx plot` to name.
fn kept_lines(bytes: &[u8], step: u64) -> Vec<u8> {
    let mut kept = Vec::with_capacity(bytes.len());
    for line in bytes.split_inclusive(|&byte| byte == b'\n') {
        if !line.ends_with(b"\n") {
            break;
        }
        let logged = serde_json::from_slice::<serde_json::Value>(line)
            .ok()
            .and_then(|value| value.get("step").and_then(serde_json::Value::as_u64));
        if logged.is_some_and(|logged| logged > step) {
            break;
        }
        kept.extend_from_slice(line);
    }
    kept
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

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(early: &mut EarlyStopping, step: u64, val_loss: f32) -> Control {
        early.on_eval(&EvalReport { step, val_loss }).unwrap()
    }

    #[test]
    fn early_stopping_stops_after_patience_evaluations_without_improvement() {
        let mut early = EarlyStopping::new(2);
        assert_eq!(eval(&mut early, 1, 3.0), Control::Continue);
        assert_eq!(eval(&mut early, 2, 3.5), Control::Continue, "one stale");
        // An improvement resets the count.
        assert_eq!(eval(&mut early, 3, 2.5), Control::Continue);
        assert_eq!(
            eval(&mut early, 4, 2.5),
            Control::Continue,
            "equal is no gain"
        );
        assert_eq!(
            eval(&mut early, 5, 2.7),
            Control::Stop(
                "early stopping: validation loss 2.7000 has not improved on 2.5000 for 2 \
                 evaluations"
                    .into()
            )
        );
    }

    #[test]
    fn a_continued_log_keeps_the_steps_up_to_its_checkpoint_and_drops_a_partial_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let line = |kind: &str, step: u64| format!("{{\"kind\":\"{kind}\",\"step\":{step}}}\n");
        let before: String = (1..=4).map(|step| line("step", step)).collect::<String>()
            + &line("eval", 4)
            + &line("step", 5)
            + "{\"kind\":\"st";
        std::fs::write(&path, &before).unwrap();
        let mut log = JsonlLog::continue_at(&path, 4).unwrap();
        log.write("step", serde_json::json!({"step": 5})).unwrap();
        let expected: String =
            (1..=4).map(|step| line("step", step)).collect::<String>() + &line("eval", 4);
        let after = std::fs::read_to_string(&path).unwrap();
        let (kept, appended) = after.split_at(expected.len());
        assert_eq!(kept, expected);
        let appended: serde_json::Value = serde_json::from_str(appended).unwrap();
        assert_eq!(appended, serde_json::json!({"kind": "step", "step": 5}));
        JsonlLog::continue_at(&path, 0).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
    }

    #[test]
    fn a_log_creates_its_folder() {
        let dir = tempfile::tempdir().unwrap();
        let appended = dir.path().join("new/run/metrics.jsonl");
        let mut log = JsonlLog::append(&appended).unwrap();
        log.write("step", serde_json::json!({"step": 1})).unwrap();
        assert_eq!(
            std::fs::read_to_string(&appended).unwrap(),
            "{\"kind\":\"step\",\"step\":1}\n"
        );
        let continued = dir.path().join("other/metrics.jsonl");
        JsonlLog::continue_at(&continued, 0).unwrap();
        assert!(continued.exists());
        // A folder that cannot be made is an error naming it.
        std::fs::write(dir.path().join("file"), "").unwrap();
        let blocked = dir.path().join("file/metrics.jsonl");
        match JsonlLog::append(&blocked) {
            Err(Error::Io { path, .. }) => assert_eq!(path, dir.path().join("file")),
            other => panic!(
                "expected an I/O error naming the folder, got {:?}",
                other.err()
            ),
        }
    }
}
