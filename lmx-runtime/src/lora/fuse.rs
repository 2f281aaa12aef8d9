//! Adapters fused into the weights they adapt, as mlx-lm's `LoRALinear.fuse`.

use crate::error::Result;
use crate::nn::LinearParams;
use crate::tree::{LayerMut, Scope, Tree};
use mlx_rs::{ops, Array};

/// `tree` with every adapter fused into its layer's weight, `W + scale * (A B)^T` in the
/// weight's dtype, and removed: the base model's layout, computing what the adapted model did.
/// A quantized weight is dequantized, fused and quantized again with its own settings, as
/// mlx-lm fuses (so the fused model carries the quantization's rounding).
pub fn fuse<R: Tree<Array> + ?Sized>(tree: &mut R) -> Result<usize> {
    let mut fused = 0;
    let mut failed = None;
    tree.for_each_layer_mut(&Scope::root(), &mut |scope, layer| {
        if let (LayerMut::Linear(linear), None) = (layer, &failed) {
            match fuse_layer(scope.name(), linear) {
                Ok(true) => fused += 1,
                Ok(false) => {}
                Err(err) => failed = Some(err),
            }
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
    let packed = linear.packed();
    let weight = match &packed {
        Some(p) => ops::dequantize(
            p.weight,
            p.scales,
            p.biases,
            p.quantization.group_size,
            p.quantization.bits,
        )?,
        None => linear.weight.clone(),
    };
    let scale = Array::from_f32(lora.scale);
    let delta = ops::matmul(ops::multiply(b.t(), &scale)?, a.t())?;
    let weight = ops::add(&weight, &delta.as_dtype(weight.dtype())?)?;
    match packed.map(|p| p.quantization) {
        Some(q) => {
            let (packed, scales, biases) = crate::quant::quantize_weight(name, &weight, q)?;
            linear.weight = packed;
            linear.scales = Some(scales);
            linear.biases = Some(biases);
        }
        None => linear.weight = weight,
    }
    linear.lora_a = None;
    linear.lora_b = None;
    linear.lora = None;
    Ok(true)
}
