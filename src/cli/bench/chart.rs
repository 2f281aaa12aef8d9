//! `lmx bench train --plot`: the lmx/anchor speedup of every row as a bar chart, in SVG.

use super::report::Measured;
use plotters::prelude::*;
use std::path::Path;

/// Draws one bar per row measured beside the anchor: anchor ms / lmx ms, with parity marked.
pub fn speedups(rows: &[Measured], out: &Path) -> anyhow::Result<()> {
    let bars: Vec<(String, f64)> = rows
        .iter()
        .filter_map(|row| {
            let anchor = row.anchor.as_ref()?;
            let label = format!(
                "{} {} {}",
                row.ours.config,
                if row.ours.compile { "comp." } else { "eager" },
                if row.ours.dtype == "bfloat16" {
                    "bf16"
                } else {
                    "f32"
                }
            );
            Some((label, anchor.median_ms / row.ours.median_ms))
        })
        .collect();
    if bars.is_empty() {
        anyhow::bail!("--plot needs rows measured beside the anchor (--anchor)");
    }
    let top = bars.iter().map(|(_, speedup)| *speedup).fold(1.0, f64::max) * 1.15;
    let root =
        SVGBackend::new(out, ((160 + 110 * bars.len() as u32).max(640), 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let device = rows.first().map_or("", |row| row.ours.device.as_str());
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("lmx vs Python MLX, training step ({device}): anchor ms / lmx ms"),
            ("sans-serif", 18),
        )
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..bars.len() as f64, 0.0..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(bars.len() * 2 + 1)
        .x_label_formatter(&|x| {
            let index = x.floor() as usize;
            let centred = (x - index as f64 - 0.5).abs() < 0.01;
            match bars.get(index) {
                Some((label, _)) if centred => label.clone(),
                _ => String::new(),
            }
        })
        .y_desc("speedup")
        .draw()?;
    chart.draw_series(bars.iter().enumerate().map(|(index, (_, speedup))| {
        let colour = if *speedup >= 1.0 {
            GREEN.mix(0.7)
        } else {
            RED.mix(0.7)
        };
        Rectangle::new(
            [(index as f64 + 0.15, 0.0), (index as f64 + 0.85, *speedup)],
            colour.filled(),
        )
    }))?;
    chart.draw_series(bars.iter().enumerate().map(|(index, (_, speedup))| {
        Text::new(
            format!("{speedup:.2}x"),
            (index as f64 + 0.3, *speedup + top * 0.03),
            ("sans-serif", 14),
        )
    }))?;
    chart.draw_series(LineSeries::new(
        [(0.0, 1.0), (bars.len() as f64, 1.0)],
        BLACK.stroke_width(1),
    ))?;
    root.present()?;
    Ok(())
}
