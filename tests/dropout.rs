//! Dropout in a `.lmx` forward pass (gpt2.lmx's `pdrop`): on in a training step, with masks from
//! the step's key, inside the compiled step as eagerly; off in evaluation (the trainer's
//! validation loss) and generation.

use lmx::models::gpt2::{self, Gpt2, Train};
use lmx::runtime::data::Windows;
use lmx::runtime::mlx_rs::random;
use lmx::runtime::model::{Context, LanguageModel, TrainingStep};
use lmx::runtime::state::TrainState;
use lmx::runtime::step::TrainStep;
use lmx::runtime::train::{TrainConfig, Trainer};
use lmx::runtime::{Array, Result};
use std::sync::Arc;

fn config(pdrop: f64) -> gpt2::Config {
    let mut config = gpt2::Config::preset("tiny").expect("gpt2.lmx has a tiny preset");
    config.pdrop = pdrop;
    config
}

fn batch() -> Result<[Array; 2]> {
    let tokens = random::randint::<_, i32>(0, 256, &[4, 16], &random::key(1)?)?;
    let targets = random::randint::<_, i32>(0, 256, &[4, 16], &random::key(2)?)?;
    Ok([tokens, targets])
}

fn value(loss: &Array) -> f32 {
    loss.eval().expect("evaluates");
    loss.item_exact::<f32>()
}

#[test]
fn dropout_draws_from_the_steps_key_and_is_off_without_one() -> Result<()> {
    let (on, off) = (config(0.3), config(0.0));
    let params = Gpt2::init(&on, 0)?;
    let batch = batch()?;
    let (a, b) = (random::key(10)?, random::key(11)?);
    let loss = |config: &gpt2::Config, key: &Array| -> Result<f32> {
        Ok(value(&Train::loss(&params, config, &batch, Some(key))?))
    };
    assert_eq!(
        loss(&on, &a)?,
        loss(&on, &a)?,
        "the same key, the same masks"
    );
    assert_ne!(loss(&on, &a)?, loss(&on, &b)?, "another key, other masks");
    assert_ne!(loss(&on, &a)?, loss(&off, &a)?, "dropout changes the loss");
    assert_eq!(loss(&off, &a)?, loss(&off, &b)?, "pdrop = 0 draws nothing");
    let unkeyed = value(&Train::loss(&params, &on, &batch, None)?);
    assert_eq!(
        unkeyed,
        loss(&off, &a)?,
        "evaluated without a key, dropout is off"
    );

    let logits = |config: &gpt2::Config| -> Result<Vec<f32>> {
        let logits = Gpt2::forward(&params, config, &batch[0], &mut Context::evaluation())?;
        Ok(logits.as_slice::<f32>().to_vec())
    };
    assert_eq!(logits(&on)?, logits(&off)?, "no key, no dropout");
    Ok(())
}

#[test]
fn the_compiled_step_draws_new_masks_every_step_from_its_state() -> Result<()> {
    let config = config(0.3);
    let optimizer = Train::optimizer();
    let mut state = TrainState::new(Gpt2::init(&config, 0)?, &optimizer, 5)?;
    let cfg = config.clone();
    let mut step = TrainStep::new(
        &state,
        optimizer,
        move |p: &gpt2::Params, b: &[Array], k: &Array| Train::loss(p, &cfg, b, Some(k)),
        Train::options(),
    )?;
    let batch = batch()?;
    let mut losses = Vec::new();
    let mut keys = Vec::new();
    for _ in 0..3 {
        // The step splits the state's key and hands the second half to the loss.
        let (_, subkey) = random::split(&state.key, 2)?;
        keys.push(subkey.as_slice::<u32>().to_vec());
        let eager = value(&Train::loss(&state.params, &config, &batch, Some(&subkey))?);
        let compiled = value(&step.step(&mut state, 1e-3, &batch)?.loss);
        assert!(
            (compiled - eager).abs() <= 1e-5 * eager.abs(),
            "compiled {compiled} vs eager {eager} with the same key"
        );
        losses.push(compiled);
    }
    assert_eq!(step.traces(), 1, "one trace for every key");
    assert!(
        keys[0] != keys[1] && keys[1] != keys[2],
        "each step's loss gets a new key: {keys:?}"
    );
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    Ok(())
}

#[test]
fn the_trainers_validation_loss_is_computed_without_dropout() -> Result<()> {
    let tokens: Vec<u32> = (0..4097u32).map(|i| (i * 7919) % 256).collect();
    let windows = Windows::new(Arc::new(tokens), 16)?;
    let validation = |pdrop: f64| -> Result<f32> {
        let out = tempfile::tempdir().unwrap();
        let train = TrainConfig {
            batch_size: 4,
            seq_len: 16,
            validation_fraction: 0.25,
            out_dir: out.path().to_path_buf(),
            ..TrainConfig::default()
        };
        let mut trainer = Trainer::<Train>::new(config(pdrop), train, windows.clone())?;
        Ok(trainer.validation_loss()?.expect("a validation split"))
    };
    assert_eq!(validation(0.5)?, validation(0.0)?);
    Ok(())
}
