//! Progress for a person watching a run: a bar on a terminal, text lines elsewhere.

use super::callbacks::{Callback, Control, EvalReport, StepReport};
use crate::error::Result;
use std::io::Write;

/// Progress for a person: on a terminal an indicatif bar (loss, learning rate, tokens/s, time
/// left); elsewhere, a file or a pipe, where a bar would print nothing, a [`ProgressLines`] line
/// every `log_every` steps. Both on standard error.
pub struct ProgressBar {
    display: Display,
}

enum Display {
    Bar(indicatif::ProgressBar),
    Lines(ProgressLines<std::io::Stderr>),
}

impl ProgressBar {
    /// Progress over `total` steps, starting at `done`; lines every `log_every` steps (0: none)
    /// when standard error is not a terminal.
    pub fn new(total: u64, done: u64, log_every: u64) -> ProgressBar {
        use std::io::IsTerminal;
        if !std::io::stderr().is_terminal() {
            return ProgressBar {
                display: Display::Lines(ProgressLines::new(
                    std::io::stderr(),
                    total,
                    done,
                    log_every,
                )),
            };
        }
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} steps  {msg}  eta {eta}")
                .expect("a valid template"),
        );
        bar.set_position(done);
        ProgressBar {
            display: Display::Bar(bar),
        }
    }
}

impl Callback for ProgressBar {
    fn on_step(&mut self, report: &StepReport) -> Result<Control> {
        match &mut self.display {
            Display::Lines(lines) => return lines.on_step(report),
            Display::Bar(bar) => {
                bar.set_position(report.step);
                bar.set_message(format!(
                    "loss {:.4}{}  lr {:.2e}  {:.0} tok/s",
                    report.loss,
                    metrics_text(report),
                    report.lr,
                    report.tokens_per_s
                ));
            }
        }
        Ok(Control::Continue)
    }

    fn on_eval(&mut self, report: &EvalReport) -> Result<Control> {
        match &mut self.display {
            Display::Lines(lines) => return lines.on_eval(report),
            Display::Bar(bar) => bar.println(format!(
                "step {:>6}  validation loss {:.4}",
                report.step, report.val_loss
            )),
        }
        Ok(Control::Continue)
    }

    fn on_end(&mut self) -> Result<()> {
        if let Display::Bar(bar) = &self.display {
            bar.finish();
        }
        Ok(())
    }
}

/// Progress as text lines, for output that is not a terminal: every `every` steps and at the last
/// step, the step, the loss, the learning rate, tokens per second since the previous line, the
/// time elapsed and the time left (lmxlab's `log_interval` lines), e.g.
///
/// ```text
/// step 20/300  loss 5.4321  lr 2.00e-03  3105 tok/s  elapsed 0:13  left 2:58
/// ```
pub struct ProgressLines<W: Write> {
    out: W,
    total: u64,
    every: u64,
    /// Steps done when this run started (a resumed run starts after them).
    start: u64,
    /// The first report of this run, `(step, elapsed_s)`: its step includes tracing the step, so
    /// the time left is measured from it.
    first: Option<(u64, f64)>,
    /// Since the last line: steps reported and the sum of their seconds per token, whose mean
    /// inverts to the tokens per second over them (every step has the same tokens).
    steps: u64,
    seconds_per_token: f64,
}

impl<W: Write> ProgressLines<W> {
    /// Lines to `out` over `total` steps, starting at `done`, every `every` steps (0: none).
    pub fn new(out: W, total: u64, done: u64, every: u64) -> ProgressLines<W> {
        ProgressLines {
            out,
            total,
            every,
            start: done,
            first: None,
            steps: 0,
            seconds_per_token: 0.0,
        }
    }

    /// The writer, with the lines written to it.
    pub fn into_inner(self) -> W {
        self.out
    }

    /// Writes one line. A line that cannot be written is dropped, as indicatif drops a bar it
    /// cannot draw: progress is for a person, and the run's record is `metrics.jsonl`, whose
    /// writes are checked (a closed pipe still ends the `lmx` command, through SIGPIPE).
    fn line(&mut self, text: &str) {
        let _ = writeln!(self.out, "{text}").and_then(|()| self.out.flush());
    }

    /// Seconds left at `report`, from the pace since the first report of this run (or, at that
    /// first report, since the run started).
    fn seconds_left(&self, report: &StepReport) -> f64 {
        let per_step = match self.first {
            Some((step, elapsed)) if report.step > step => {
                (report.elapsed_s - elapsed) / (report.step - step) as f64
            }
            _ => report.elapsed_s / report.step.saturating_sub(self.start).max(1) as f64,
        };
        per_step * report.total_steps.saturating_sub(report.step) as f64
    }
}

impl<W: Write> Callback for ProgressLines<W> {
    fn on_step(&mut self, report: &StepReport) -> Result<Control> {
        self.first.get_or_insert((report.step, report.elapsed_s));
        self.steps += 1;
        self.seconds_per_token += 1.0 / report.tokens_per_s;
        let due = report.step % self.every.max(1) == 0 || report.step == self.total;
        if self.every == 0 || !due {
            return Ok(Control::Continue);
        }
        let tokens_per_s = self.steps as f64 / self.seconds_per_token;
        self.steps = 0;
        self.seconds_per_token = 0.0;
        let text = format!(
            "step {}/{}  loss {:.4}{}  lr {:.2e}  {tokens_per_s:.0} tok/s  elapsed {}  left {}",
            report.step,
            report.total_steps,
            report.loss,
            metrics_text(report),
            report.lr,
            clock(report.elapsed_s),
            clock(self.seconds_left(report))
        );
        self.line(&text);
        Ok(Control::Continue)
    }

    fn on_eval(&mut self, report: &EvalReport) -> Result<Control> {
        let text = format!(
            "step {}/{}  validation loss {:.4}",
            report.step, self.total, report.val_loss
        );
        self.line(&text);
        Ok(Control::Continue)
    }
}

/// The step's own metrics after its loss: `  reward_margin 0.0123  accuracy 0.7500`.
fn metrics_text(report: &StepReport) -> String {
    report
        .metrics
        .iter()
        .map(|(name, value)| format!("  {name} {value:.4}"))
        .collect()
}

/// `m:ss`, or `h:mm:ss` from an hour on.
fn clock(seconds: f64) -> String {
    let seconds = seconds.max(0.0).round() as u64;
    let (hours, minutes, seconds) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    if hours > 0 {
        format!("{hours}:{minutes:02}:{seconds:02}")
    } else {
        format!("{minutes}:{seconds:02}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Step `step` of `total` at `tokens_per_s`, after three seconds of tracing and two seconds a
    /// step.
    fn report(step: u64, total: u64, tokens_per_s: f64) -> StepReport {
        StepReport {
            step,
            total_steps: total,
            loss: 8.0 / step as f32,
            grad_norm: 1.0,
            metrics: Default::default(),
            lr: 1e-3,
            tokens_per_s,
            build_ms: 0.0,
            submit_ms: 0.0,
            wait_ms: 0.0,
            mfu: None,
            peak_memory_mib: 0.0,
            elapsed_s: 3.0 + 2.0 * step as f64,
        }
    }

    fn lines(total: u64, done: u64, every: u64) -> Vec<String> {
        let mut progress = ProgressLines::new(Vec::new(), total, done, every);
        for step in done + 1..=total {
            // Alternately 1000 and 3000 tokens a second: 1500 over ten steps (the harmonic mean,
            // the tokens over the time they took), 1667 over 21 to 25, 1364 over 16 to 20.
            let tokens_per_s = if step % 2 == 0 { 1000.0 } else { 3000.0 };
            progress
                .on_step(&report(step, total, tokens_per_s))
                .unwrap();
            if step == 20 {
                let eval = EvalReport {
                    step,
                    val_loss: 0.5,
                };
                progress.on_eval(&eval).unwrap();
            }
        }
        String::from_utf8(progress.into_inner())
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn a_line_every_log_every_steps_and_at_the_last_with_the_pace_since_the_previous_line() {
        assert_eq!(
            lines(25, 0, 10),
            [
                "step 10/25  loss 0.8000  lr 1.00e-3  1500 tok/s  elapsed 0:23  left 0:30",
                "step 20/25  loss 0.4000  lr 1.00e-3  1500 tok/s  elapsed 0:43  left 0:10",
                "step 20/25  validation loss 0.5000",
                "step 25/25  loss 0.3200  lr 1.00e-3  1667 tok/s  elapsed 0:53  left 0:00",
            ]
        );
    }

    #[test]
    fn a_resumed_run_counts_its_own_steps_and_zero_prints_no_lines() {
        assert_eq!(
            lines(25, 15, 10),
            [
                "step 20/25  loss 0.4000  lr 1.00e-3  1364 tok/s  elapsed 0:43  left 0:10",
                "step 20/25  validation loss 0.5000",
                "step 25/25  loss 0.3200  lr 1.00e-3  1667 tok/s  elapsed 0:53  left 0:00",
            ]
        );
        assert_eq!(lines(25, 0, 0), ["step 20/25  validation loss 0.5000"]);
    }

    #[test]
    fn an_objectives_metrics_follow_the_loss() {
        let mut progress = ProgressLines::new(Vec::new(), 1, 0, 1);
        let mut step = report(1, 1, 1000.0);
        step.metrics = [("reward_margin", 0.0123), ("accuracy", 0.75)].into();
        progress.on_step(&step).unwrap();
        assert_eq!(
            String::from_utf8(progress.into_inner()).unwrap(),
            "step 1/1  loss 8.0000  accuracy 0.7500  reward_margin 0.0123  lr 1.00e-3  1000 tok/s  \
             elapsed 0:05  left 0:00\n"
        );
    }

    #[test]
    fn clock_shows_hours_from_an_hour_on() {
        assert_eq!(clock(59.4), "0:59");
        assert_eq!(clock(61.0), "1:01");
        assert_eq!(clock(3725.0), "1:02:05");
        assert_eq!(clock(-1.0), "0:00");
    }
}
