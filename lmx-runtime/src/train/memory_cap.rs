//! Keeps the `Submit` order within the memory of one step, on CUDA.
//!
//! MLX allocates a step's buffers while its host encodes the step and frees them when the device
//! is done, so a step handed over while the previous one still runs adds its buffers to that
//! one's: with a flat state, whose host work is short, the anchors' medium step peaked at 9.7 GB
//! in `Submit` order against 5.4 GB one step at a time (docs/benchmarks.md). MLX's encoder
//! stops and waits for the device whenever its memory in use passes its memory limit, so a limit
//! just above one step's peak lets the next step's encoding go on only as fast as the previous
//! step frees memory: the steps still overlap in time, not in memory. The trainer measures that
//! peak on its first steps, run one at a time ([`PROBE_STEPS`]), and sets the limit for the rest
//! of the run.
//!
//! Only on CUDA, where MLX's limit is a soft one: past it, MLX's CUDA allocator still allocates
//! (after giving cached buffers back) and its encoder waits only while the device has work that
//! would free memory. On the CPU and on Metal the order runs uncapped.

use crate::error::Result;

/// Steps the trainer runs in `Build` order, one on the device at a time, before it sets the cap.
pub(super) const PROBE_STEPS: u64 = 2;

/// The cap over the probe steps' peak. At 1.0 the encoder waited often enough to slow the
/// medium step (10.97 and 12.64 ms against 10.26 at 1.05, whose peak was that of one step alone).
pub(super) const MARGIN: f64 = 1.05;

/// MLX's memory limit, lowered to [`MARGIN`] times the peak so far; the previous limit comes
/// back when this is dropped.
pub(super) struct MemoryCap {
    previous: usize,
}

impl MemoryCap {
    /// Lowers MLX's memory limit to [`MARGIN`] times the most memory MLX has had in use (which,
    /// after the probe steps, is at least what one of them took); never raises it.
    pub(super) fn over_peak() -> Result<MemoryCap> {
        let peak = mlx_rs::memory::peak_memory()?;
        let current = mlx_rs::memory::memory_limit()?;
        let cap = ((peak as f64 * MARGIN) as usize).min(current);
        let previous = mlx_rs::memory::set_memory_limit(cap)?;
        Ok(MemoryCap { previous })
    }
}

impl Drop for MemoryCap {
    fn drop(&mut self) {
        // Restoring a limit MLX accepted before cannot fail in a way worth reporting from a drop.
        let _ = mlx_rs::memory::set_memory_limit(self.previous);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::memory::{memory_limit, peak_memory};

    #[test]
    fn the_cap_lowers_the_limit_to_the_margin_over_the_peak_and_restores_it() {
        let before = memory_limit().unwrap();
        let ones = mlx_rs::Array::ones::<f32>(&[1 << 20]).unwrap();
        ones.sum(false).unwrap().eval().unwrap();
        let low = peak_memory().unwrap();
        let cap = MemoryCap::over_peak().unwrap();
        let high = peak_memory().unwrap();
        let capped = memory_limit().unwrap();
        let at = |peak: usize| ((peak as f64 * MARGIN) as usize).min(before);
        assert!(
            (at(low)..=at(high)).contains(&capped),
            "{capped} outside {}..={}",
            at(low),
            at(high)
        );
        assert!(capped < before, "a 4 MiB peak did not lower {before}");
        drop(cap);
        assert_eq!(memory_limit().unwrap(), before);
    }
}
