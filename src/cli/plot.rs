//! `lmx plot RUN`: the loss and learning-rate curves of a run, from its `metrics.jsonl`, as SVG.

use plotters::prelude::*;
use std::path::{Path, PathBuf};

/// The curves of one run.
#[derive(Default)]
struct Curves {
    loss: Vec<(f64, f64)>,
    val_loss: Vec<(f64, f64)>,
    lr: Vec<(f64, f64)>,
}

fn read(run: &Path) -> anyhow::Result<Curves> {
    let path = run.join("metrics.jsonl");
    let text = std::fs::read_to_string(&path)
        .map_err(|err| anyhow::anyhow!("{}: {err}", path.display()))?;
    let mut curves = Curves::default();
    let count = text.lines().count();
    for (number, line) in text
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
    {
        let value: serde_json::Value = match serde_json::from_str(line) {
            Ok(value) => value,
            // A run killed while writing a line leaves it cut short; the run's next resume
            // drops it.
            Err(_) if number + 1 == count && !text.ends_with('\n') => {
                eprintln!(
                    "{}:{}: skipped an incomplete last line",
                    path.display(),
                    number + 1
                );
                continue;
            }
            Err(err) => anyhow::bail!("{}:{}: {err}", path.display(), number + 1),
        };
        let field = |name: &str| value.get(name).and_then(serde_json::Value::as_f64);
        let Some(step) = field("step") else { continue };
        match value.get("kind").and_then(serde_json::Value::as_str) {
            Some("step") => {
                if let (Some(loss), Some(lr)) = (field("loss"), field("lr")) {
                    curves.loss.push((step, loss));
                    curves.lr.push((step, lr));
                }
            }
            Some("eval") => curves
                .val_loss
                .extend(field("val_loss").map(|loss| (step, loss))),
            _ => {}
        }
    }
    if curves.loss.is_empty() {
        anyhow::bail!("{} holds no training steps", path.display());
    }
    Ok(curves)
}

/// Draws the curves of `run` into `out` (default `RUN/curves.svg`) and returns its path.
pub fn plot(run: &Path, out: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let curves = read(run)?;
    let out = out.unwrap_or_else(|| run.join("curves.svg"));
    draw(&curves, run, &out)?;
    Ok(out)
}

fn draw(curves: &Curves, run: &Path, out: &Path) -> anyhow::Result<()> {
    let root = SVGBackend::new(out, (900, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(440);
    let last_step = curves.loss.last().map_or(1.0, |(step, _)| *step).max(1.0);

    let losses = curves
        .loss
        .iter()
        .chain(&curves.val_loss)
        .map(|(_, loss)| *loss);
    let (low, high) = losses.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    let mut chart = ChartBuilder::on(&top)
        .caption(format!("loss: {}", run.display()), ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..last_step, (low * 0.95)..(high * 1.05))?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("loss")
        .draw()?;
    chart
        .draw_series(LineSeries::new(curves.loss.iter().copied(), &BLUE))?
        .label("train")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLUE));
    if !curves.val_loss.is_empty() {
        chart
            .draw_series(LineSeries::new(
                curves.val_loss.iter().copied(),
                RED.stroke_width(2),
            ))?
            .label("validation")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], RED));
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()?;

    let peak = curves
        .lr
        .iter()
        .map(|(_, lr)| *lr)
        .fold(0.0, f64::max)
        .max(f64::MIN_POSITIVE);
    let mut chart = ChartBuilder::on(&bottom)
        .caption("learning rate", ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..last_step, 0.0..peak * 1.05)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_label_formatter(&|lr| format!("{lr:.1e}"))
        .draw()?;
    chart.draw_series(LineSeries::new(curves.lr.iter().copied(), &GREEN))?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_last_line_is_skipped_and_a_bad_line_before_it_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let step = r#"{"kind":"step","step":1,"loss":5.5,"lr":0.001}"#;
        std::fs::write(&path, format!("{step}\n{{\"kind\":\"st")).unwrap();
        let curves = read(dir.path()).unwrap();
        assert_eq!(curves.loss, [(1.0, 5.5)]);
        std::fs::write(&path, format!("{step}\n{{\"kind\"\n{step}\n")).unwrap();
        let err = read(dir.path()).err().unwrap().to_string();
        assert!(err.starts_with(&format!("{}:2: ", path.display())), "{err}");
    }
}
