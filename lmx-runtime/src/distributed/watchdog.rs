//! Ends a rank whose training loop has stopped making progress.

use super::{DistributedError, TIMEOUT_VAR};
use crate::error::Result;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The seconds a rank may go without progress when `LMX_DISTRIBUTED_TIMEOUT` is not set: above
/// a first step's compilation on a GPU (about 40 s of kernel JIT) and a large checkpoint's
/// writing, which the other ranks wait for in their next collective.
pub const DEFAULT_TIMEOUT_S: u64 = 600;

/// The exit status of a rank that the watchdog ends.
pub const EXIT_STATUS: i32 = 75;

/// A thread that ends the process, with a message naming its rank, once [`beat`](Self::beat)
/// has not been called for the timeout.
///
/// MLX's collectives cannot be interrupted and NCCL's have no timeout: a rank whose peer died
/// waits inside one forever. Ending the process is the one way out; it skips destructors (some of
/// MLX's would wait for the blocked collective). Dropped, the watchdog stops watching.
pub struct Watchdog {
    shared: Arc<Shared>,
}

struct Shared {
    started: Instant,
    /// Milliseconds from `started` to the last beat.
    last: AtomicU64,
    stopped: AtomicBool,
}

impl Watchdog {
    /// Watches for `timeout` without a beat, from now.
    pub fn start(rank: usize, size: usize, timeout: Duration) -> Watchdog {
        let shared = Arc::new(Shared {
            started: Instant::now(),
            last: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
        });
        let watched = Arc::clone(&shared);
        let poll = (timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
        std::thread::spawn(move || {
            while !watched.stopped.load(Ordering::SeqCst) {
                std::thread::sleep(poll);
                let now = watched.started.elapsed().as_millis() as u64;
                let idle = now.saturating_sub(watched.last.load(Ordering::SeqCst));
                if idle > timeout.as_millis() as u64 && !watched.stopped.load(Ordering::SeqCst) {
                    let error = DistributedError::Timeout {
                        rank,
                        size,
                        seconds: timeout.as_secs(),
                        var: TIMEOUT_VAR,
                    };
                    eprintln!("error: {error}");
                    // SAFETY: `_exit` ends the process at once; nothing of it is used after.
                    unsafe { libc::_exit(EXIT_STATUS) };
                }
            }
        });
        Watchdog { shared }
    }

    /// The timeout `LMX_DISTRIBUTED_TIMEOUT` sets in seconds, or [`DEFAULT_TIMEOUT_S`].
    pub fn timeout_from_environment() -> Result<Duration> {
        let Ok(value) = std::env::var(TIMEOUT_VAR) else {
            return Ok(Duration::from_secs(DEFAULT_TIMEOUT_S));
        };
        match value.trim().parse::<u64>() {
            Ok(seconds) if seconds > 0 => Ok(Duration::from_secs(seconds)),
            _ => Err(DistributedError::Environment {
                name: TIMEOUT_VAR,
                value,
                expected: "a whole number of seconds, at least 1",
            }
            .into()),
        }
    }

    /// Records progress: the timeout runs again from now.
    pub fn beat(&self) {
        let now = self.shared.started.elapsed().as_millis() as u64;
        self.shared.last.store(now, Ordering::SeqCst);
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
    }
}
