//! A flat training state (`lmx::runtime::flat`) computes what the per-parameter state computes:
//! the same losses and parameters step by step, with frozen parameters left alone, weight decay
//! only where the tree says so, and checkpoints that either layout resumes from.

use lmx::models::gpt2;
use lmx::runtime::data::{rng::SplitMix64, Windows};
use lmx::runtime::flat::{FlatLayout, FlatStep};
use lmx::runtime::nn::{self, init::Keys, LinearParams};
use lmx::runtime::optim::{Adafactor, AdamW, DecayScope, Optimizer};
use lmx::runtime::schedule::Schedule;
use lmx::runtime::state::TrainState;
use lmx::runtime::step::{StepMetrics, StepOptions, TrainStep};
use lmx::runtime::train::{Callback, Control, StatePacking, StepReport, TrainConfig, Trainer};
use lmx::runtime::tree;
use lmx::runtime::{mlx_rs, Array, Error, Result};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// A small net with a frozen layer, decayed weights and an undecayed scale.
#[lmx::model]
pub struct Net {
    proj: LinearParams,
    #[lmx(frozen)]
    fixed: LinearParams,
    #[lmx(role = norm, no_decay)]
    scale: Array,
}

fn net() -> Result<Net> {
    let mut keys = Keys::from_seed(3)?;
    Ok(Net {
        proj: nn::init::linear(4, 3, true, &mut keys)?,
        fixed: nn::init::linear(4, 4, true, &mut keys)?,
        scale: Array::from_slice(&[1.0f32, 0.5, 2.0], &[3]),
    })
}

fn loss(params: &Net, batch: &[Array], _: &Array) -> Result<Array> {
    let hidden = nn::linear(&params.fixed, &batch[0])?;
    let out = nn::linear(&params.proj, &hidden)?.multiply(&params.scale)?;
    Ok(out.subtract(&batch[1])?.square()?.mean(false)?)
}

fn batch(seed: u64) -> Vec<Array> {
    let mut rng = SplitMix64::new(seed);
    let mut values = |count: usize| -> Vec<f32> {
        (0..count)
            .map(|_| rng.below(2001) as f32 / 1000.0 - 1.0)
            .collect()
    };
    vec![
        Array::from_slice(&values(32), &[8, 4]),
        Array::from_slice(&values(24), &[8, 3]),
    ]
}

fn values(array: &Array) -> Vec<f32> {
    array
        .as_dtype(mlx_rs::Dtype::Float32)
        .unwrap()
        .as_slice()
        .to_vec()
}

/// Asserts that `a` is within `tolerance` of `b`, relative to `b`.
fn assert_relative(a: f32, b: f32, tolerance: f32, what: &str) {
    assert!((a - b).abs() <= tolerance * b.abs(), "{what}: {a} vs {b}");
}

/// Asserts that a flat step reported the per-parameter step's loss and metrics (to 1e-6) and
/// gradient norm (to 1e-5).
fn assert_same_report(ours: &StepMetrics, theirs: &StepMetrics, what: &str) {
    let value = |a: &Array| a.item_exact::<f32>();
    assert_relative(
        value(&ours.loss),
        value(&theirs.loss),
        1e-6,
        &format!("{what}: loss"),
    );
    assert_eq!(ours.metrics.len(), theirs.metrics.len(), "{what}: metrics");
    for (index, (a, b)) in ours.metrics.iter().zip(&theirs.metrics).enumerate() {
        assert_relative(value(a), value(b), 1e-6, &format!("{what}: metric {index}"));
    }
    let norm = |m: &StepMetrics| value(&m.grad_norm);
    assert_relative(norm(ours), norm(theirs), 1e-5, &format!("{what}: norm"));
}

/// Asserts that the flat state `flat` unpacks to `state`, every value within 1e-6.
fn assert_same_state(
    flat_step: &FlatStep<Net, AdamW>,
    flat: &[Array],
    state: &TrainState<Net, AdamW>,
    what: &str,
) -> Result<TrainState<Net, AdamW>> {
    let unpacked = flat_step.unpack(flat)?;
    let names = tree::names(&state.params);
    for ((name, got), expected) in names.iter().zip(unpacked.flatten()).zip(state.flatten()) {
        for (a, b) in values(&got).iter().zip(&values(&expected)) {
            assert!((a - b).abs() <= 1e-6, "{what}: {name}: {a} vs {b}");
        }
    }
    Ok(unpacked)
}

fn optimizer() -> AdamW {
    AdamW {
        weight_decay: 0.1,
        ..AdamW::default()
    }
}

#[test]
fn packing_and_unpacking_gives_back_every_array_of_the_state() -> Result<()> {
    let state = TrainState::new(net()?, &optimizer(), 0)?;
    let step = FlatStep::new(&state, optimizer(), loss, StepOptions::default())?
        .expect("AdamW's state packs");
    let flat = step.pack(&state)?;
    // Two groups (decayed weights; undecayed biases and scale), their two moments, one frozen
    // layer of two arrays, the step and the key.
    assert_eq!(flat.len(), 2 + 4 + 2 + 2);
    let unpacked = step.unpack(&flat)?;
    assert_eq!(unpacked.declaration(), state.declaration());
    for (got, expected) in unpacked.flatten().iter().zip(state.flatten()) {
        assert_eq!(got.shape(), expected.shape());
        assert_eq!(values(got), values(&expected));
    }
    Ok(())
}

#[test]
fn buckets_cut_each_group_where_the_next_parameter_would_overflow_it() -> Result<()> {
    let state = TrainState::new(net()?, &optimizer(), 0)?;
    let leaves = state.flatten();
    // `proj.weight` (48 bytes) is decayed; `proj.bias` and `scale` (12 bytes each) are not.
    // Each count is the flat list's length: groups times (parameters and two moments), then the
    // frozen layer's two arrays, the step and the key.
    for (bucket, groups) in [
        (None, 2),
        (Some(1 << 20), 2),
        (Some(24), 2),
        (Some(23), 3),
        (Some(1), 3),
    ] {
        let layout = FlatLayout::of(&state, &optimizer(), DecayScope::Weights, bucket)?
            .expect("AdamW's state packs");
        assert_eq!(
            layout.len(),
            groups * 3 + 2 + 2,
            "buckets of {bucket:?} bytes"
        );
        let unpacked = layout.unpack(&layout.pack(&leaves)?)?;
        for (got, expected) in unpacked.iter().zip(&leaves) {
            assert_eq!(got.shape(), expected.shape());
            assert_eq!(values(got), values(expected), "buckets of {bucket:?} bytes");
        }
    }
    Ok(())
}

#[test]
fn a_flat_step_computes_the_per_parameter_steps_numbers() -> Result<()> {
    for compile in [true, false] {
        let options = StepOptions {
            compile,
            ..StepOptions::default()
        };
        let mut state = TrainState::new(net()?, &optimizer(), 0)?;
        let frozen_before = values(&state.params.fixed.weight);
        let mut flat_step = FlatStep::new(&state, optimizer(), loss, options)?.expect("packs");
        let mut flat = flat_step.pack(&state)?;
        let mut step = TrainStep::new(&state, optimizer(), loss, options)?;
        for index in 0..6 {
            let lr = 0.05 / (1 + index) as f32;
            let batch = batch(index);
            let ours = flat_step.step(&mut flat, lr, &batch)?;
            let theirs = step.step(&mut state, lr, &batch)?;
            assert_same_report(&ours, &theirs, &format!("compiled {compile}, step {index}"));
        }
        let what = format!("compiled {compile}");
        let unpacked = assert_same_state(&flat_step, &flat, &state, &what)?;
        assert_eq!(values(&unpacked.params.fixed.weight), frozen_before);
        assert_ne!(
            values(&unpacked.params.proj.weight),
            values(&net()?.proj.weight)
        );
    }
    Ok(())
}

/// A loss that reads a frozen model (a linear layer's leaves, `frozen`) and reports a metric
/// after itself: the squared distance of the net's outputs from the frozen layer's, and the mean
/// output.
fn loss_with_frozen(
    params: &Net,
    frozen: &[Array],
    batch: &[Array],
    key: &Array,
) -> Result<Vec<Array>> {
    let reference = LinearParams::new(frozen[0].clone(), Some(frozen[1].clone()));
    let target = nn::linear(&reference, &batch[0])?;
    let hidden = nn::linear(&params.fixed, &batch[0])?;
    let out = nn::linear(&params.proj, &hidden)?.multiply(&params.scale)?;
    let mean = out.mean(false)?;
    let loss = out.subtract(&target)?.square()?.mean(false)?;
    Ok(vec![loss.add(self::loss(params, batch, key)?)?, mean])
}

#[test]
fn a_flat_step_over_frozen_models_reports_the_per_parameter_steps_loss_and_metrics() -> Result<()> {
    let mut keys = Keys::from_seed(9)?;
    let reference = nn::init::linear(4, 3, true, &mut keys)?;
    let frozen = vec![
        reference.weight.clone(),
        reference.bias.clone().expect("a bias"),
    ];
    for (compile, accumulation) in [(true, 1), (false, 1), (true, 2), (false, 2)] {
        let options = StepOptions {
            compile,
            accumulation,
            clip_norm: Some(0.5),
            ..StepOptions::default()
        };
        let what = format!("compiled {compile}, {accumulation} micro-batches");
        let mut state = TrainState::new(net()?, &optimizer(), 0)?;
        let mut flat_step = FlatStep::data_parallel_with_frozen(
            &state,
            optimizer(),
            frozen.clone(),
            loss_with_frozen,
            1,
            options,
            None,
        )?
        .expect("packs");
        let mut flat = flat_step.pack(&state)?;
        let mut step = TrainStep::with_frozen_metrics(
            &state,
            optimizer(),
            frozen.clone(),
            loss_with_frozen,
            1,
            options,
        )?;
        for index in 0..5 {
            let batch = batch(20 + index);
            let ours = flat_step.step(&mut flat, 0.05, &batch)?;
            let theirs = step.step(&mut state, 0.05, &batch)?;
            assert_same_report(&ours, &theirs, &format!("{what}, step {index}"));
        }
        assert_same_state(&flat_step, &flat, &state, &what)?;
    }
    Ok(())
}

/// A linear loss whose gradients are its batch: `sum(w * batch[0]) + sum(b * batch[1])`.
#[lmx::model]
pub struct Wide {
    w: Array,
    #[lmx(role = norm, no_decay)]
    b: Array,
}

fn linear_loss(params: &Wide, batch: &[Array], _: &Array) -> Result<Array> {
    let w = params.w.multiply(&batch[0])?.sum(false)?;
    let b = params.b.multiply(&batch[1])?.sum(false)?;
    Ok(w.as_dtype(mlx_rs::Dtype::Float32)?
        .add(b.as_dtype(mlx_rs::Dtype::Float32)?)?)
}

#[test]
fn the_flat_steps_gradient_norm_is_the_norm_of_every_gradient_value() -> Result<()> {
    // 300 x 401 values take more than one pass of the packing kernel's grid (256 blocks of 256
    // threads for one input); the values are multiples of 1/8 below 4, exact in bfloat16.
    let (rows, columns, biases) = (300, 401, 7);
    let pattern = |count: usize, seed: usize| -> Vec<f32> {
        (0..count)
            .map(|i| ((i * 7 + seed) % 61) as f32 / 8.0 - 3.75)
            .collect()
    };
    let (gw, gb) = (pattern(rows * columns, 0), pattern(biases, 5));
    let expected = gw
        .iter()
        .chain(&gb)
        .map(|&v| f64::from(v) * f64::from(v))
        .sum::<f64>()
        .sqrt();
    for dtype in [mlx_rs::Dtype::Float32, mlx_rs::Dtype::Bfloat16] {
        let cast = |values: &[f32], shape: &[i32]| Array::from_slice(values, shape).as_dtype(dtype);
        let params = Wide {
            w: cast(&pattern(rows * columns, 3), &[rows as i32, columns as i32])?,
            b: cast(&pattern(biases, 1), &[biases as i32])?,
        };
        let state = TrainState::new(params, &optimizer(), 0)?;
        let mut step = FlatStep::new(&state, optimizer(), linear_loss, StepOptions::default())?
            .expect("packs");
        let mut flat = step.pack(&state)?;
        let batch = [
            cast(&gw, &[rows as i32, columns as i32])?,
            cast(&gb, &[biases as i32])?,
        ];
        let norm = f64::from(
            step.step(&mut flat, 1e-3, &batch)?
                .grad_norm
                .item_exact::<f32>(),
        );
        // MLX's float32 sum on the CPU adds this many squares with a relative error of 4.4e-4
        // (`mx.sum` in Python gives the same 763.030 against 763.363).
        assert!(
            (norm - expected).abs() <= 1e-3 * expected,
            "{dtype:?}: {norm} vs {expected}"
        );
    }
    Ok(())
}

#[test]
fn an_update_that_is_not_elementwise_is_not_packed() -> Result<()> {
    let state = TrainState::new(net()?, &Adafactor::default(), 0)?;
    assert!(!Adafactor::default().elementwise());
    assert!(FlatStep::new(&state, Adafactor::default(), loss, StepOptions::default())?.is_none());
    let state = TrainState::new(net()?, &optimizer(), 0)?;
    let options = StepOptions {
        accumulation: 0,
        ..StepOptions::default()
    };
    match FlatStep::new(&state, optimizer(), loss, options) {
        Err(Error::Config(message)) => assert!(message.contains("micro-batch"), "{message}"),
        Err(other) => panic!("expected a configuration error, got {other}"),
        Ok(_) => panic!("a step of no micro-batch was made"),
    }
    Ok(())
}

#[test]
fn an_accumulating_flat_step_computes_the_per_parameter_steps_numbers() -> Result<()> {
    // The same update as per-parameter accumulation, and not the update of the whole batch at
    // once: the loss is a mean of squares over the rows, so the micro-batches' mean of means is
    // the batch's mean, but clipping at 0.05 and two micro-batches per update still leave the
    // accumulated path the only one whose numbers these are.
    for compile in [true, false] {
        let options = StepOptions {
            compile,
            accumulation: 2,
            clip_norm: Some(0.05),
            ..StepOptions::default()
        };
        let mut state = TrainState::new(net()?, &optimizer(), 0)?;
        let mut flat_step = FlatStep::new(&state, optimizer(), loss, options)?.expect("packs");
        let mut flat = flat_step.pack(&state)?;
        let mut step = TrainStep::new(&state, optimizer(), loss, options)?;
        for index in 0..5 {
            let batch = batch(10 + index);
            let ours = flat_step.step(&mut flat, 0.05, &batch)?;
            let theirs = step.step(&mut state, 0.05, &batch)?;
            assert_same_report(&ours, &theirs, &format!("compiled {compile}, step {index}"));
        }
        // Two functions, each traced once (or run once per call when eager).
        if compile {
            assert_eq!(flat_step.traces(), 2);
        }
        let unpacked =
            assert_same_state(&flat_step, &flat, &state, &format!("compiled {compile}"))?;
        assert_ne!(
            values(&unpacked.params.proj.weight),
            values(&net()?.proj.weight)
        );
    }
    Ok(())
}

fn gpt2_run(
    dir: &Path,
    packing: StatePacking,
    steps: u64,
    resume_from: Option<&Path>,
) -> Result<(Trainer<gpt2::Anchor>, Vec<f32>)> {
    let mut config = gpt2::Config::preset("tiny").expect("the tiny preset");
    config.ctx = 16;
    let mut rng = SplitMix64::new(1);
    let tokens: Vec<u32> = (0..2_000).map(|_| rng.below(256) as u32).collect();
    let windows = Windows::new(Arc::new(tokens), 16)?;
    let train = TrainConfig {
        steps,
        batch_size: 4,
        seq_len: 16,
        schedule: Schedule::Constant {
            lr: 3e-3,
            warmup_steps: 0,
        },
        state_packing: packing,
        validation_fraction: 0.0,
        eval_every: 0,
        checkpoint_every: 3,
        out_dir: dir.to_path_buf(),
        ..TrainConfig::default()
    };
    let mut trainer = Trainer::<gpt2::Anchor>::new(config, train, windows)?;
    if let Some(checkpoint) = resume_from {
        trainer.resume(checkpoint)?;
    }
    let losses = Arc::new(Mutex::new(Vec::new()));
    trainer.add_callback(Losses(losses.clone()));
    trainer.run()?;
    let losses = losses.lock().expect("not poisoned").clone();
    Ok((trainer, losses))
}

/// Collects a run's training losses.
struct Losses(Arc<Mutex<Vec<f32>>>);

impl Callback for Losses {
    fn on_step(&mut self, report: &StepReport) -> Result<Control> {
        self.0.lock().expect("not poisoned").push(report.loss);
        Ok(Control::Continue)
    }
}

#[test]
fn the_trainer_with_a_flat_state_trains_checkpoints_and_resumes_as_with_per_parameter_state(
) -> Result<()> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (per_parameter, expected) = gpt2_run(
        &dir.path().join("per-parameter"),
        StatePacking::PerParameter,
        6,
        None,
    )?;
    let (flat, losses) = gpt2_run(&dir.path().join("flat"), StatePacking::Flat, 6, None)?;
    assert!(flat.flat_state() && !per_parameter.flat_state());
    for (step, (a, b)) in losses.iter().zip(&expected).enumerate() {
        assert_relative(*a, *b, 1e-5, &format!("step {}", step + 1));
    }
    // On CUDA the gradient norm adds its squares in another grouping, which moves its last bits,
    // and Adam turns rounding noise in a gradient that is zero in exact arithmetic (the attention
    // key's bias) into steps of the learning rate's size: parameters agree to a tenth of one step
    // (the custom net above checks the update itself to 1e-6).
    for ((name, a), b) in tree::names(&flat.state().params)
        .iter()
        .zip(tree::flatten(&flat.state().params))
        .zip(tree::flatten(&per_parameter.state().params))
    {
        for (x, y) in values(&a).iter().zip(&values(&b)) {
            assert!((x - y).abs() <= 3e-4, "{name}: {x} vs {y}");
        }
    }
    // A flat run resumes from the per-parameter run's checkpoint at step 3 and goes on as it did.
    let checkpoint = dir.path().join("per-parameter/checkpoints/step-000003");
    let (resumed, losses) = gpt2_run(
        &dir.path().join("resumed"),
        StatePacking::Flat,
        6,
        Some(&checkpoint),
    )?;
    assert!(resumed.flat_state());
    assert_eq!(losses.len(), 3);
    for (step, (a, b)) in losses.iter().zip(&expected[3..]).enumerate() {
        assert_relative(*a, *b, 1e-5, &format!("step {}", step + 4));
    }
    Ok(())
}
