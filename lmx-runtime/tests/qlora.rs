//! QLoRA: low-rank adapters over a quantized, frozen base train in the compiled step. The packed
//! `uint32` weights, scales and biases enter the step as frozen inputs, gradients flow through
//! `quantized_matmul` to its input (and so to the adapters below it), the adapters change, every
//! quantized leaf stays bit-identical, and the loss falls.

use lmx_runtime::flat::FlatStep;
use lmx_runtime::mlx_rs::{random, transforms::eval, Array, Dtype};
use lmx_runtime::nn::{self, EmbeddingParams, LinearParams, LoraSettings};
use lmx_runtime::optim::AdamW;
use lmx_runtime::quant::{self, Quantization};
use lmx_runtime::state::TrainState;
use lmx_runtime::step::{StepOptions, TrainStep};
use lmx_runtime::tree::{self, LayerMut, LeafRole, Scope, Tree};
use lmx_runtime::Result;

#[derive(Clone, Debug, PartialEq, lmx_macros::Tree)]
#[lmx(runtime = "lmx_runtime")]
struct Tiny<T = Array> {
    embed: EmbeddingParams<T>,
    proj: LinearParams<T>,
    head: LinearParams<T>,
}

const VOCAB: i32 = 64;
const DIM: i32 = 64;
const RANK: i32 = 4;

fn base() -> Result<Tiny> {
    let mut keys = nn::init::Keys::from_seed(0)?;
    Ok(Tiny {
        embed: nn::init::embedding(VOCAB, DIM, &mut keys)?,
        proj: nn::init::linear(DIM, DIM, true, &mut keys)?,
        head: nn::init::linear(DIM, VOCAB, false, &mut keys)?,
    })
}

fn loss(params: &Tiny, batch: &[Array], _key: &Array) -> Result<Array> {
    let x = nn::embedding(&params.embed, &batch[0])?;
    let h = nn::linear(&params.proj, &x)?;
    nn::cross_entropy(&nn::linear(&params.head, &h)?, &batch[1])
}

#[test]
fn adapters_over_a_quantized_base_train_and_the_base_stays_bit_identical() -> Result<()> {
    let mut params = base()?;
    let report = quant::quantize_tree(&mut params, Quantization::new(32, 4)?)?;
    assert_eq!(report.quantized, ["embed", "proj", "head"]);
    // Adapters as LoRA makes them: A small and random, B zero, so the output starts unchanged.
    let mut seed = 10;
    params.for_each_layer_mut(&Scope::root(), &mut |_, layer| {
        if let LayerMut::Linear(linear) = layer {
            let out = linear.scales.as_ref().unwrap().shape()[0];
            let key = random::key(seed).unwrap();
            seed += 1;
            let a = random::normal::<f32>(&[DIM, RANK], None, None, &key).unwrap();
            linear.lora_a = Some(a.multiply(Array::from_f32(0.1)).unwrap());
            linear.lora_b = Some(Array::zeros::<f32>(&[RANK, out]).unwrap());
            linear.lora = Some(LoraSettings {
                scale: 2.0,
                dropout: 0.0,
            });
        }
    });
    let specs = tree::specs(&params);
    let trainable: Vec<&str> = specs
        .iter()
        .filter(|s| s.trainable)
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(
        trainable,
        ["proj.lora_a", "proj.lora_b", "head.lora_a", "head.lora_b"]
    );
    assert!(specs
        .iter()
        .filter(|s| s.role == LeafRole::Quantization)
        .all(|s| !s.trainable));

    let frozen_before: Vec<(String, Vec<u32>)> = tree::names(&params)
        .into_iter()
        .zip(tree::flatten(&params))
        .filter(|(name, _)| !name.contains("lora"))
        .map(|(name, leaf)| (name, bits(&leaf)))
        .collect();
    let adapters_before = tree::flatten(&params)
        .iter()
        .zip(&specs)
        .filter(|(_, s)| s.trainable)
        .map(|(leaf, _)| bits(leaf))
        .collect::<Vec<_>>();

    // A fixed batch: the next token is the current one plus one, a pattern the adapters learn.
    let tokens: Vec<i32> = (0..32).map(|i| (i * 7) % VOCAB).collect();
    let targets: Vec<i32> = tokens.iter().map(|t| (t + 1) % VOCAB).collect();
    let batch = [
        Array::from_slice(&tokens, &[4, 8]),
        Array::from_slice(&targets, &[4, 8]),
    ];
    let optimizer = AdamW {
        weight_decay: 0.0,
        ..AdamW::default()
    };
    let flat_params = params.clone();
    let mut state = TrainState::new(params, &optimizer, 0)?;
    let options = StepOptions {
        compile: true,
        ..StepOptions::default()
    };
    let mut step = TrainStep::new(&state, optimizer.clone(), loss, options)?;
    let mut losses = Vec::new();
    for _ in 0..20 {
        let metrics = step.step(&mut state, 1e-2, &batch)?;
        eval(&metrics.outputs)?;
        losses.push(metrics.loss.item_exact::<f32>());
    }
    assert_eq!(step.traces(), 1, "one trace for every step");
    assert!(
        losses[19] < losses[0] - 0.5,
        "the loss must fall: {losses:?}"
    );

    let params = &state.params;
    assert_eq!(params.proj.weight.dtype(), Dtype::Uint32);
    let frozen_after: Vec<(String, Vec<u32>)> = tree::names(params)
        .into_iter()
        .zip(tree::flatten(params))
        .filter(|(name, _)| !name.contains("lora"))
        .map(|(name, leaf)| (name, bits(&leaf)))
        .collect();
    assert_eq!(
        frozen_before.len(),
        3 * 3 + 1,
        "three quantized layers and a bias"
    );
    assert!(frozen_before == frozen_after, "the frozen base changed");
    let adapters_after = tree::flatten(params)
        .iter()
        .zip(&specs)
        .filter(|(_, s)| s.trainable)
        .map(|(leaf, _)| bits(leaf))
        .collect::<Vec<_>>();
    for (i, (before, after)) in adapters_before.iter().zip(&adapters_after).enumerate() {
        assert_ne!(before, after, "adapter leaf {i} did not move");
    }

    // The trainer's packed state (one buffer per dtype for the adapters, the quantized base as
    // frozen inputs) takes the same steps.
    let flat_state = TrainState::new(flat_params, &optimizer, 0)?;
    let mut flat_step =
        FlatStep::new(&flat_state, optimizer, loss, options)?.expect("the adapters' state packs");
    let mut flat = flat_step.pack(&flat_state)?;
    for (i, want) in losses.iter().enumerate() {
        let metrics = flat_step.step(&mut flat, 1e-2, &batch)?;
        eval(&metrics.outputs)?;
        let got = metrics.loss.item_exact::<f32>();
        assert!(
            (got - want).abs() <= 1e-5 * want.abs(),
            "step {i}: {got} vs {want}"
        );
    }
    let unpacked = flat_step.unpack(&flat)?;
    let frozen_flat: Vec<(String, Vec<u32>)> = tree::names(&unpacked.params)
        .into_iter()
        .zip(tree::flatten(&unpacked.params))
        .filter(|(name, _)| !name.contains("lora"))
        .map(|(name, leaf)| (name, bits(&leaf)))
        .collect();
    assert!(
        frozen_before == frozen_flat,
        "the packed step changed the base"
    );
    Ok(())
}

/// A leaf's values as bits, whatever its dtype.
fn bits(leaf: &Array) -> Vec<u32> {
    match leaf.dtype() {
        Dtype::Uint32 => leaf.as_slice::<u32>().to_vec(),
        _ => leaf
            .as_dtype(Dtype::Float32)
            .unwrap()
            .as_slice::<f32>()
            .iter()
            .map(|v| v.to_bits())
            .collect(),
    }
}

/// Without adapters, training a partly quantized model trains its dense leaves only: a quantized
/// layer freezes itself (packed weight and bias), as MLX's `QuantizedLinear` does.
#[test]
fn a_quantized_layer_freezes_itself_and_the_dense_rest_trains() -> Result<()> {
    let mut params = base()?;
    let (w, s, b) = quant::quantize_weight("proj", &params.proj.weight, Quantization::new(64, 8)?)?;
    params.proj.weight = w;
    params.proj.scales = Some(s);
    params.proj.biases = Some(b);
    params.proj.quantization = Some(Quantization::new(64, 8)?);
    let trainable: Vec<String> = tree::specs(&params)
        .into_iter()
        .filter(|s| s.trainable)
        .map(|s| s.name)
        .collect();
    assert_eq!(trainable, ["embed.weight", "head.weight"]);
    let frozen_before = bits(&params.proj.weight);
    let tokens: Vec<i32> = (0..32).map(|i| (i * 7) % VOCAB).collect();
    let targets: Vec<i32> = tokens.iter().map(|t| (t + 1) % VOCAB).collect();
    let batch = [
        Array::from_slice(&tokens, &[4, 8]),
        Array::from_slice(&targets, &[4, 8]),
    ];
    let optimizer = AdamW::default();
    let mut state = TrainState::new(params, &optimizer, 0)?;
    let mut step = TrainStep::new(&state, optimizer, loss, StepOptions::default())?;
    let mut losses = Vec::new();
    for _ in 0..5 {
        let metrics = step.step(&mut state, 1e-2, &batch)?;
        eval(&metrics.outputs)?;
        losses.push(metrics.loss.item_exact::<f32>());
    }
    assert!(losses[4] < losses[0], "the loss must fall: {losses:?}");
    assert_eq!(bits(&state.params.proj.weight), frozen_before);
    Ok(())
}
