//! Running a Python anchor beside lmx: on the same device and, on the CPU, with the same BLAS.

use lmx::runtime::device::{default_kind, DeviceKind};
use lmx::runtime::platform;
use std::process::Command;

/// The device lmx computes on, as the anchors' `--device` flag names it.
pub fn device_name() -> &'static str {
    match default_kind() {
        Ok(DeviceKind::Gpu) => "gpu",
        _ => "cpu",
    }
}

/// Runs `command` (a Python anchor, `what` in messages) and returns what it printed. On the CPU
/// the anchor gets the BLAS this process loaded (`LD_PRELOAD`), so both sides multiply matrices
/// with the same library.
pub fn output_of(mut command: Command, what: &str) -> anyhow::Result<String> {
    if device_name() == "cpu" {
        if let Some(blas) = platform::blas_library() {
            command.env("LD_PRELOAD", blas);
        }
    }
    let python = command.get_program().to_string_lossy().into_owned();
    let output = command
        .output()
        .map_err(|err| anyhow::anyhow!("cannot run {python}: {err}"))?;
    if !output.status.success() {
        anyhow::bail!(
            "the anchor ({what}) failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The JSON lines of what a benchmark process printed, last first: its results are the last
/// lines, whatever it printed before them.
pub fn json_lines_last_first(stdout: &str) -> impl Iterator<Item = &str> {
    stdout.lines().rev().filter(|line| line.starts_with('{'))
}
