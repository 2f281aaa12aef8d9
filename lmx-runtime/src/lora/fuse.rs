//! Adapters fused into the weights they adapt, as mlx-lm's `LoRALinear.fuse`,
//! `DoRALinear.fuse` and `LoRASwitchLinear.fuse`.

use crate::error::Result;
use crate::nn::{
    adapted_weight, dense_weight, row_norms, LinearParams, Quantization, SwitchLinearParams,
};
use crate::tree::{LayerMut, Scope, Tree};
use mlx_rs::{ops, Array};

/// `tree` with every adapter fused into its layer's weight, `W + scale * (A B)^T` in the
/// weight's dtype (DoRA's: each row of it scaled to its magnitude `m`), and removed: the base model's layout, computing what the adapted model did.
/// A quantized weight is dequantized, fused and quantized again with its own settings, as
/// mlx-lm fuses (so the fused model carries the quantization's rounding).
pub fn fuse<R: Tree<Array> + ?Sized>(tree: &mut R) -> Result<usize> {
    let mut fused = 0;
    let mut failed = None;
    tree.for_each_layer_mut(&Scope::root(), &mut |scope, layer| {
        if failed.is_some() {
            return;
        }
        let done = match layer {
            LayerMut::Linear(linear) => fuse_layer(scope.name(), linear),
            LayerMut::SwitchLinear(switch) => fuse_experts(scope.name(), switch),
            LayerMut::Embedding(_) => Ok(false),
        };
        match done {
            Ok(true) => fused += 1,
            Ok(false) => {}
            Err(err) => failed = Some(err),
        }
    });
    match failed {
        Some(err) => Err(err),
        None => Ok(fused),
    }
}

/// Fuses the adapter of `linear` (the layer `name`), if it has one.
fn fuse_layer(name: &str, linear: &mut LinearParams) -> Result<bool> {
    let (Some(a), Some(b), Some(lora)) = (&linear.lora_a, &linear.lora_b, linear.lora) else {
        return Ok(false);
    };
    let quantization = linear.packed().map(|p| p.quantization);
    let mut weight = adapted_weight(&dense_weight(linear)?, a, b, lora.scale)?;
    if let Some(m) = &linear.m {
        // DoRA (mlx-lm's `DoRALinear.fuse`): each row rescaled to its magnitude.
        let rows = ops::divide(m, &row_norms(&weight)?)?.expand_dims(-1)?;
        weight = ops::multiply(&rows, &weight)?.as_dtype(weight.dtype())?;
    }
    store(
        name,
        weight,
        quantization,
        &mut linear.weight,
        &mut linear.scales,
        &mut linear.biases,
    )?;
    linear.lora_a = None;
    linear.lora_b = None;
    linear.m = None;
    linear.lora = None;
    Ok(true)
}

/// Fuses the adapters of the stacked experts `switch` (the layer `name`), if it has them: each
/// expert's `W_e + scale * B_e A_e` in the weight's dtype, as mlx-lm's `LoRASwitchLinear.fuse`
/// (a quantized stack dequantized, fused and quantized again).
fn fuse_experts(name: &str, switch: &mut SwitchLinearParams) -> Result<bool> {
    let (Some(a), Some(b), Some(lora)) = (&switch.lora_a, &switch.lora_b, switch.lora) else {
        return Ok(false);
    };
    let packed = switch.packed();
    let quantization = packed.as_ref().map(|p| p.quantization);
    let dense = match packed {
        Some(p) => p.dequantized()?,
        None => switch.weight.clone(),
    };
    let delta = ops::matmul(&ops::multiply(b, Array::from_f32(lora.scale))?, a)?;
    let weight = ops::add(&dense, &delta.as_dtype(dense.dtype())?)?;
    store(
        name,
        weight,
        quantization,
        &mut switch.weight,
        &mut switch.scales,
        &mut switch.biases,
    )?;
    switch.lora_a = None;
    switch.lora_b = None;
    switch.lora = None;
    Ok(true)
}

/// Stores the fused `weight` of the layer `name` in its `slot`s: quantized again with the
/// layer's own `quantization` when it had one, as mlx-lm fuses.
fn store(
    name: &str,
    weight: Array,
    quantization: Option<Quantization>,
    slot: &mut Array,
    scales: &mut Option<Array>,
    biases: &mut Option<Array>,
) -> Result<()> {
    match quantization {
        Some(q) => {
            let (packed, s, b) = crate::quant::quantize_weight(name, &weight, q)?;
            (*slot, *scales, *biases) = (packed, Some(s), Some(b));
        }
        None => *slot = weight,
    }
    Ok(())
}
