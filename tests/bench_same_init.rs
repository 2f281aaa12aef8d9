//! Training parity with the independent reference: `lmx bench train --same-init` at tiny hands
//! lmx's initial parameters and batch to the Python MLX anchor (bench/anchor_same_init.py), and
//! the two loss curves must agree step by step in float32 to a relative 1e-3 over 20 steps.
//!
//! Python MLX (the `mlx` and `mlx-cpu` wheels of the MLX lmx builds against) is installed once
//! with pip under the target directory, as the build fetches MLX's own wheel.

use std::path::{Path, PathBuf};
use std::process::Command;

// The build's pip logic: the same interpreter (`PYTHON`, else python3) and pip options.
#[path = "../mlx-sys/build/python.rs"]
#[allow(dead_code)]
mod python;

/// The MLX that mlx-sys pins (mlx-sys/build/mlx_install.rs).
const MLX_VERSION: &str = "0.32.2";

/// Relative difference allowed between the two curves at every step.
const TOLERANCE: f64 = 1e-3;

/// A folder holding Python MLX, installed on first use: into a staging folder renamed into place,
/// so that a run cut short or a concurrent one never leaves a half-installed package behind.
fn python_mlx() -> PathBuf {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("python-mlx-{MLX_VERSION}"));
    if root.join("mlx").is_dir() {
        return root;
    }
    let staging = root.with_extension(format!("partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    let requirements = [
        format!("mlx=={MLX_VERSION}"),
        format!("mlx-cpu=={MLX_VERSION}"),
    ];
    let requirements: Vec<&str> = requirements.iter().map(String::as_str).collect();
    if let Err(error) = python::pip_install(&requirements, &staging, false) {
        panic!(
            "installing Python MLX with pip into {}: {error}",
            staging.display()
        );
    }
    // Another test process may have got there first: then its copy is as good as this one.
    if std::fs::rename(&staging, &root).is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    assert!(
        root.join("mlx").is_dir(),
        "no Python MLX in {}",
        root.display()
    );
    root
}

/// Every step's loss of each side of `lmx bench train --json`, lmx's first.
fn curves(json: &Path) -> (Vec<f64>, Vec<f64>) {
    let text = std::fs::read_to_string(json).unwrap();
    let losses = |implementation: &str| -> Vec<f64> {
        let row = text
            .lines()
            .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
            .find(|row| row["impl"] == implementation)
            .unwrap_or_else(|| panic!("no {implementation} row in {text}"));
        row["losses"]
            .as_array()
            .unwrap_or_else(|| panic!("the {implementation} row has no losses: {row}"))
            .iter()
            .map(|loss| loss.as_f64().unwrap())
            .collect()
    };
    (losses("lmx"), losses("python-mlx"))
}

#[test]
fn tiny_trains_as_python_mlx_from_the_same_start() {
    let site = python_mlx();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("runs.jsonl");
    let anchor = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/anchor_same_init.py");
    let output = Command::new(env!("CARGO_BIN_EXE_lmx"))
        .args(["bench", "train", "--configs", "tiny", "--modes", "compiled"])
        .args(["--dtypes", "float32", "--batch", "4", "--seq", "64"])
        .args(["--steps", "20", "--warmup", "0", "--same-init", "--anchor"])
        .arg(&anchor)
        .arg("--python")
        .arg(python::interpreter())
        .arg("--json")
        .arg(&json)
        .env("PYTHONPATH", &site)
        .output()
        .expect("lmx runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "lmx bench train --same-init failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("largest relative difference"), "{stdout}");

    let (lmx, anchor) = curves(&json);
    assert_eq!(lmx.len(), 20, "{stdout}");
    assert_eq!(anchor.len(), 20, "{stdout}");
    for (step, (ours, theirs)) in lmx.iter().zip(&anchor).enumerate() {
        let difference = ((ours - theirs) / theirs).abs();
        assert!(
            difference <= TOLERANCE,
            "step {}: lmx's loss {ours} and Python MLX's {theirs} differ by {difference:e} \
             (relative), over {TOLERANCE:e}:\n{stdout}",
            step + 1
        );
    }
    // Both trained: a curve that stays put would agree with anything that also stays put.
    assert!(
        lmx[19] < lmx[0] - 0.1,
        "lmx's loss went from {} to {} in 20 steps:\n{stdout}",
        lmx[0],
        lmx[19]
    );
}
