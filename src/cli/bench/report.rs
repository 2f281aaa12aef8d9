//! The tables of `lmx bench train`, from its runs: printed at the end of an invocation, or later
//! from the JSON lines it wrote (`lmx bench report`), an interrupted invocation's included.

use super::train::Row;
use std::path::{Path, PathBuf};

/// Tables (and a plot) from runs saved by `lmx bench train --json`.
#[derive(clap::Args)]
pub struct ReportArgs {
    /// JSON-lines files of `lmx bench train --json`; their runs are pooled.
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    /// Also draw the lmx/anchor speedups of the rows to this SVG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

/// Prints the tables of the runs in `args.runs` (and draws the plot).
pub fn report(args: &ReportArgs) -> anyhow::Result<()> {
    let mut runs = Vec::new();
    for path in &args.runs {
        runs.extend(read_runs(path)?);
    }
    let rows = rows_of(&runs);
    if rows.is_empty() {
        anyhow::bail!("no lmx run in {}", display_all(&args.runs));
    }
    print(&rows);
    if let Some(path) = &args.plot {
        super::chart::speedups(&rows, path)?;
    }
    Ok(())
}

fn display_all(paths: &[PathBuf]) -> String {
    let names: Vec<String> = paths
        .iter()
        .map(|path| path.display().to_string())
        .collect();
    names.join(", ")
}

/// The runs of one JSON-lines file; blank lines are skipped, any other line must be a run.
fn read_runs(path: &Path) -> anyhow::Result<Vec<Row>> {
    let text = std::fs::read_to_string(path)
        .map_err(|err| anyhow::anyhow!("cannot read {}: {err}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(index, line)| {
            serde_json::from_str(line).map_err(|err| {
                anyhow::anyhow!(
                    "{}:{}: not a run of `lmx bench train --json`: {err}",
                    path.display(),
                    index + 1
                )
            })
        })
        .collect()
}

/// One row of the tables: the median of lmx's runs, and of the anchor's when it ran.
pub struct Measured {
    /// lmx: the run of median speed, with the median of the runs' peaks.
    pub ours: Row,
    /// The Python MLX anchor, likewise.
    pub anchor: Option<Row>,
    /// How many runs of lmx the row has.
    pub runs: usize,
    /// The fastest and slowest of lmx's runs, ms per step.
    pub ours_range: (f64, f64),
    /// The fastest and slowest of the anchor's runs.
    pub anchor_range: Option<(f64, f64)>,
    /// The lowest and highest peak of lmx's runs, MiB.
    pub ours_peaks: Option<(f64, f64)>,
    /// The lowest and highest peak of the anchor's runs.
    pub anchor_peaks: Option<(f64, f64)>,
}

impl Measured {
    /// The row of lmx's `ours` (at least one run) beside the anchor's `anchors`.
    fn new(ours: &[Row], anchors: &[Row]) -> Self {
        let peak = |row: &Row| row.peak_mib;
        Measured {
            ours: median_run(ours).expect("at least one run"),
            anchor: median_run(anchors),
            runs: ours.len(),
            ours_range: range(ours, |row| Some(row.median_ms)).expect("at least one run"),
            anchor_range: range(anchors, |row| Some(row.median_ms)),
            ours_peaks: range(ours, peak),
            anchor_peaks: range(anchors, peak),
        }
    }
}

/// What makes runs one row: the same measurement of the same step. lmx's run order is not part
/// of it, so the anchor's runs (which have none) stand beside lmx's in every order.
fn same_step(a: &Row, b: &Row) -> bool {
    (&a.device, &a.config, a.batch, a.seq, &a.dtype, a.compile)
        == (&b.device, &b.config, b.batch, b.seq, &b.dtype, b.compile)
}

/// `runs` made into rows, in the order of their first lmx run: one per step and lmx run order,
/// with the anchor's runs of the same step beside it.
pub fn rows_of(runs: &[Row]) -> Vec<Measured> {
    let is_ours = |run: &&Row| run.implementation == "lmx";
    let mut groups: Vec<Vec<Row>> = Vec::new();
    for run in runs.iter().filter(is_ours) {
        let group = groups
            .iter_mut()
            .find(|group| same_step(&group[0], run) && group[0].overlap == run.overlap);
        match group {
            Some(group) => group.push(run.clone()),
            None => groups.push(vec![run.clone()]),
        }
    }
    groups
        .iter()
        .map(|ours| {
            let anchors: Vec<Row> = runs
                .iter()
                .filter(|run| !is_ours(run) && same_step(run, &ours[0]))
                .cloned()
                .collect();
            Measured::new(ours, &anchors)
        })
        .collect()
}

/// The lowest and highest `field` of `runs`, where every run has it.
fn range(runs: &[Row], field: impl Fn(&Row) -> Option<f64>) -> Option<(f64, f64)> {
    let values: Option<Vec<f64>> = runs.iter().map(field).collect();
    let values = values?;
    let low = values.iter().copied().min_by(f64::total_cmp)?;
    let high = values.iter().copied().max_by(f64::total_cmp)?;
    Some((low, high))
}

/// The run whose `median_ms` is the median of `runs` (the lower middle one for an even count),
/// carrying the median of the runs' peaks: on CUDA a run's peak depends on how far the host ran
/// ahead of the device, so one run's peak is not the row's.
fn median_run(runs: &[Row]) -> Option<Row> {
    let lower_middle = |len: usize| (len.max(1) - 1) / 2;
    let mut sorted: Vec<&Row> = runs.iter().collect();
    sorted.sort_by(|a, b| a.median_ms.total_cmp(&b.median_ms));
    let mut row = (*sorted.get(lower_middle(sorted.len()))?).clone();
    let mut peaks: Vec<f64> = runs.iter().filter_map(|run| run.peak_mib).collect();
    peaks.sort_by(f64::total_cmp);
    row.peak_mib = peaks.get(lower_middle(peaks.len())).copied();
    Some(row)
}

/// Every table: the rows, where each side's host time goes, how far repeated runs spread, and
/// the compile table.
pub fn print(rows: &[Measured]) {
    print_table(rows);
    print_breakdown(rows);
    if rows.iter().any(|row| row.runs > 1) {
        print_spread(rows);
    }
    print_compile_table(rows);
}

fn print_table(rows: &[Measured]) {
    println!(
        "{:<8} {:<9} {:<9} {:>10} {:>10} {:>8} {:>11} {:>6} {:>17} {:>9} {:>9}",
        "config",
        "mode",
        "dtype",
        "lmx ms",
        "anchor ms",
        "speedup",
        "lmx tok/s",
        "MFU",
        "loss first→last",
        "lmx MiB",
        "anchor MiB"
    );
    for Measured { ours, anchor, .. } in rows {
        let anchor_field = |field: fn(&Row) -> Option<f64>, digits: usize| {
            anchor
                .as_ref()
                .and_then(field)
                .map_or("-".to_string(), |value| format!("{value:.digits$}"))
        };
        let speedup = anchor.as_ref().map_or("-".to_string(), |anchor| {
            format!("{:.2}x", anchor.median_ms / ours.median_ms)
        });
        println!(
            "{:<8} {:<9} {:<9} {:>10.3} {:>10} {:>8} {:>11.0} {:>5.1}% {:>8.3}→{:<8.3} {:>9.1} {:>9}",
            ours.config,
            if ours.compile { "compiled" } else { "eager" },
            ours.dtype,
            ours.median_ms,
            anchor_field(|row| Some(row.median_ms), 3),
            speedup,
            ours.tokens_per_s,
            ours.mfu * 100.0,
            ours.loss_first,
            ours.loss_last,
            ours.peak_mib.unwrap_or(f64::NAN),
            anchor_field(|row| row.peak_mib, 1),
        );
    }
}

/// Where the host's time per step goes on each side (medians over the timed steps of the median
/// run): lmx's graph building, handing the step to the device and waiting for it; the anchor's
/// time inside `mx.eval` (handing over and waiting) and the rest of its step (building the graph,
/// in Python), its median step less its median inside `mx.eval`.
fn print_breakdown(rows: &[Measured]) {
    println!(
        "\n{:<32} {:>9} {:>9} {:>9} {:>9} {:>11} {:>11} {:>13}",
        "ms per step", "lmx", "build", "submit", "wait", "anchor", "in mx.eval", "rest (diff)"
    );
    let ms = |value: Option<f64>| value.map_or("-".to_string(), |value| format!("{value:.3}"));
    for row in rows {
        let ours = &row.ours;
        let anchor = row.anchor.as_ref();
        let rest = anchor.and_then(|anchor| Some(anchor.median_ms - anchor.eval_ms?));
        println!(
            "{:<32} {:>9.3} {:>9} {:>9} {:>9} {:>11} {:>11} {:>13}",
            row_name(ours),
            ours.median_ms,
            ms(ours.build_ms),
            ms(ours.submit_ms),
            ms(ours.wait_ms),
            ms(anchor.map(|anchor| anchor.median_ms)),
            ms(anchor.and_then(|anchor| anchor.eval_ms)),
            ms(rest),
        );
    }
}

/// `config mode dtype order`, naming a row in the second tables (the order is lmx's
/// `--overlap`).
fn row_name(row: &Row) -> String {
    let mode = if row.compile { "compiled" } else { "eager" };
    let order = row.overlap.as_deref().unwrap_or("-");
    format!("{} {mode} {} {order}", row.config, row.dtype)
}

/// How far the repeated runs of each row spread, and where each side's loss ended (the two train
/// alike, so the last losses should be close).
fn print_spread(rows: &[Measured]) {
    println!(
        "\n{:<32} {:>4} {:>17} {:>17} {:>21} {:>19} {:>19}",
        "over the runs",
        "runs",
        "lmx ms min–max",
        "anchor ms min–max",
        "last loss lmx/anchor",
        "lmx MiB min–max",
        "anchor MiB min–max"
    );
    let spread = |range: Option<(f64, f64)>, digits: usize| {
        range.map_or("-".to_string(), |(low, high)| {
            format!("{low:.digits$}–{high:.digits$}")
        })
    };
    for row in rows {
        let name = row_name(&row.ours);
        let anchor_ms = spread(row.anchor_range, 3);
        let anchor_loss = row
            .anchor
            .as_ref()
            .map_or("-".to_string(), |anchor| format!("{:.4}", anchor.loss_last));
        println!(
            "{name:<32} {:>4} {:>17} {anchor_ms:>17} {:>21} {:>19} {:>19}",
            row.runs,
            spread(Some(row.ours_range), 3),
            format!("{:.4}/{anchor_loss}", row.ours.loss_last),
            spread(row.ours_peaks, 1),
            spread(row.anchor_peaks, 1)
        );
    }
}

/// The seed's compile table: eager and compiled ms per step and their ratio, for every config and
/// precision measured both ways.
fn print_compile_table(rows: &[Measured]) {
    let find = |config: &str, dtype: &str, compile: bool| {
        rows.iter().find(|row| {
            row.ours.config == config && row.ours.dtype == dtype && row.ours.compile == compile
        })
    };
    let mut printed_header = false;
    for compiled in rows.iter().filter(|row| row.ours.compile) {
        let Some(eager) = find(&compiled.ours.config, &compiled.ours.dtype, false) else {
            continue;
        };
        if !printed_header {
            println!(
                "\n{:<8} {:<9} {:>12} {:>12} {:>8} {:>12} {:>12} {:>8}",
                "config",
                "dtype",
                "lmx eager",
                "lmx comp.",
                "speedup",
                "anchor eager",
                "anchor comp.",
                "speedup"
            );
            printed_header = true;
        }
        let anchor = match (&eager.anchor, &compiled.anchor) {
            (Some(eager), Some(compiled)) => format!(
                "{:>12.3} {:>12.3} {:>7.2}x",
                eager.median_ms,
                compiled.median_ms,
                eager.median_ms / compiled.median_ms
            ),
            _ => format!("{:>12} {:>12} {:>8}", "-", "-", "-"),
        };
        println!(
            "{:<8} {:<9} {:>12.3} {:>12.3} {:>7.2}x {}",
            compiled.ours.config,
            compiled.ours.dtype,
            eager.ours.median_ms,
            compiled.ours.median_ms,
            eager.ours.median_ms / compiled.ours.median_ms,
            anchor
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(implementation: &str, config: &str, median_ms: f64, peak_mib: f64) -> Row {
        Row {
            implementation: implementation.into(),
            device: "gpu".into(),
            config: config.into(),
            batch: 16,
            seq: 256,
            dtype: "bfloat16".into(),
            compile: true,
            params: 1,
            median_ms,
            tokens_per_s: 1.0,
            mfu: 0.0,
            loss_first: 6.0,
            loss_last: 3.0,
            peak_mib: Some(peak_mib),
            build_ms: None,
            submit_ms: None,
            wait_ms: None,
            eval_ms: None,
            losses: None,
            repeat: 0,
            overlap: (implementation == "lmx").then(|| "submit".into()),
            state: None,
        }
    }

    #[test]
    fn a_row_is_the_run_of_median_speed_with_the_median_of_the_peaks() {
        let runs = [
            run("lmx", "medium", 15.1, 8829.2),
            run("lmx", "medium", 14.9, 6596.9),
            run("lmx", "medium", 17.6, 6394.6),
        ];
        let row = Measured::new(&runs, &[]);
        assert_eq!(row.ours.median_ms, 15.1);
        assert_eq!(row.ours.peak_mib, Some(6596.9));
        assert_eq!(row.ours_range, (14.9, 17.6));
        assert_eq!(row.ours_peaks, Some((6394.6, 8829.2)));
        assert_eq!(row.runs, 3);
        assert!(row.anchor.is_none() && row.anchor_peaks.is_none());
        // Two runs: the lower middle of each.
        let row = Measured::new(&runs[..2], &[]);
        assert_eq!(
            (row.ours.median_ms, row.ours.peak_mib),
            (14.9, Some(6596.9))
        );
    }

    #[test]
    fn runs_make_one_row_per_step_and_order_with_the_anchor_beside_each() {
        let build = Row {
            overlap: Some("build".into()),
            ..run("lmx", "gpt2", 37.7, 15_561.0)
        };
        let eager = Row {
            compile: false,
            ..run("lmx", "tiny", 4.1, 48.6)
        };
        let runs = [
            run("lmx", "tiny", 2.8, 59.5),
            run("python-mlx", "tiny", 2.9, 62.0),
            eager,
            run("lmx", "gpt2", 34.4, 16_199.3),
            run("python-mlx", "gpt2", 52.4, 22_580.4),
            run("lmx", "tiny", 2.1, 52.0),
            run("python-mlx", "tiny", 2.8, 61.3),
            build,
        ];
        let rows = rows_of(&runs);
        // config, compiled, order, lmx's runs, the anchor's median ms
        type Summary<'a> = (&'a str, bool, Option<&'a str>, usize, Option<f64>);
        let summary: Vec<Summary> = rows
            .iter()
            .map(|row| {
                (
                    row.ours.config.as_str(),
                    row.ours.compile,
                    row.ours.overlap.as_deref(),
                    row.runs,
                    row.anchor.as_ref().map(|anchor| anchor.median_ms),
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("tiny", true, Some("submit"), 2, Some(2.8)),
                ("tiny", false, Some("submit"), 1, None),
                ("gpt2", true, Some("submit"), 1, Some(52.4)),
                ("gpt2", true, Some("build"), 1, Some(52.4)),
            ]
        );
        assert_eq!(rows[0].ours.median_ms, 2.1);
        assert_eq!(rows[0].anchor_range, Some((2.8, 2.9)));
    }

    #[test]
    fn a_line_that_is_not_a_run_is_named_by_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.jsonl");
        let good = serde_json::to_string(&run("lmx", "tiny", 2.8, 59.5)).unwrap();
        std::fs::write(&path, format!("{good}\n\nconfig   mode\n")).unwrap();
        let message = read_runs(&path).unwrap_err().to_string();
        let expected = format!(
            "{}:3: not a run of `lmx bench train --json`",
            path.display()
        );
        assert!(message.starts_with(&expected), "{message}");
        std::fs::write(&path, format!("{good}\n\n{good}\n")).unwrap();
        assert_eq!(read_runs(&path).unwrap().len(), 2);
    }
}
