//! `lmx bench`: lmx measured side by side with the Python MLX anchors, in one invocation.

mod anchor;
pub mod chart;
mod curves;
pub mod generate;
pub mod report;
pub mod train;

use clap::Subcommand;

/// What to measure.
#[derive(Subcommand)]
pub enum BenchCommand {
    /// The reference GPT's training step (models/gpt2.lmx at the anchors' configs).
    Train(train::BenchArgs),
    /// Generation speed of the bundled GPT-2 and LLaMA, prompt and decode (greedy, random weights).
    Generate(generate::GenerateBenchArgs),
    /// The tables (and plot) of `bench train` again, from the runs it wrote with `--json`.
    Report(report::ReportArgs),
}

/// Runs one benchmark.
pub fn run(command: &BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Train(args) => train::bench(args),
        BenchCommand::Generate(args) => generate::bench(args),
        BenchCommand::Report(args) => report::report(args),
    }
}
