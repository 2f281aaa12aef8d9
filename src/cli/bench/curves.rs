//! `lmx bench train --same-init`: lmx's starting point handed to the anchor, and the two loss
//! curves set side by side.
//!
//! lmx writes its parameters after initialisation (before step 1) and the batch it trains on to
//! one safetensors file: the parameters under their dotted names (`h.0.attn.c_attn.weight`, in
//! the dtype they are kept in, weights `[out, in]` as MLX's `nn.Linear` stores them), the batch as
//! `batch.inputs` and `batch.targets` (`[batch, seq]` int32, every window of the data). The anchor
//! (bench/anchor_same_init.py) loads them into its own module tree and trains as it always does.

use lmx::runtime::data::Windows;
use lmx::runtime::tree::{self, Tree};
use lmx::runtime::Array;
use std::path::Path;

use super::train::Row;

/// Writes `params` and every window of `windows` to the safetensors file `path`.
pub fn save_start<P: Tree<Array>>(
    path: &Path,
    params: &P,
    windows: &Windows,
) -> anyhow::Result<()> {
    let (count, seq) = (windows.count(), windows.seq_len());
    let mut inputs = vec![0; count * seq];
    let mut targets = vec![0; count * seq];
    for (index, (inputs, targets)) in inputs
        .chunks_exact_mut(seq)
        .zip(targets.chunks_exact_mut(seq))
        .enumerate()
    {
        windows.read(index, inputs, targets)?;
    }
    let shape = [count as i32, seq as i32];
    let mut named: Vec<(String, Array)> = tree::names(params)
        .into_iter()
        .zip(tree::flatten(params))
        .collect();
    named.push(("batch.inputs".into(), Array::from_slice(&inputs, &shape)));
    named.push(("batch.targets".into(), Array::from_slice(&targets, &shape)));
    Array::save_safetensors(named, None, path)
        .map_err(|err| anyhow::anyhow!("cannot write {}: {err}", path.display()))
}

/// Prints lmx's and the anchor's losses step by step with their relative difference, and the
/// largest difference.
pub fn print(ours: &Row, theirs: &Row) -> anyhow::Result<()> {
    let (Some(lmx), Some(anchor)) = (&ours.losses, &theirs.losses) else {
        anyhow::bail!(
            "--same-init needs every step's loss from both sides; the anchor printed none \
             (use bench/anchor_same_init.py)"
        );
    };
    if lmx.len() != anchor.len() {
        anyhow::bail!(
            "lmx trained {} steps and the anchor {}: the curves cannot be compared",
            lmx.len(),
            anchor.len()
        );
    }
    println!(
        "\n{} {} {}: same initial parameters, same batch",
        ours.config,
        ours.dtype,
        if ours.compile { "compiled" } else { "eager" }
    );
    println!(
        "{:>5} {:>12} {:>12} {:>10}",
        "step", "lmx", "python-mlx", "rel diff"
    );
    let mut largest = 0.0_f64;
    for (step, (ours, theirs)) in lmx.iter().zip(anchor).enumerate() {
        let difference = relative_difference(*ours, *theirs);
        largest = largest.max(difference);
        println!(
            "{:>5} {ours:>12.6} {theirs:>12.6} {difference:>10.2e}",
            step + 1
        );
    }
    println!("largest relative difference: {largest:.2e}");
    Ok(())
}

/// `|a - b| / |b|`; infinite where the two differ and that is not a number (a NaN loss, or
/// `b` 0), so that the largest difference cannot hide it.
fn relative_difference(a: f64, b: f64) -> f64 {
    let difference = ((a - b) / b).abs();
    match a == b {
        true => 0.0,
        false if difference.is_nan() => f64::INFINITY,
        false => difference,
    }
}
