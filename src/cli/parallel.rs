//! One rank of a data-parallel `lmx train`: the group it joins and the watchdog that ends it when
//! the others are gone. `lmx launch` sets the environment this reads.

use lmx::runtime::distributed::{DataParallel, Group, Reduce, Watchdog};
use lmx::runtime::train::{Callback, Control, EvalReport, StepReport};

/// Set to `1` by `lmx launch --shard-optimizer`: each rank keeps its part of the optimizer state.
pub const SHARD_VAR: &str = "LMX_SHARD_OPTIMIZER";

/// Set to `after-step` by `lmx launch --reduce after-step` (the gradients are summed between
/// the step's compiled functions rather than inside it), `overlap` by `--reduce overlap` (during
/// the backward pass, bucket by bucket).
pub const REDUCE_VAR: &str = "LMX_REDUCE";

/// The largest bucket of `--reduce overlap`, in bytes (`lmx launch --bucket-mb`).
pub const BUCKET_VAR: &str = "LMX_BUCKET_BYTES";

/// This process as one rank of several.
pub struct Rank {
    /// How its steps run with the others.
    pub parallel: DataParallel,
    watchdog: Watchdog,
}

impl Rank {
    /// The rank this process is, when it was started as one (`MLX_RANK` set), once its group
    /// is connected; `None` for a process on its own.
    pub fn from_environment() -> anyhow::Result<Option<Rank>> {
        let timeout = Watchdog::timeout_from_environment()?;
        if std::env::var_os("MLX_RANK").is_none() {
            return Ok(None);
        }
        // MLX's ring backend writes to its peers' sockets without MSG_NOSIGNAL: with SIGPIPE's
        // default action (`process::main` restores it) a peer's death would kill this rank
        // silently instead of failing its collective with an error.
        // SAFETY: only sets the signal's action, before MLX's threads are started.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        }
        let Some(group) = Group::from_environment()? else {
            return Ok(None);
        };
        let watchdog = Watchdog::start(group.rank(), group.size(), timeout);
        let reduce = match std::env::var(REDUCE_VAR).as_deref() {
            Err(_) | Ok("in-step") => Reduce::InStep,
            Ok("after-step") => Reduce::AfterStep,
            Ok("overlap") => Reduce::Overlap {
                bucket_bytes: match std::env::var(BUCKET_VAR) {
                    Err(_) => Reduce::DEFAULT_BUCKET_BYTES,
                    Ok(bytes) => match bytes.parse::<usize>() {
                        Ok(bytes) if bytes > 0 => bytes,
                        _ => anyhow::bail!("{BUCKET_VAR}={bytes}: give a positive count of bytes"),
                    },
                },
            },
            Ok(other) => {
                anyhow::bail!("{REDUCE_VAR}={other}: use in-step, after-step or overlap")
            }
        };
        let shard_optimizer = match std::env::var(SHARD_VAR).as_deref() {
            Err(_) | Ok("0") => false,
            Ok("1") => true,
            Ok(other) => anyhow::bail!("{SHARD_VAR}={other}: use 1 or 0"),
        };
        if group.rank() == 0 {
            eprintln!(
                "data parallel: {} ranks over MLX's {} backend{}",
                group.size(),
                group.backend(),
                if shard_optimizer {
                    ", optimizer state sharded"
                } else {
                    ""
                }
            );
        }
        Ok(Some(Rank {
            parallel: DataParallel {
                group,
                reduce,
                shard_optimizer,
            },
            watchdog,
        }))
    }

    /// Whether it is rank 0, which writes the run folder and reports.
    pub fn leads(&self) -> bool {
        self.parallel.group.rank() == 0
    }

    /// `rank R of N`, for messages.
    pub fn name(&self) -> String {
        format!(
            "rank {} of {}",
            self.parallel.group.rank(),
            self.parallel.group.size()
        )
    }

    /// The callback that tells the watchdog of each step and evaluation done.
    pub fn progress(self) -> Progress {
        Progress(self.watchdog)
    }
}

/// Beats the watchdog at every step and evaluation the trainer reports.
pub struct Progress(Watchdog);

impl Callback for Progress {
    fn on_step(&mut self, _report: &StepReport) -> lmx::runtime::Result<Control> {
        self.0.beat();
        Ok(Control::Continue)
    }

    fn on_eval(&mut self, _report: &EvalReport) -> lmx::runtime::Result<Control> {
        self.0.beat();
        Ok(Control::Continue)
    }
}
