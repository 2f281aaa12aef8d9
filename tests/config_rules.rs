//! A generated model refuses a configuration that breaks its `.lmx` rules wherever it is used
//! from Rust (`init`, the trainer, generation), with the message `lmx check` gives a preset with
//! those values, instead of a panic, SIGFPE or MLX error.

use lmx::models::{gpt2, llama};
use lmx::runtime::data::Windows;
use lmx::runtime::generate::{generate, Sampling};
use lmx::runtime::model::LanguageModel;
use lmx::runtime::train::{TrainConfig, Trainer};
use std::sync::Arc;

fn gpt2_tiny(change: fn(&mut gpt2::Config)) -> gpt2::Config {
    let mut config = gpt2::Config::preset("tiny-bytes").unwrap();
    change(&mut config);
    config
}

#[test]
fn init_and_validate_refuse_settings_that_break_the_rules() {
    let cases: [(gpt2::Config, &str); 5] = [
        (
            gpt2_tiny(|c| c.n_heads = 0),
            "configuration: Gpt2: `head_dim = d_model / n_heads` divides by zero: 32 / 0",
        ),
        (
            gpt2_tiny(|c| c.pdrop = 1.5),
            "configuration: Gpt2: `pdrop` is 1.5: a dropout probability must be in [0, 1)",
        ),
        (
            gpt2_tiny(|c| c.pdrop = f64::NAN),
            "configuration: Gpt2: `pdrop` is NaN; a float setting must be a finite number",
        ),
        (
            gpt2_tiny(|c| c.d_model = 0),
            "configuration: Gpt2: `d_model` is 0, a size of `wte`; sizes must be at least 1",
        ),
        (
            gpt2_tiny(|c| c.d_model = -32),
            "configuration: Gpt2: `d_model` is -32, a size of `wte`; sizes must be at least 1",
        ),
    ];
    for (config, message) in cases {
        assert_eq!(
            gpt2::Gpt2::validate(&config).unwrap_err().to_string(),
            message
        );
        assert_eq!(gpt2::init(&config, 0).unwrap_err().to_string(), message);
    }
    let mut llama_config = llama::Config::preset("tiny").unwrap();
    llama_config.n_kv_heads = 0;
    assert_eq!(
        llama::init(&llama_config, 0).unwrap_err().to_string(),
        "configuration: Llama: `kv_dim = n_kv_heads * head_dim` is 0, a size of \
         `model.layers.0.self_attn.k_proj`; sizes must be at least 1"
    );
    gpt2::Gpt2::validate(&gpt2::Config::preset("tiny-bytes").unwrap()).unwrap();
}

#[test]
fn the_trainer_and_generation_refuse_an_invalid_configuration() {
    let bad = gpt2_tiny(|c| c.n_heads = 3);
    let message = "configuration: Gpt2: `head_dim = d_model / n_heads` does not divide exactly: \
                   32 / 3 leaves a remainder";
    let dir = tempfile::tempdir().unwrap();
    let config = TrainConfig {
        seq_len: 8,
        batch_size: 2,
        out_dir: dir.path().to_path_buf(),
        ..TrainConfig::default()
    };
    let windows = Windows::new(Arc::new((0..200u32).collect::<Vec<_>>()), 8).unwrap();
    let trainer = Trainer::<gpt2::Train>::new(bad.clone(), config, windows);
    assert_eq!(trainer.err().unwrap().to_string(), message);

    let params = gpt2::init(&gpt2_tiny(|_| ()), 0).unwrap();
    let generated =
        generate::<gpt2::Gpt2>(&params, &bad, &[65], &Sampling::default(), None, |_| ());
    assert_eq!(generated.unwrap_err().to_string(), message);
}
