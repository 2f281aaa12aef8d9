//! Ctrl-C and `kill` during training: the first SIGINT or SIGTERM asks the trainer to stop at
//! the next step boundary, where it saves a checkpoint; a second one ends the process at once.

use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::flag;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// The flag the first signal sets, and which signal it was. Once dropped, a signal ends the
/// process at once, as before training (the sample after it is not worth a checkpoint).
pub struct StopSignals {
    stop: Arc<AtomicBool>,
    signal: Arc<AtomicUsize>,
}

impl StopSignals {
    /// Installs the handlers, signal-hook's documented pattern for a second Ctrl-C: the shutdown
    /// is registered first, so that it sees the flag only once an earlier signal has set it. It
    /// exits with the status a shell reports for the signal (128 + its number).
    pub fn install() -> anyhow::Result<StopSignals> {
        let stop = Arc::new(AtomicBool::new(false));
        let signal = Arc::new(AtomicUsize::new(0));
        for number in [SIGINT, SIGTERM] {
            flag::register_conditional_shutdown(number, 128 + number, Arc::clone(&stop))?;
            flag::register_usize(number, Arc::clone(&signal), number as usize)?;
            flag::register(number, Arc::clone(&stop))?;
        }
        Ok(StopSignals { stop, signal })
    }

    /// The flag for the trainer to watch.
    pub fn flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.stop)
    }

    /// The signal that arrived, if one did.
    pub fn received(&self) -> Option<i32> {
        let signal = self.signal.load(Ordering::SeqCst);
        (self.stop.load(Ordering::SeqCst) && signal != 0).then_some(signal as i32)
    }
}

impl Drop for StopSignals {
    fn drop(&mut self) {
        // Removing the handlers would leave the signals ignored (signal-hook does not restore
        // the default action); arming the shutdown makes the next signal end the process.
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// A run stopped by a signal after saving its checkpoint: not an error, but the command exits
/// as the signal would have (130 for SIGINT, 143 for SIGTERM), so that scripts see it stopped.
#[derive(Debug)]
pub struct Interrupted {
    /// The signal.
    pub signal: i32,
    /// The step reached.
    pub step: u64,
    /// The checkpoint saved there.
    pub checkpoint: Option<PathBuf>,
    /// The run directory.
    pub run: PathBuf,
}

impl Interrupted {
    /// 128 + the signal's number.
    pub fn exit_code(&self) -> std::process::ExitCode {
        std::process::ExitCode::from(128u8.saturating_add(self.signal as u8))
    }
}

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self.signal {
            SIGINT => "SIGINT",
            SIGTERM => "SIGTERM",
            _ => "a signal",
        };
        write!(f, "interrupted by {name} at step {}", self.step)?;
        if let Some(checkpoint) = &self.checkpoint {
            write!(f, "; checkpoint {}", checkpoint.display())?;
        }
        write!(
            f,
            "; continue with: lmx train --out {} --resume",
            self.run.display()
        )
    }
}

impl std::error::Error for Interrupted {}
