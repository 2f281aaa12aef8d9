//! Affine quantization of a model's linear layers, embeddings and stacked experts, as MLX's
//! `nn.quantize` and mlx-lm's `quantize_model` do it: each selected layer's `weight` becomes
//! MLX's packed `uint32` values with per-group `scales` and `biases` (offsets), and the layer
//! records its [`Quantization`] so that `nn::linear` multiplies with `quantized_matmul` (the
//! experts' `nn::experts` with `gather_qmm`) and the quantization is written back exactly
//! ([`layout`]). A stacked expert weight `[experts, out, in]` quantizes over its last axis, as
//! mlx-lm's `QuantizedSwitchLinear`: scales and biases `[experts, out, in / group_size]`.
//!
//! Which layers: every linear layer, embedding and stacked expert projection whose rows divide
//! into groups (mlx-lm's predicate: the weight's last dimension divisible by the group size); the
//! others stay in floating point, and [`QuantizeReport`] names them.

pub mod layout;
mod shapes;

pub use crate::nn::Quantization;
pub use shapes::{check_layer, packed_shapes};

use crate::error::Result;
use crate::nn::{EmbeddingParams, LinearParams, SwitchLinearParams};
use crate::tree::{Layer, LayerMut, Scope, Tree};
use mlx_rs::{ops, transforms::eval, Array, Dtype};

/// The bit widths MLX's affine quantization packs.
pub const BITS: [i32; 6] = [2, 3, 4, 5, 6, 8];

/// The group sizes MLX's affine quantization supports.
pub const GROUP_SIZES: [i32; 3] = [32, 64, 128];

/// Why a quantization could not be made, read or written; each names its place.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum QuantError {
    /// A bit width MLX cannot pack.
    #[error("{bits}-bit quantization is not supported: MLX's affine quantization takes 2, 3, 4, 5, 6 or 8 bits")]
    Bits {
        /// The bits asked for.
        bits: i32,
    },
    /// A group size MLX does not support.
    #[error("a group size of {group_size} is not supported: it must be 32, 64 or 128")]
    GroupSize {
        /// The group size asked for.
        group_size: i32,
    },
    /// A layer was to be quantized whose rows do not divide into groups.
    #[error("{layer}: its rows of {dim} values do not divide into groups of {group_size}")]
    Indivisible {
        /// The layer's dotted name.
        layer: String,
        /// The weight's last dimension.
        dim: i32,
        /// The group size.
        group_size: i32,
    },
    /// A layer's weight is not floating point, so there is nothing to quantize.
    #[error("{layer}: its weight is {dtype:?}; only floating-point weights quantize")]
    Dtype {
        /// The layer's dotted name.
        layer: String,
        /// The weight's dtype.
        dtype: Dtype,
    },
    /// A quantized layer's tensor does not have the shape its quantization implies.
    #[error(
        "{layer}.{tensor} has shape {found:?}; {bits}-bit groups of {group_size} need {expected:?}"
    )]
    Shape {
        /// The layer's dotted name.
        layer: String,
        /// `weight`, `scales` or `biases`.
        tensor: &'static str,
        /// Its shape.
        found: Vec<i32>,
        /// The shape its quantization implies.
        expected: Vec<i32>,
        /// The bits.
        bits: i32,
        /// The group size.
        group_size: i32,
    },
    /// A quantized layer's packed weight is not `uint32`, or its scales and biases differ.
    #[error("{layer}.{tensor} is {found:?}; expected {expected}")]
    TensorDtype {
        /// The layer's dotted name.
        layer: String,
        /// `weight`, `scales` or `biases`.
        tensor: &'static str,
        /// Its dtype.
        found: Dtype,
        /// What it must be.
        expected: &'static str,
    },
    /// A quantization mode other than MLX's affine one.
    #[error("{place}: quantization mode {mode:?} is not supported; lmx reads and writes affine quantization")]
    Mode {
        /// Where it was given (`config.json: quantization`, a layer's entry).
        place: String,
        /// The mode.
        mode: String,
    },
    /// A `quantization` entry of a model's configuration that cannot be read.
    #[error("{place}: {message}")]
    Config {
        /// The file and entry (`DIR/config.json: quantization.model.layers.0.mlp`).
        place: String,
        /// What is wrong with it.
        message: String,
    },
    /// A stored tensor of a layer that the configuration quantizes does not fit that
    /// quantization (boxed: the error type stays small).
    #[error(transparent)]
    Stored(Box<StoredMismatch>),
    /// The configuration quantizes a layer the model does not have.
    #[error("{place}: the model has no linear layer, embedding or expert projection `{layer}`")]
    UnknownLayer {
        /// The file and entry.
        place: String,
        /// The layer named.
        layer: String,
    },
}

/// A quantized layer's stored tensor of the wrong shape, missing, or packed without its scales.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{path}: tensor `{tensor}` {problem}; {config} makes `{layer}` {bits}-bit in groups of {group_size}")]
pub struct StoredMismatch {
    /// The weights file (or the folder, for a missing tensor).
    pub path: String,
    /// The tensor's name.
    pub tensor: String,
    /// What is wrong with it.
    pub problem: String,
    /// The layer's dotted name.
    pub layer: String,
    /// The configuration and its entry (`DIR/config.json: quantization`).
    pub config: String,
    /// The bits.
    pub bits: i32,
    /// The group size.
    pub group_size: i32,
}

impl Quantization {
    /// The quantization, when MLX supports it.
    pub fn new(group_size: i32, bits: i32) -> Result<Quantization, QuantError> {
        let q = Quantization { group_size, bits };
        q.check()?;
        Ok(q)
    }

    /// Whether MLX's affine quantization supports these settings.
    pub fn check(&self) -> Result<(), QuantError> {
        if !BITS.contains(&self.bits) {
            return Err(QuantError::Bits { bits: self.bits });
        }
        if !GROUP_SIZES.contains(&self.group_size) {
            return Err(QuantError::GroupSize {
                group_size: self.group_size,
            });
        }
        Ok(())
    }
}

/// What [`quantize_tree`] did: the layers quantized and those it left, by dotted name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QuantizeReport {
    /// The layers now quantized.
    pub quantized: Vec<String>,
    /// How many of them are stacked expert projections (`[experts, out, in]`).
    pub experts: usize,
    /// The layers left as they were: rows not divisible into groups, or already quantized.
    pub skipped: Vec<String>,
}

/// Quantizes every linear layer, embedding and stacked expert projection of `tree` whose rows divide into groups of
/// `q.group_size` (mlx-lm's `quantize_model`); layers already quantized keep their own
/// quantization. Each layer is evaluated as it is quantized, so that its floating-point weight
/// is freed before the next one is made: the peak is the model plus one layer.
pub fn quantize_tree<R: Tree<Array> + ?Sized>(
    tree: &mut R,
    q: Quantization,
) -> Result<QuantizeReport> {
    q.check()?;
    // Every layer to quantize is checked first, so that a refusal leaves the tree as it was.
    let mut refusal = None;
    tree.for_each_layer(&Scope::root(), &mut |scope, layer| {
        let quantization = layer.quantization();
        let weight = match layer {
            Layer::Linear(l) => &l.weight,
            Layer::Embedding(e) => &e.weight,
            Layer::SwitchLinear(s) => &s.weight,
        };
        let dim = weight.shape().last().copied().unwrap_or(0);
        let float = matches!(
            weight.dtype(),
            Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16
        );
        if refusal.is_none() && quantization.is_none() && dim % q.group_size == 0 && !float {
            refusal = Some(QuantError::Dtype {
                layer: scope.name().to_owned(),
                dtype: weight.dtype(),
            });
        }
    });
    if let Some(err) = refusal {
        return Err(err.into());
    }
    let mut report = QuantizeReport::default();
    let mut failure = None;
    tree.for_each_layer_mut(&Scope::root(), &mut |scope, layer| {
        if failure.is_some() {
            return;
        }
        let name = scope.name().to_owned();
        let stacked = matches!(layer, LayerMut::SwitchLinear(_));
        let (weight, scales, biases, quantization) = parts(layer);
        let dim = weight.shape().last().copied().unwrap_or(0);
        if quantization.is_some() || dim % q.group_size != 0 {
            report.skipped.push(name);
            return;
        }
        match quantize_weight(&name, weight, q) {
            Ok((w, s, b)) => {
                (*weight, *scales, *biases, *quantization) = (w, Some(s), Some(b), Some(q));
                report.quantized.push(name);
                report.experts += usize::from(stacked);
            }
            Err(err) => failure = Some(err),
        }
    });
    match failure {
        Some(err) => Err(err),
        None => Ok(report),
    }
}

/// `weight` quantized (`[packed, scales, biases]`, evaluated), or why it cannot be.
pub fn quantize_weight(
    layer: &str,
    weight: &Array,
    q: Quantization,
) -> Result<(Array, Array, Array)> {
    q.check()?;
    let dtype = weight.dtype();
    if !matches!(dtype, Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16) {
        return Err(QuantError::Dtype {
            layer: layer.to_owned(),
            dtype,
        }
        .into());
    }
    let dim = weight.shape().last().copied().unwrap_or(0);
    if weight.ndim() < 2 || dim % q.group_size != 0 {
        return Err(QuantError::Indivisible {
            layer: layer.to_owned(),
            dim,
            group_size: q.group_size,
        }
        .into());
    }
    let (w, s, b) = ops::quantize(weight, q.group_size, q.bits)?;
    eval([&w, &s, &b])?;
    Ok((w, s, b))
}

/// Replaces every quantized layer's weight by its dequantized values (in the scales' dtype, as
/// MLX's `dequantize` gives them) and drops its scales, biases and quantization: mlx-lm's
/// `dequantize_model`, for fusing adapters into a quantized base or writing it unquantized.
/// Returns the layers dequantized.
pub fn dequantize_tree<R: Tree<Array> + ?Sized>(tree: &mut R) -> Result<Vec<String>> {
    let mut done = Vec::new();
    let mut failure = None;
    tree.for_each_layer_mut(&Scope::root(), &mut |scope, layer| {
        if failure.is_some() {
            return;
        }
        let (weight, scales, biases, quantization) = parts(layer);
        let (Some(s), Some(b), Some(q)) = (scales.as_ref(), biases.as_ref(), *quantization) else {
            return;
        };
        let dense = ops::dequantize(&*weight, s, b, q.group_size, q.bits)
            .map_err(Into::into)
            .and_then(|dense| {
                eval([&dense])?;
                Ok(dense)
            });
        match dense {
            Ok(dense) => {
                (*weight, *scales, *biases, *quantization) = (dense, None, None, None);
                done.push(scope.name().to_owned());
            }
            Err(err) => failure = Some(err),
        }
    });
    match failure {
        Some(err) => Err(err),
        None => Ok(done),
    }
}

/// Checks that every quantized layer of `tree` is consistent with its quantization: supported
/// settings, a `uint32` weight and scales, biases of the shapes they imply. Run after loading
/// weights from a file, so that a wrong tensor is named before it multiplies.
pub fn check_tree<R: Tree<Array> + ?Sized>(tree: &R) -> Result<()> {
    let mut failure = None;
    tree.for_each_layer(&Scope::root(), &mut |scope, layer| {
        if failure.is_some() {
            return;
        }
        let packed = match layer {
            Layer::Linear(l) => l.packed(),
            Layer::Embedding(e) => e.packed(),
            Layer::SwitchLinear(s) => s.packed(),
        };
        if let Some(p) = packed {
            if let Err(err) =
                check_layer(scope.name(), p.weight, p.scales, p.biases, p.quantization)
            {
                failure = Some(err);
            }
        }
    });
    match failure {
        Some(err) => Err(err.into()),
        None => Ok(()),
    }
}

/// The number of parameters `tree` stands for, counting a packed weight as the values it packs
/// (mlx-lm's `get_total_parameters`: `size * 32 / bits`) and no scales or biases.
pub fn logical_parameter_count<R: Tree<Array> + ?Sized>(tree: &R) -> u64 {
    let mut quantization_leaves = 0_u64;
    let mut packed_extra = 0_u64;
    tree.for_each_layer(&Scope::root(), &mut |_, layer| {
        let (weight, scales, biases, quantization) = match layer {
            Layer::Linear(l) => (&l.weight, &l.scales, &l.biases, l.quantization),
            Layer::Embedding(e) => (&e.weight, &e.scales, &e.biases, e.quantization),
            Layer::SwitchLinear(s) => (&s.weight, &s.scales, &s.biases, s.quantization),
        };
        if let Some(q) = quantization {
            let packed = weight.size() as u64;
            packed_extra += packed * 32 / q.bits as u64 - packed;
        }
        for leaf in [scales, biases].into_iter().flatten() {
            quantization_leaves += leaf.size() as u64;
        }
    });
    let all: u64 = crate::tree::flatten(tree)
        .iter()
        .map(|a| a.size() as u64)
        .sum();
    all - quantization_leaves + packed_extra
}

/// The bytes `tree`'s leaves occupy: packed weights, scales and biases as stored.
pub fn tree_bytes<R: Tree<Array> + ?Sized>(tree: &R) -> u64 {
    crate::tree::flatten(tree)
        .iter()
        .map(|a| a.nbytes() as u64)
        .sum()
}

/// A layer's weight, scales, biases and quantization, whichever kind it is.
fn parts<'a>(
    layer: LayerMut<'a, Array>,
) -> (
    &'a mut Array,
    &'a mut Option<Array>,
    &'a mut Option<Array>,
    &'a mut Option<Quantization>,
) {
    match layer {
        LayerMut::Linear(LinearParams {
            weight,
            scales,
            biases,
            quantization,
            ..
        })
        | LayerMut::Embedding(EmbeddingParams {
            weight,
            scales,
            biases,
            quantization,
        })
        | LayerMut::SwitchLinear(SwitchLinearParams {
            weight,
            scales,
            biases,
            quantization,
            ..
        }) => (weight, scales, biases, quantization),
    }
}
