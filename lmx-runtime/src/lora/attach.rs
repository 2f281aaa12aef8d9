//! Adapters attached to a tree's linear layers and stacked experts, chosen as mlx-lm's
//! `linear_to_lora_layers` chooses them: in the last `num_layers` blocks, the layers whose name
//! within their block is one of `keys` (by default every linear layer and stacked expert
//! projection of the blocks).

use crate::error::{Error, Result};
use crate::nn::init::{uniform, Keys};
use crate::nn::{
    dense_weight, row_norms, LinearParams, LoraSettings, Quantization, SwitchLinearParams,
};
use crate::tree::{Layer, LayerMut, Scope, Tree};
use mlx_rs::{Array, Dtype};
use std::collections::BTreeSet;

/// mlx-lm's `lora_parameters`: the adapters' rank, the scale of their output, the dropout on
/// their input, and which layers of a block get one (`None`: every linear layer).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LoraParameters {
    pub rank: i32,
    pub scale: f32,
    #[serde(default)]
    pub dropout: f32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<Vec<String>>,
}

/// mlx-lm's `fine_tune_type`: the kind of adapter (`full`, mlx-lm's third, trains the whole
/// model and has no adapters).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FineTuneType {
    /// LoRA (mlx-lm's `LoRALinear`): `lora_a`, `lora_b`.
    #[default]
    Lora,
    /// DoRA (Liu et al., 2024; mlx-lm's `DoRALinear`): LoRA's pair and a magnitude `m` per
    /// output row, which the adapted weight's rows are normalised to.
    Dora,
}

impl FineTuneType {
    /// The name mlx-lm writes.
    pub fn name(self) -> &'static str {
        match self {
            FineTuneType::Lora => "lora",
            FineTuneType::Dora => "dora",
        }
    }
}

impl Default for LoraParameters {
    /// mlx-lm's defaults (`CONFIG_DEFAULTS` of `mlx_lm.lora`).
    fn default() -> Self {
        LoraParameters {
            rank: 8,
            scale: 20.0,
            dropout: 0.0,
            keys: None,
        }
    }
}

/// A layer's place: the index of its block and its name within the block, for a layer inside a
/// list of blocks (`model.layers.3.self_attn.q_proj` is block 3, `self_attn.q_proj`).
fn in_block(name: &str) -> Option<(usize, &str)> {
    let mut start = 0;
    for segment in name.split('.') {
        let end = start + segment.len();
        if let Ok(index) = segment.parse::<usize>() {
            return Some((index, name.get(end + 1..).unwrap_or("")));
        }
        start = end + 1;
    }
    None
}

/// The number of blocks of `tree`: one past the highest block index of its layers.
pub fn blocks<R: Tree<Array> + ?Sized>(tree: &R) -> usize {
    let mut count = 0;
    tree.for_each_layer(&Scope::root(), &mut |scope, _| {
        if let Some((index, _)) = in_block(scope.name()) {
            count = count.max(index + 1);
        }
    });
    count
}

/// The names within a block of every linear layer and stacked expert projection in the blocks:
/// mlx-lm's default `keys` (which also takes embeddings inside blocks, which no bundled model
/// has).
fn default_keys<R: Tree<Array> + ?Sized>(tree: &R) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    tree.for_each_layer(&Scope::root(), &mut |scope, layer| {
        if let (Layer::Linear(_) | Layer::SwitchLinear(_), Some((_, key))) =
            (layer, in_block(scope.name()))
        {
            keys.insert(key.to_owned());
        }
    });
    keys
}

/// Attaches an adapter of `kind` to the chosen linear layers of `tree` and returns their names.
///
/// The layers chosen are those of the last `num_layers` blocks (all of them for a negative
/// `num_layers`, as in mlx-lm) whose name within the block is one of `parameters.keys`, and the
/// layers outside blocks whose full name is one (mlx-lm's second pass, e.g. `lm_head`). Each
/// adapter is initialised as mlx-lm's `LoRALinear`: `lora_a: [in, rank]` uniform in
/// `±1/sqrt(in)`, drawn from `seed` in traversal order, and `lora_b: [rank, out]` zeros, so
/// that the adapted model computes exactly what the base does. DoRA's magnitude `m` starts as
/// the norms of the weight's rows (computed in float32, as mlx-lm's `DoRALinear.set_linear`).
/// A stacked expert projection gets one adapter per expert, as mlx-lm's `LoRASwitchLinear`:
/// `lora_a: [experts, rank, in]` uniform in `±1/sqrt(in)`, `lora_b: [experts, out, rank]`
/// zeros. Adapters take the dtype of the layer's weights (of its scales when it is quantized).
///
/// Fails, leaving `tree` unchanged, on a rank below 1, a scale that is not finite, a dropout
/// outside `[0, 1)`, more `num_layers` than blocks ([`Error::TooManyBlocks`]), a key that names
/// no linear layer or stacked experts, a layer that already has an adapter
/// ([`Error::AlreadyAdapted`]), DoRA on stacked experts (which mlx-lm's DoRA does not adapt
/// either), or a choice of no layer at all ([`Error::NothingToAdapt`]).
pub fn attach<R: Tree<Array> + ?Sized>(
    tree: &mut R,
    parameters: &LoraParameters,
    num_layers: i64,
    seed: u64,
    kind: FineTuneType,
) -> Result<Vec<String>> {
    check(parameters)?;
    let blocks = blocks(tree);
    if num_layers > blocks as i64 {
        return Err(Error::TooManyBlocks {
            asked: num_layers,
            blocks,
        });
    }
    let first = if num_layers < 0 {
        0
    } else {
        blocks - num_layers as usize
    };
    let keys: BTreeSet<String> = match &parameters.keys {
        Some(keys) => keys.iter().cloned().collect(),
        None => default_keys(tree),
    };
    let chosen = |name: &str| match in_block(name) {
        Some((index, key)) => index >= first && keys.contains(key),
        None => keys.contains(name),
    };
    // Checked before anything changes: every key names a linear layer, none is adapted yet.
    let mut matched = BTreeSet::new();
    let mut problem = None;
    tree.for_each_layer(&Scope::root(), &mut |scope, layer| {
        let name = scope.name();
        let key = in_block(name).map_or(name, |(_, key)| key);
        if !keys.contains(key) {
            return;
        }
        match layer {
            Layer::Linear(linear) => {
                matched.insert(key.to_owned());
                if chosen(name) && linear.lora_a.is_some() {
                    problem.get_or_insert(Error::AlreadyAdapted {
                        layer: name.to_owned(),
                    });
                }
            }
            Layer::Embedding(_) => {
                problem.get_or_insert(Error::Config(format!(
                    "key `{key}` names the embedding `{name}`; lmx adapts linear layers and stacked experts only"
                )));
            }
            Layer::SwitchLinear(switch) => {
                matched.insert(key.to_owned());
                if chosen(name) {
                    if let Some(trouble) = experts_problem(name, key, switch, kind) {
                        problem.get_or_insert(trouble);
                    }
                }
            }
        }
    });
    if let Some(problem) = problem {
        return Err(problem);
    }
    if let Some(missing) = keys.iter().find(|key| !matched.contains(*key)) {
        return Err(Error::Config(format!(
            "LoRA key `{missing}` names no linear layer or stacked experts of the model; those \
             within a block are {}",
            default_keys(tree)
                .into_iter()
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let mut rng = Keys::from_seed(seed)?;
    let mut attached = Vec::new();
    let mut failed = None;
    tree.for_each_layer_mut(&Scope::root(), &mut |scope, layer| {
        if !chosen(scope.name()) || failed.is_some() {
            return;
        }
        let adapted = match layer {
            LayerMut::Linear(linear) => adapt(linear, parameters, &mut rng, kind),
            LayerMut::SwitchLinear(switch) => adapt_experts(switch, parameters, &mut rng),
            LayerMut::Embedding(_) => return,
        };
        match adapted {
            Ok(()) => attached.push(scope.name().to_owned()),
            Err(err) => failed = Some(err),
        }
    });
    if let Some(err) = failed {
        return Err(err);
    }
    if attached.is_empty() {
        let mut linear = Vec::new();
        tree.for_each_layer(&Scope::root(), &mut |scope, layer| {
            if let Layer::Linear(_) | Layer::SwitchLinear(_) = layer {
                linear.push(scope.name().to_owned());
            }
        });
        return Err(Error::NothingToAdapt { linear });
    }
    Ok(attached)
}

/// Fails on settings out of their range, naming the setting.
pub(crate) fn check(parameters: &LoraParameters) -> Result<()> {
    if parameters.rank < 1 {
        return Err(Error::Setting {
            name: "rank",
            value: parameters.rank.to_string(),
            expected: "at least 1",
        });
    }
    if !parameters.scale.is_finite() {
        return Err(Error::Setting {
            name: "scale",
            value: parameters.scale.to_string(),
            expected: "a finite number",
        });
    }
    if !(0.0..1.0).contains(&parameters.dropout) {
        return Err(Error::Setting {
            name: "dropout",
            value: parameters.dropout.to_string(),
            expected: "in [0, 1)",
        });
    }
    Ok(())
}

/// Gives `linear` a fresh adapter of `kind`, initialised as mlx-lm's `LoRALinear` or
/// `DoRALinear`.
pub(crate) fn adapt(
    linear: &mut LinearParams,
    parameters: &LoraParameters,
    keys: &mut Keys,
    kind: FineTuneType,
) -> Result<()> {
    let output = linear.weight.shape()[0];
    let (input, dtype) = adapted_input(&linear.weight, linear.quantization, &linear.scales);
    let bound = (input as f32).powf(-0.5);
    let a = uniform(&[input, parameters.rank], bound, &keys.next()?)?;
    let b = Array::zeros::<f32>(&[parameters.rank, output])?;
    let cast = |x: Array| -> Result<Array> {
        Ok(if dtype == Dtype::Float32 {
            x
        } else {
            x.as_dtype(dtype)?
        })
    };
    linear.lora_a = Some(cast(a)?);
    linear.lora_b = Some(cast(b)?);
    linear.m = match kind {
        FineTuneType::Lora => None,
        FineTuneType::Dora => Some(cast(row_norms(
            &dense_weight(linear)?.as_dtype(Dtype::Float32)?,
        )?)?),
    };
    linear.lora = Some(settings(parameters));
    Ok(())
}

/// The input features of a layer's weight (its last axis; for a packed weight, the values its
/// `uint32`s hold, `32 / bits` each) and the dtype its adapters take: the weight's, or its
/// scales' when it is quantized.
fn adapted_input(
    weight: &Array,
    quantization: Option<Quantization>,
    scales: &Option<Array>,
) -> (i32, Dtype) {
    let input = weight.shape().last().copied().unwrap_or(0);
    match (quantization, scales) {
        (Some(q), Some(scales)) => (input * 32 / q.bits, scales.dtype()),
        _ => (input, weight.dtype()),
    }
}

/// The settings an adapter keeps of `parameters`.
fn settings(parameters: &LoraParameters) -> LoraSettings {
    LoraSettings {
        scale: parameters.scale,
        dropout: parameters.dropout,
    }
}

/// Why the stacked experts `name` (of `key`) cannot take an adapter of `kind`, if they cannot.
fn experts_problem(
    name: &str,
    key: &str,
    switch: &SwitchLinearParams,
    kind: FineTuneType,
) -> Option<Error> {
    if switch.lora_a.is_some() {
        Some(Error::AlreadyAdapted {
            layer: name.to_owned(),
        })
    } else if kind == FineTuneType::Dora {
        Some(Error::Config(format!(
            "key `{key}` names the stacked experts `{name}`, which DoRA does not adapt (nor does \
             mlx-lm's); use LoRA or keys without them"
        )))
    } else {
        None
    }
}

/// Gives the stacked expert projection `switch` fresh adapters, one per expert, initialised as
/// mlx-lm's `LoRASwitchLinear`.
fn adapt_experts(
    switch: &mut SwitchLinearParams,
    parameters: &LoraParameters,
    keys: &mut Keys,
) -> Result<()> {
    let (experts, output) = (switch.weight.shape()[0], switch.weight.shape()[1]);
    let (input, dtype) = adapted_input(&switch.weight, switch.quantization, &switch.scales);
    let bound = (input as f32).powf(-0.5);
    let a = uniform(&[experts, parameters.rank, input], bound, &keys.next()?)?;
    let b = Array::zeros::<f32>(&[experts, output, parameters.rank])?;
    switch.lora_a = Some(a.as_dtype(dtype)?);
    switch.lora_b = Some(b.as_dtype(dtype)?);
    switch.lora = Some(settings(parameters));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::in_block;

    #[test]
    fn a_layer_s_block_is_its_first_index() {
        assert_eq!(
            in_block("model.layers.3.self_attn.q_proj"),
            Some((3, "self_attn.q_proj"))
        );
        assert_eq!(
            in_block("model.layers.1.block_sparse_moe.experts.2.w1"),
            Some((1, "block_sparse_moe.experts.2.w1"))
        );
        assert_eq!(in_block("lm_head"), None);
    }
}
