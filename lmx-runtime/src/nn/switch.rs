//! Stacked expert layers, mlx-lm's `SwitchLinear` and `SwitchGLU`: the `.lmx` layer
//! `experts(dim, hidden, count)` is a [`SwitchGluParams`], three [`SwitchLinearParams`] whose
//! weights stack one linear layer per expert (`[experts, out, in]`).
//!
//! Each stacked projection is a layer that `Tree::for_each_layer` visits, so that quantization
//! rewrites it as it does a linear layer (mlx-lm's `QuantizedSwitchLinear`: the packed weight,
//! `scales` and `biases` keep the leading experts axis, and the product is MLX's `gather_qmm`),
//! and LoRA adapts it as mlx-lm's `LoRASwitchLinear` does: one adapter per expert, gathered by
//! the same choices as the weights.

use super::experts::{gathered_glu, Projection, Stacked, StackedAdapter};
use super::init::{uniform, Keys};
use super::{LoraSettings, Packed, Quantization};
use crate::error::Result;
use crate::model::Context;
use mlx_rs::Array;

/// One stacked projection: `weight [experts, out, in]`, one linear layer's weight per expert.
/// Quantized, `weight` holds the packed `uint32` values and `scales`, `biases` the per-group
/// affine parameters, each with the experts axis first.
#[derive(Clone, Debug, PartialEq, lmx_macros::Tree)]
#[lmx(runtime = "crate", layer = switch_linear)]
pub struct SwitchLinearParams<T = Array> {
    #[lmx(role = weight)]
    pub weight: T,
    #[lmx(role = quantization)]
    pub scales: Option<T>,
    #[lmx(role = quantization)]
    pub biases: Option<T>,
    /// Each expert's adapter down-projection `[experts, rank, in]` (mlx-lm's
    /// `LoRASwitchLinear.lora_a`, the transpose of a linear layer's).
    #[lmx(role = adapter)]
    pub lora_a: Option<T>,
    /// Each expert's adapter up-projection `[experts, out, rank]`.
    #[lmx(role = adapter)]
    pub lora_b: Option<T>,
    /// How `weight` is quantized, when it is.
    #[lmx(skip)]
    pub quantization: Option<Quantization>,
    /// The adapters' settings, when there are adapters.
    #[lmx(skip)]
    pub lora: Option<LoraSettings>,
}

impl<T> SwitchLinearParams<T> {
    /// A floating-point stacked projection.
    pub fn new(weight: T) -> Self {
        SwitchLinearParams {
            weight,
            scales: None,
            biases: None,
            lora_a: None,
            lora_b: None,
            quantization: None,
            lora: None,
        }
    }

    /// The projection's packed parts, when it is quantized.
    pub fn packed(&self) -> Option<Packed<'_, T>> {
        Packed::of(&self.weight, &self.scales, &self.biases, self.quantization)
    }
}

impl SwitchLinearParams {
    fn stacked(&self) -> Projection<'_> {
        let stacked = match self.packed() {
            Some(p) => Stacked::Packed(p),
            None => Stacked::Dense(&self.weight),
        };
        let adapter = match (&self.lora_a, &self.lora_b, self.lora) {
            (Some(a), Some(b), Some(lora)) => Some(StackedAdapter {
                a,
                b,
                scale: lora.scale,
                dropout: lora.dropout,
            }),
            _ => None,
        };
        Projection { stacked, adapter }
    }
}

/// The experts' SwiGLU (mlx-lm's `SwitchGLU`): `gate_proj` and `up_proj` `[experts, hidden,
/// dim]`, `down_proj` `[experts, dim, hidden]`.
#[derive(Clone, Debug, PartialEq, lmx_macros::Tree)]
#[lmx(runtime = "crate")]
pub struct SwitchGluParams<T = Array> {
    pub gate_proj: SwitchLinearParams<T>,
    pub up_proj: SwitchLinearParams<T>,
    pub down_proj: SwitchLinearParams<T>,
}

/// The `.lmx` layer `experts(..)` called on `x [..., dim]` and the experts each token chose,
/// `indices [..., k]`: [`switch_glu`](super::switch_glu) of the layer's three projections,
/// `[..., k, dim]`. Adapters' dropout is not applied: [`experts_in`] applies it in a training
/// step.
pub fn experts(params: &SwitchGluParams, x: &Array, indices: &Array) -> Result<Array> {
    gathered_glu(x, indices, params.projections(), None)
}

/// [`experts`] inside a forward pass: an adapter with a dropout probability sees its input
/// through [`dropout`](super::dropout), whose mask is drawn from `ctx`'s key, so only in a
/// training step (as mlx-lm's `LoRASwitchLinear` in training mode).
pub fn experts_in(
    params: &SwitchGluParams,
    x: &Array,
    indices: &Array,
    ctx: &mut Context,
) -> Result<Array> {
    gathered_glu(x, indices, params.projections(), Some(ctx))
}

impl SwitchGluParams {
    fn projections(&self) -> [Projection<'_>; 3] {
        [
            self.gate_proj.stacked(),
            self.up_proj.stacked(),
            self.down_proj.stacked(),
        ]
    }
}

/// `experts(dim, hidden, count)` as mlx-lm initialises `SwitchGLU`: each projection uniform in
/// `±1/sqrt(in)`, drawn in the order gate, up, down.
pub fn init_experts(dim: i32, hidden: i32, count: i32, keys: &mut Keys) -> Result<SwitchGluParams> {
    let mut stacked = |out: i32, input: i32| -> Result<SwitchLinearParams> {
        let bound = (1.0 / f64::from(input).sqrt()) as f32;
        Ok(SwitchLinearParams::new(uniform(
            &[count, out, input],
            bound,
            &keys.next()?,
        )?))
    };
    Ok(SwitchGluParams {
        gate_proj: stacked(hidden, dim)?,
        up_proj: stacked(hidden, dim)?,
        down_proj: stacked(dim, hidden)?,
    })
}
