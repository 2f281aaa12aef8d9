//! `lmx check`, `lmx count`, `lmx info`, `lmx models`: what the checker says about a model.

use super::registry::Registry;
use lmx_grammar::ir::PresetValues;
use lmx_grammar::report::{report, report_values, Report, ReportError};
use lmx_grammar::CheckedModel;

/// Checks `model`; on success prints its report for `preset` at `batch` x `seq`.
pub fn check(
    registry: &Registry,
    model: &str,
    preset: Option<&str>,
    batch: u64,
    seq: Option<u64>,
) -> anyhow::Result<()> {
    let checked = checked(registry, model)?;
    let preset = preset.unwrap_or("default");
    let report = report(&checked, preset, batch, seq).map_err(|err| anyhow::anyhow!("{err}"))?;
    println!("{}: ok\n", checked.name);
    print_report(&report);
    print_steps(model, &checked);
    print_shapes(&report);
    Ok(())
}

/// Each step the model declares, what it reads beside the trained parameters and reports, and
/// the command that trains it (`--step NAME`; the first is the default).
fn print_steps(model: &str, checked: &CheckedModel) {
    if checked.steps.is_empty() {
        return;
    }
    println!("\nsteps");
    for (i, step) in checked.steps.iter().enumerate() {
        let mut notes = Vec::new();
        if !step.frozen.is_empty() {
            let names: Vec<&str> = step.frozen.iter().map(|f| f.name.as_str()).collect();
            notes.push(format!("frozen {}", names.join(", ")));
        }
        if !step.reported.is_empty() {
            notes.push(format!("metrics {}", step.reported.join(", ")));
        }
        let mut command = format!("lmx train --model {model}");
        match i {
            0 => notes.insert(0, "default".to_owned()),
            _ => command.push_str(&format!(" --step {}", step.name)),
        }
        // A step named as the built-in DPO reads its preference pairs.
        if i > 0 && step.name == "dpo" {
            command.push_str(" --data PAIRS.jsonl");
        }
        let notes = match notes.is_empty() {
            true => String::new(),
            false => format!(" ({})", notes.join("; ")),
        };
        println!("  {}{notes}: {command}", step.name);
    }
}

/// Prints the parameter count of `model` for `preset`, or for every preset.
pub fn count(registry: &Registry, model: &str, preset: Option<&str>) -> anyhow::Result<()> {
    let checked = checked(registry, model)?;
    let presets: Vec<&PresetValues> = match preset {
        Some(name) => vec![checked
            .preset(name)
            .ok_or_else(|| anyhow::anyhow!("{}", ReportError::UnknownPreset(name.to_owned())))?],
        None => checked.presets.iter().collect(),
    };
    // Each preset's values directly: looking each up by name made this quadratic in presets.
    for preset in presets {
        let config = format!("preset `{}`", preset.name);
        let report = report_values(&checked, &config, &preset.values, 1, None)
            .map_err(|err| anyhow::anyhow!("{err}"))?;
        println!(
            "{:<12} {:>16} parameters",
            preset.name,
            group_digits(report.param_count)
        );
    }
    Ok(())
}

/// Prints what `model` is: presets, and the report of `preset`.
pub fn info(registry: &Registry, model: &str, preset: Option<&str>) -> anyhow::Result<()> {
    let checked = checked(registry, model)?;
    let names: Vec<&str> = checked
        .presets
        .iter()
        .map(|preset| preset.name.as_str())
        .collect();
    println!("model   {}\npresets {}\n", checked.name, names.join(", "));
    let report = report(&checked, preset.unwrap_or("default"), 1, None)
        .map_err(|err| anyhow::anyhow!("{err}"))?;
    print_report(&report);
    Ok(())
}

/// Lists the registered models (each with its `.lmx` file, or `(Rust)` for one written under
/// `#[lmx::model]`) and their presets, then any registered source without a training step.
pub fn models(registry: &Registry) -> anyhow::Result<()> {
    let file_of = |name: &str| {
        registry
            .all_sources()
            .iter()
            .find(|(model, _, _)| *model == name)
            .map(|(_, file, _)| *file)
    };
    for model in registry.registered() {
        let file = file_of(model.name).unwrap_or("(Rust)");
        let presets = (model.presets)().join(", ");
        println!("{:<10} {file:<22} presets: {presets}", model.name);
    }
    for (name, file, _) in registry.all_sources() {
        if registry.step(name).is_some() {
            continue;
        }
        let checked = checked(registry, name)?;
        let presets: Vec<&str> = checked
            .presets
            .iter()
            .map(|preset| preset.name.as_str())
            .collect();
        println!("{name:<10} {file:<22} presets: {}", presets.join(", "));
    }
    Ok(())
}

fn checked(registry: &Registry, model: &str) -> anyhow::Result<CheckedModel> {
    let (file, source) = source(registry, model)?;
    lmx_grammar::check_source(&file, &source).map_err(|rendered| anyhow::anyhow!("{rendered}"))
}

/// The file name and source of `model`: a registered source's name, or a path to a `.lmx` file.
fn source(registry: &Registry, model: &str) -> anyhow::Result<(String, String)> {
    let sources = registry.all_sources();
    if let Some((_, file, source)) = sources.iter().find(|(name, _, _)| *name == model) {
        return Ok((file.to_string(), source.to_string()));
    }
    if model.ends_with(".lmx") {
        let source = std::fs::read_to_string(model)
            .map_err(|err| anyhow::anyhow!("cannot read {model}: {err}"))?;
        return Ok((model.to_owned(), source));
    }
    let names: Vec<&str> = sources.iter().map(|(name, _, _)| *name).collect();
    anyhow::bail!(
        "no model `{model}`: the registered models are {}, or give a path to a .lmx file",
        names.join(", ")
    )
}

fn print_report(report: &Report) {
    println!("preset            {}", report.preset);
    println!("parameters        {}", group_digits(report.param_count));
    if report.trainable_count + report.buffer_count < report.param_count {
        // Where a model has adapters only they train; elsewhere the `frozen` marks say.
        let adapters = report.params.iter().any(|p| p.name.ends_with(".lora_a"));
        println!(
            "trainable         {} ({}; {} frozen)",
            group_digits(report.trainable_count),
            if adapters {
                "adapters"
            } else {
                "`frozen` marks"
            },
            group_digits(report.param_count - report.trainable_count - report.buffer_count)
        );
    }
    if report.buffer_count > 0 {
        let written = match report.buffer_writers.as_slice() {
            [] => "written by no step".to_string(),
            steps => format!("written by step {} after each update", steps.join(", ")),
        };
        println!(
            "buffers           {} ({written}; no gradients, no optimizer state)",
            group_digits(report.buffer_count)
        );
    }
    for frozen in &report.frozen {
        println!(
            "frozen            {} (step {}): {}, {} parameters, {} (no gradients, no optimizer state)",
            frozen.name,
            frozen.step,
            frozen.architecture,
            group_digits(frozen.param_count),
            bytes(frozen.bytes)
        );
    }
    println!(
        "FLOPs per token   {} (6N + 12LdT: {})",
        group_digits(report.flops_per_token),
        group_digits(report.flops_per_token_6n)
    );
    let memory = &report.memory;
    println!(
        "training memory   {} at batch {} x {} (parameters {}, gradients {}, optimizer {}, activations {}{})",
        bytes(memory.total()),
        report.batch,
        report.seq,
        bytes(memory.parameters),
        bytes(memory.gradients),
        bytes(memory.optimizer),
        bytes(memory.activations),
        match memory.frozen {
            0 => String::new(),
            frozen => format!(", frozen models {}", bytes(frozen)),
        }
    );
}

/// Every parameter's name and shape.
fn print_shapes(report: &Report) {
    println!();
    for param in &report.params {
        let shape: Vec<String> = param.shape.iter().map(u64::to_string).collect();
        println!("  {:<48} [{}]", param.name, shape.join(", "));
    }
}

/// `1234567` as `1,234,567`.
pub fn group_digits(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

pub fn bytes(value: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut size = value as f64;
    let mut unit = 0;
    while size >= 1024.0 && unit + 1 < UNITS.len() {
        size /= 1024.0;
        unit += 1;
    }
    format!("{size:.1} {}", UNITS[unit])
}
