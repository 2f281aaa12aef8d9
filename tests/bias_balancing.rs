//! DeepSeek-V3's auxiliary-loss-free balancing through a buffer: `e_score_correction_bias` is
//! state each training step moves by `bias_update_speed * sign(mean load - load)` from the
//! step's own routing counts, never trained or decayed by the optimizer, checkpointed, resumed
//! and exported under its name.

use lmx::models::deepseek_v3::{Config, DeepseekV3, Pass, Train};
use lmx::runtime::data::Windows;
use lmx::runtime::hf::{self, Family};
use lmx::runtime::lora::{self, AdapterConfig, FineTuneType, LoraParameters};
use lmx::runtime::mlx_rs::{self, Dtype};
use lmx::runtime::model::{Context, LanguageModel, TrainingStep};
use lmx::runtime::nn;
use lmx::runtime::schedule::Schedule;
use lmx::runtime::state::TrainState;
use lmx::runtime::train::{TrainConfig, TrainData, Trainer};
use lmx::runtime::tree::{self, LeafRole};
use lmx::runtime::Array;
use std::path::Path;
use std::sync::Arc;

type Params = <DeepseekV3 as LanguageModel>::Params;

/// The tiny preset with one dense layer and two routed ones (8 experts in 4 groups, top 2 of
/// the best 2 groups).
fn config() -> Config {
    Config::preset("tiny").expect("the tiny preset")
}

/// A corpus of pseudo-random token ids and its windows.
fn windows(seq_len: usize) -> Windows {
    let tokens: Vec<u32> = (0..8193u32).map(|i| (i * 7919 + 13) % 256).collect();
    Windows::new(Arc::new(tokens), seq_len).expect("windows")
}

fn train_config(dir: &Path, steps: u64, lr: f32) -> TrainConfig {
    TrainConfig {
        steps,
        batch_size: 4,
        seq_len: 16,
        schedule: Schedule::Constant {
            lr,
            warmup_steps: 0,
        },
        validation_fraction: 0.0,
        checkpoint_every: 2,
        out_dir: dir.to_path_buf(),
        ..TrainConfig::default()
    }
}

fn trainer(dir: &Path, config: &Config, params: Params, steps: u64, lr: f32) -> Trainer<Train> {
    let data = TrainData::split(windows(16), 0.0, 256).unwrap();
    Trainer::<Train>::with_params(config.clone(), train_config(dir, steps, lr), data, params)
        .unwrap()
}

fn values(array: &Array) -> Vec<f32> {
    array.eval().unwrap();
    array.as_slice::<f32>().to_vec()
}

/// Every routed layer's selection bias, in layer order.
fn biases(params: &Params) -> Vec<Vec<f32>> {
    params
        .model
        .layers
        .iter()
        .filter_map(|layer| layer.mlp.gate.as_ref())
        .map(|gate| values(&gate.e_score_correction_bias))
        .collect()
}

/// `params` with every routed layer's router weight zero (every score 0.5) and the selection
/// bias `bias`, so that the bias alone makes the choice.
fn with_router(mut params: Params, weight_scale: f32, bias: &[f32]) -> Params {
    for layer in &mut params.model.layers {
        if let Some(gate) = layer.mlp.gate.as_mut() {
            gate.weight = gate.weight.multiply(Array::from_f32(weight_scale)).unwrap();
            gate.e_score_correction_bias = Array::from_slice(bias, &[bias.len() as i32]);
        }
    }
    params
}

/// The bias as the rule moves it once: `b + gamma * sign(mean load - load)` in float32.
fn moved(bias: &[f32], load: &[f32]) -> Vec<f32> {
    let mean = load.iter().sum::<f32>() / load.len() as f32;
    bias.iter()
        .zip(load)
        .map(|(b, l)| {
            let sign = if mean > *l {
                1.0
            } else if mean < *l {
                -1.0
            } else {
                0.0
            };
            b + 0.001f32 * sign
        })
        .collect()
}

/// By hand: with every score equal, the bias `0.08, 0.07, ..., 0.01` puts every token on
/// experts 0 and 1 (groups {0, 1} and {2, 3} sum highest; their two best experts are 0 and 1):
/// each of the 64 tokens of a batch adds one to the load of both, so the mean load is 16, and
/// each step moves experts 0 and 1 down by 0.001 and the six others up. The router's weight
/// trains at a rate too small to change that choice in three steps; the bias is what the rule
/// gives to the bit, so neither AdamW's update nor its weight decay (0.1) touched it.
#[test]
fn each_step_moves_the_bias_by_the_sign_of_each_experts_load_error() {
    let config = config();
    let start: Vec<f32> = (0..8).map(|e| 0.08 - 0.01 * e as f32).collect();
    let params = with_router(DeepseekV3::init(&config, 0).unwrap(), 0.0, &start);
    let dir = tempfile::tempdir().unwrap();
    let mut trainer = trainer(dir.path(), &config, params, 3, 1e-4);
    trainer.run().unwrap();
    let load = [64.0, 64.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
    let mut expected = start.clone();
    for _ in 0..3 {
        expected = moved(&expected, &load);
    }
    assert!((expected[0] - 0.077).abs() < 1e-6 && (expected[2] - 0.063).abs() < 1e-6);
    for bias in biases(&trainer.state().params) {
        assert_eq!(bias, expected, "bit for bit the rule's value");
    }
}

/// The buffer is no parameter of the compiled state: no gradient, no optimizer moments, no
/// weight decay; its name is the checkpoint's and transformers'.
#[test]
fn the_bias_is_a_buffer_of_the_state() {
    let params = DeepseekV3::init(&config(), 0).unwrap();
    let specs = tree::specs(&params);
    let bias = specs
        .iter()
        .find(|spec| spec.name == "model.layers.1.mlp.gate.e_score_correction_bias")
        .expect("the routed layer's bias");
    assert_eq!(bias.role, LeafRole::Buffer);
    assert!(!bias.trainable && !bias.decay, "{bias:?}");
    let state = TrainState::new(params, &Train::optimizer(), 0).unwrap();
    let declared = state.declaration();
    assert!(declared.contains(&"params.model.layers.1.mlp.gate.e_score_correction_bias".to_owned()));
    assert!(
        !declared
            .iter()
            .any(|name| name.starts_with("opt.") && name.contains("e_score_correction_bias")),
        "no optimizer state for a buffer"
    );
}

/// The per-expert loads of a batch at the first routed layer, counted on the host from the
/// model's own routing (`route_groups` over the router's scores and the bias).
fn loads(params: &Params, config: &Config, tokens: &Array) -> Vec<f32> {
    let mut ctx = Context::evaluation();
    let mut pass = Pass::new(config, &mut ctx, tokens);
    let mut x = nn::embedding(&params.model.embed_tokens, tokens).unwrap();
    let eps = config.eps as f32;
    for layer in &params.model.layers {
        let h = nn::rms_norm(&layer.input_layernorm, &x, eps).unwrap();
        let residual = Some(nn::Residual::new(&x, 0.0));
        let x_attn = layer.self_attn.forward(&mut pass, &h, residual).unwrap();
        let h = nn::rms_norm(&layer.post_attention_layernorm, &x_attn, eps).unwrap();
        if let Some(gate) = layer.mlp.gate.as_ref() {
            let scores = mlx_rs::ops::sigmoid(h.matmul(gate.weight.t()).unwrap()).unwrap();
            let chosen = nn::route_groups(
                &scores,
                &gate.e_score_correction_bias,
                config.experts_per_token as i32,
                config.n_group as i32,
                config.topk_group as i32,
            )
            .unwrap();
            let experts = Array::arange::<_, i32>(None, config.n_experts as i32, None).unwrap();
            let picks = chosen
                .as_dtype(Dtype::Int32)
                .and_then(|chosen| chosen.reshape(&[-1, 1]))
                .and_then(|chosen| chosen.eq(&experts))
                .and_then(|picks| picks.as_dtype(Dtype::Float32))
                .unwrap();
            return values(&picks.sum_axis(0, false).unwrap());
        }
        x = x_attn
            .add(layer.mlp.forward(&mut pass, true, &h).unwrap())
            .unwrap();
    }
    panic!("the tiny preset has a routed layer");
}

/// The largest load over the mean load.
fn imbalance(load: &[f32]) -> f32 {
    let mean = load.iter().sum::<f32>() / load.len() as f32;
    load.iter().cloned().fold(0.0, f32::max) / mean
}

/// A router skewed towards experts 0 and 1 (their bias 0.05 above the others', random scores
/// of a tenth of the usual spread): training moves the bias until the load is far more even.
#[test]
fn training_evens_out_a_skewed_routers_load() {
    let mut config = config();
    config.bias_update_speed = 0.005;
    let skew = [0.05, 0.05, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
    let params = with_router(DeepseekV3::init(&config, 0).unwrap(), 0.1, &skew);
    let tokens =
        mlx_rs::random::randint::<_, i32>(0, 256, &[4, 16], &mlx_rs::random::key(5).unwrap())
            .unwrap();
    let before = imbalance(&loads(&params, &config, &tokens));
    let dir = tempfile::tempdir().unwrap();
    let mut trainer = trainer(dir.path(), &config, params, 24, 1e-4);
    trainer.run().unwrap();
    let after = imbalance(&loads(&trainer.state().params, &config, &tokens));
    println!("largest load over the mean: {before} before, {after} after 24 steps");
    assert!(before > 3.0, "the skewed router's imbalance {before}");
    assert!(after < 0.6 * before, "imbalance {before} -> {after}");
}

/// Trains `trainer(dir, 4)` uninterrupted, and `trainer(dir, 2)` then `trainer(dir, 4)` resumed
/// from its step-2 checkpoint in another folder; asserts every leaf the same, bit for bit, and
/// returns the uninterrupted run's parameters.
fn resumes_exactly(trainer: impl Fn(&Path, u64) -> Trainer<Train>) -> Params {
    let whole = tempfile::tempdir().unwrap();
    let mut uninterrupted = trainer(whole.path(), 4);
    uninterrupted.run().unwrap();
    let parts = tempfile::tempdir().unwrap();
    trainer(parts.path(), 2).run().unwrap();
    let mut resumed = trainer(parts.path(), 4);
    let latest = resumed.latest_checkpoint().unwrap().expect("a checkpoint");
    resumed.resume(&latest).unwrap();
    resumed.run().unwrap();
    let (a, b) = (&uninterrupted.state().params, &resumed.state().params);
    for ((name, x), y) in tree::names(a)
        .iter()
        .zip(tree::flatten(a))
        .zip(tree::flatten(b))
    {
        assert!(x.eq_values(&y).unwrap(), "{name} differs after resuming");
    }
    a.clone()
}

/// A run resumed from its step-2 checkpoint ends with the uninterrupted run's biases (and
/// every other leaf), bit for bit; the export names the bias as transformers does.
#[test]
fn the_bias_resumes_exactly_and_exports_under_its_name() {
    let config = config();
    let start: Vec<f32> = (0..8).map(|e| 0.01 * e as f32).collect();
    let params = || with_router(DeepseekV3::init(&config, 0).unwrap(), 1.0, &start);
    let a = &resumes_exactly(|dir, steps| trainer(dir, &config, params(), steps, 1e-3));
    assert_ne!(biases(a)[0], start, "the bias moved");
    let exported = hf::hf_tensors(Family::DeepseekV3, a, Dtype::Float32).unwrap();
    let (_, bias) = exported
        .iter()
        .find(|(name, _)| name == "model.layers.1.mlp.gate.e_score_correction_bias")
        .expect("the bias under transformers' name");
    assert_eq!(values(bias), biases(a)[0]);
}

/// A LoRA run over a frozen base still moves the bias: the step writes it whatever trains. Its
/// checkpoints leave the base out (as a run over a Hugging Face folder saves them) but keep the
/// bias, so a resumed run ends bit for bit where an uninterrupted one does; its adapter file
/// carries the bias to a base it is loaded over, and a file without it (mlx-lm's own) leaves
/// the base's.
#[test]
fn a_lora_run_keeps_the_bias_in_its_checkpoints_and_its_adapters() {
    let config = config();
    let start: Vec<f32> = (0..8).map(|e| 0.01 * e as f32).collect();
    let base = || with_router(DeepseekV3::init(&config, 0).unwrap(), 1.0, &start);
    let parameters = LoraParameters::default();
    let adapted = || {
        let mut params = base();
        lora::attach(&mut params, &parameters, -1, 0, FineTuneType::Lora).unwrap();
        params
    };
    let lora_trainer = |dir: &Path, steps| {
        let mut trainer = trainer(dir, &config, adapted(), steps, 1e-3);
        trainer.omit_frozen_from_checkpoints();
        trainer
    };
    let a = &resumes_exactly(lora_trainer);
    assert_ne!(biases(a)[0], start, "the bias moved");

    let adapters = tempfile::tempdir().unwrap();
    let adapter_config = AdapterConfig {
        fine_tune_type: FineTuneType::Lora,
        num_layers: -1,
        lora_parameters: parameters.clone(),
        other: Default::default(),
    };
    let family = Some(Family::DeepseekV3);
    lora::save_adapters(adapters.path(), a, &adapter_config, family).unwrap();
    let mut loaded = base();
    lora::load_adapters(&mut loaded, adapters.path(), family).unwrap();
    assert_eq!(
        biases(&loaded),
        biases(a),
        "the bias came with the adapters"
    );
    for ((spec, x), y) in tree::specs(a)
        .iter()
        .zip(tree::flatten(a))
        .zip(tree::flatten(&loaded))
        .filter(|((spec, _), _)| spec.role == LeafRole::Adapter)
    {
        assert!(
            x.eq_values(&y).unwrap(),
            "{} differs after loading",
            spec.name
        );
    }

    // mlx-lm's adapter files hold adapters alone: the base keeps its bias.
    let path = adapters.path().join(lora::ADAPTERS_FILE);
    let bytes = std::fs::read(&path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<(String, safetensors::tensor::TensorView)> = file
        .tensors()
        .into_iter()
        .filter(|(name, _)| !name.ends_with("e_score_correction_bias"))
        .collect();
    assert!(kept.len() < file.len(), "the file held the bias");
    safetensors::serialize_to_file(kept, None, &path).unwrap();
    let mut loaded = base();
    lora::load_adapters(&mut loaded, adapters.path(), family).unwrap();
    assert_eq!(biases(&loaded)[0], start, "the base's own bias");
}
