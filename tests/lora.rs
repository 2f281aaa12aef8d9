//! LoRA on a bundled model (LLaMA at `tiny`): attaching adapters leaves the outputs unchanged,
//! the compiled step's state holds optimizer moments for the adapters only and training leaves
//! the base bit-identical, fused weights compute what base + adapters did, adapters round-trip
//! through mlx-lm's files, and adapters written by mlx-lm itself load and give its logits.

use lmx::models::gpt2::{self, Gpt2};
use lmx::models::llama::{self, Llama};
use lmx::runtime::hf::Family;
use lmx::runtime::lora::{self, AdapterConfig, LoraParameters};
use lmx::runtime::model::{Context, LanguageModel, TrainingStep};
use lmx::runtime::state::TrainState;
use lmx::runtime::step::TrainStep;
use lmx::runtime::tree::{self, LeafRole, Tree};
use lmx::runtime::{mlx_rs, Array, Result};
use std::path::Path;

type Params = <Llama as LanguageModel>::Params;
type Config = <Llama as LanguageModel>::Config;

fn tiny() -> Result<(Config, Params)> {
    let config = Llama::preset("tiny").expect("llama has a tiny preset");
    let params = Llama::init(&config, 0)?;
    Ok((config, params))
}

fn tokens(vocab: i32, seed: u64) -> Result<Array> {
    let key = mlx_rs::random::key(seed)?;
    Ok(mlx_rs::random::randint::<_, i32>(0, vocab, &[2, 12], &key)?)
}

fn logits(params: &Params, config: &Config, tokens: &Array) -> Result<Array> {
    Llama::forward(params, config, tokens, &mut Context::evaluation())
}

fn max_difference(a: &Array, b: &Array) -> f32 {
    a.subtract(b)
        .and_then(|d| d.abs())
        .and_then(|d| d.max(None))
        .map(|d| d.item_exact::<f32>())
        .expect("a difference")
}

/// A few compiled AdamW steps of llama's declared step on one batch; returns the state.
fn train(
    params: Params,
    config: &Config,
    steps: usize,
) -> Result<TrainState<Params, <llama::Train as TrainingStep>::Optimizer>> {
    let optimizer = llama::Train::optimizer();
    let mut state = TrainState::new(params, &optimizer, 0)?;
    let cfg = config.clone();
    let mut step = TrainStep::new(
        &state,
        optimizer,
        move |p: &Params, b: &[Array], k: &Array| llama::Train::loss(p, &cfg, b, Some(k)),
        llama::Train::options(),
    )?;
    let input = tokens(256, 1)?;
    let targets = input
        .add(Array::from_int(1))?
        .remainder(Array::from_int(256))?;
    let batch = [input, targets];
    for _ in 0..steps {
        step.step(&mut state, 1e-2, &batch)?.loss.eval()?;
    }
    Ok(state)
}

#[test]
fn attached_adapters_leave_the_outputs_exactly_unchanged() -> Result<()> {
    let (config, base) = tiny()?;
    let mut adapted = base.clone();
    let names = lora::attach(&mut adapted, &LoraParameters::default(), -1, 0)?;
    // Every linear layer of both blocks: 4 in attention, 3 in the MLP.
    assert_eq!(names.len(), 14, "{names:?}");
    let input = tokens(256, 3)?;
    let (a, b) = (
        logits(&base, &config, &input)?,
        logits(&adapted, &config, &input)?,
    );
    assert_eq!(max_difference(&a, &b), 0.0);
    Ok(())
}

#[test]
fn num_layers_and_keys_choose_the_layers_as_mlx_lm_does() -> Result<()> {
    let (_, base) = tiny()?;
    let mut adapted = base.clone();
    let parameters = LoraParameters {
        keys: Some(vec!["self_attn.q_proj".into(), "self_attn.v_proj".into()]),
        ..LoraParameters::default()
    };
    let names = lora::attach(&mut adapted, &parameters, 1, 0)?;
    assert_eq!(
        names,
        [
            "model.layers.1.self_attn.q_proj",
            "model.layers.1.self_attn.v_proj"
        ]
    );
    let mut unknown = base.clone();
    let err = lora::attach(
        &mut unknown,
        &LoraParameters {
            keys: Some(vec!["self_attn.qkv".into()]),
            ..LoraParameters::default()
        },
        -1,
        0,
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("configuration: LoRA key `self_attn.qkv` names no linear layer"),
        "{err}"
    );
    let err = lora::attach(&mut unknown, &LoraParameters::default(), 3, 0).unwrap_err();
    assert_eq!(
        err.to_string(),
        "num_layers is 3; it must be at most the model's number of blocks (-1: all)"
    );
    assert_eq!(
        tree::names(&unknown),
        tree::names(&base),
        "unchanged on error"
    );
    Ok(())
}

#[test]
fn only_adapters_train_and_the_base_stays_bit_identical() -> Result<()> {
    let (config, base) = tiny()?;
    let mut adapted = base.clone();
    lora::attach(&mut adapted, &LoraParameters::default(), 1, 0)?;
    let before = adapted.clone();
    let state = train(adapted, &config, 3)?;
    // The compiled step's declared state: every parameter, optimizer moments for adapters only.
    let optimizer_entries: Vec<String> = state
        .declaration()
        .into_iter()
        .filter(|name| name.starts_with("opt."))
        .collect();
    assert!(!optimizer_entries.is_empty());
    for name in &optimizer_entries {
        let param = name.trim_start_matches("opt.").rsplit_once('.').unwrap().0;
        assert!(
            param.ends_with(".lora_a") || param.ends_with(".lora_b"),
            "{name}"
        );
    }
    // AdamW: two moments for each of the 7 adapted layers' two matrices.
    assert_eq!(optimizer_entries.len(), 7 * 2 * 2);
    let specs = tree::specs(&state.params);
    let (after, before) = (tree::flatten(&state.params), tree::flatten(&before));
    for ((spec, after), before) in specs.iter().zip(&after).zip(&before) {
        let same = after.eq_values(before)?;
        match spec.role {
            LeafRole::Adapter if spec.name.ends_with("lora_b") => {
                assert!(!same, "{} did not change", spec.name)
            }
            LeafRole::Adapter => {}
            _ => assert!(same, "{} changed", spec.name),
        }
    }
    Ok(())
}

#[test]
fn fused_weights_compute_what_base_and_adapters_did() -> Result<()> {
    let (config, mut adapted) = tiny()?;
    lora::attach(&mut adapted, &LoraParameters::default(), -1, 0)?;
    let trained = train(adapted, &config, 3)?.params;
    let mut fused = trained.clone();
    assert_eq!(lora::fuse(&mut fused)?, 14);
    assert_eq!(tree::names(&fused), tree::names(&tiny()?.1));
    let input = tokens(256, 5)?;
    let (a, b) = (
        logits(&trained, &config, &input)?,
        logits(&fused, &config, &input)?,
    );
    let error = max_difference(&a, &b);
    assert!(error < 1e-5, "max difference {error:e}");
    Ok(())
}

#[test]
fn adapters_round_trip_through_mlx_lm_s_files() -> Result<()> {
    let (config, base) = tiny()?;
    let mut adapted = base.clone();
    let parameters = LoraParameters {
        keys: Some(vec!["mlp.down_proj".into()]),
        ..LoraParameters::default()
    };
    lora::attach(&mut adapted, &parameters, 2, 0)?;
    let trained = train(adapted, &config, 2)?.params;
    let dir = tempfile::tempdir().unwrap();
    let adapter_config = AdapterConfig {
        fine_tune_type: "lora".into(),
        num_layers: 2,
        lora_parameters: parameters,
        other: Default::default(),
    };
    lora::save_adapters(dir.path(), &trained, &adapter_config, None)?;
    let mut loaded = base.clone();
    assert_eq!(
        lora::load_adapters(&mut loaded, dir.path(), None)?,
        adapter_config
    );
    let input = tokens(256, 7)?;
    let (a, b) = (
        logits(&trained, &config, &input)?,
        logits(&loaded, &config, &input)?,
    );
    assert_eq!(max_difference(&a, &b), 0.0);
    Ok(())
}

#[test]
fn adapters_that_do_not_fit_the_model_name_the_tensor() -> Result<()> {
    let (config, base) = tiny()?;
    let mut adapted = base.clone();
    lora::attach(
        &mut adapted,
        &LoraParameters {
            rank: 4,
            ..LoraParameters::default()
        },
        1,
        0,
    )?;
    let dir = tempfile::tempdir().unwrap();
    let mut adapter_config = AdapterConfig {
        fine_tune_type: "lora".into(),
        num_layers: 1,
        lora_parameters: LoraParameters::default(),
        other: Default::default(),
    };
    // The file's arrays have rank 4; the configuration says 8.
    lora::save_adapters(dir.path(), &adapted, &adapter_config, None)?;
    let mut loaded = base.clone();
    let err = lora::load_adapters(&mut loaded, dir.path(), None).unwrap_err();
    let file = dir.path().join("adapters.safetensors");
    assert_eq!(
        err.to_string(),
        format!(
            "{}: model.layers.1.self_attn.q_proj.lora_a: checkpoint has [64, 4], model expects [64, 8]",
            file.display()
        )
    );
    assert_eq!(
        tree::names(&loaded),
        tree::names(&base),
        "unchanged on error"
    );
    adapter_config.fine_tune_type = "dora".into();
    lora::save_adapters(dir.path(), &adapted, &adapter_config, None)?;
    let err = lora::load_adapters(&mut loaded, dir.path(), None).unwrap_err();
    assert!(
        err.to_string()
            .ends_with("fine_tune_type is `dora`; lmx loads `lora` adapters"),
        "{err}"
    );
    let _ = config;
    Ok(())
}

/// `tests/fixtures/lora/`: a tiny LLaMA and its adapters, both written by mlx-lm's own code, with
/// the logits mlx-lm computed (`tests/fixtures/lora/make.py`).
#[test]
fn adapters_written_by_mlx_lm_give_mlx_lm_s_logits() -> Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lora");
    let config = Llama::preset("tiny").expect("tiny");
    let template = Llama::init(&config, 0)?;
    let mut params =
        lmx::runtime::checkpoint::load_tree(&dir.join("model.safetensors"), &template)?;
    lora::load_adapters(&mut params, &dir.join("adapters"), Some(Family::Llama))?;
    let reference =
        Array::load_safetensors(dir.join("logits.safetensors")).expect("the fixture's logits");
    let input = reference["tokens"].clone();
    let ours = logits(&params, &config, &input)?;
    let error = max_difference(&ours, &reference["logits"]);
    assert!(error < 1e-4, "max difference {error:e}");
    // lmx saves what it loaded as mlx-lm wrote it: the same tensors by name, bit for bit. (With
    // LMX_LORA_SAVE_TO=DIR the folder is kept, for `make.py --check DIR`: mlx-lm loads it.)
    let keep = std::env::var_os("LMX_LORA_SAVE_TO").map(std::path::PathBuf::from);
    let temp = tempfile::tempdir().unwrap();
    let saved = keep.unwrap_or_else(|| temp.path().to_owned());
    let config_read = lora::read_config(&dir.join("adapters"))?;
    lora::save_adapters(&saved, &params, &config_read, Some(Family::Llama))?;
    let ours = Array::load_safetensors(saved.join(lora::ADAPTERS_FILE)).expect("saved adapters");
    let theirs =
        Array::load_safetensors(dir.join("adapters").join(lora::ADAPTERS_FILE)).expect("fixture");
    let mut names: Vec<&String> = ours.keys().collect();
    names.sort();
    let mut expected: Vec<&String> = theirs.keys().collect();
    expected.sort();
    assert_eq!(names, expected);
    for name in names {
        assert!(ours[name].eq_values(&theirs[name])?, "{name}");
    }
    assert_eq!(lora::read_config(&saved)?, config_read);
    let fused_reference = &reference["fused_logits"];
    let mut fused = params.clone();
    lora::fuse(&mut fused)?;
    let error = max_difference(&logits(&fused, &config, &input)?, fused_reference);
    assert!(error < 1e-4, "fused: max difference {error:e}");
    Ok(())
}

/// GPT-2's adapters carry the names of mlx-lm's module tree, `model.h.N...` (its `Model` holds
/// the network as `model`, the checkpoints have no prefix): mlx-lm loads adapters by name and
/// skips unknown ones silently, so adapters under the checkpoint's names would load as nothing.
/// lmx reads them back onto its own tree.
#[test]
fn gpt2_adapters_are_named_as_mlx_lm_s_modules() -> Result<()> {
    let config = gpt2::Config::preset("tiny").expect("tiny");
    let base = Gpt2::init(&config, 0)?;
    let mut adapted = base.clone();
    lora::attach(&mut adapted, &LoraParameters::default(), 1, 0)?;
    // Adapters that are not zero, so that loading them changes the logits.
    let mut seed = 0;
    let specs = tree::specs(&adapted);
    let mut roles = specs.iter();
    adapted.for_each_mut(&mut |leaf| {
        if roles.next().unwrap().role == LeafRole::Adapter {
            seed += 1;
            let key = mlx_rs::random::key(seed).unwrap();
            *leaf = mlx_rs::random::normal::<f32>(leaf.shape(), None, None, &key).unwrap();
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let adapter_config = AdapterConfig {
        fine_tune_type: "lora".into(),
        num_layers: 1,
        lora_parameters: LoraParameters::default(),
        other: Default::default(),
    };
    lora::save_adapters(dir.path(), &adapted, &adapter_config, Some(Family::Gpt2))?;
    let saved = Array::load_safetensors(dir.path().join(lora::ADAPTERS_FILE)).expect("saved");
    let mut names: Vec<&String> = saved.keys().collect();
    names.sort();
    // What mlx-lm's `linear_to_lora_layers(model, 1, ...)` makes of its GPT-2 of two blocks
    // (mlx_lm 0.32.2, `tree_flatten(model.parameters())`'s names with `lora` in them).
    let expected = [
        "model.h.1.attn.c_attn.lora_a",
        "model.h.1.attn.c_attn.lora_b",
        "model.h.1.attn.c_proj.lora_a",
        "model.h.1.attn.c_proj.lora_b",
        "model.h.1.mlp.c_fc.lora_a",
        "model.h.1.mlp.c_fc.lora_b",
        "model.h.1.mlp.c_proj.lora_a",
        "model.h.1.mlp.c_proj.lora_b",
    ];
    assert_eq!(names, expected.iter().collect::<Vec<_>>());
    let mut loaded = base.clone();
    lora::load_adapters(&mut loaded, dir.path(), Some(Family::Gpt2))?;
    let input = tokens(256, 3)?;
    let forward =
        |params: &gpt2::Params| Gpt2::forward(params, &config, &input, &mut Context::evaluation());
    assert_eq!(max_difference(&forward(&adapted)?, &forward(&loaded)?), 0.0);
    assert!(max_difference(&forward(&base)?, &forward(&loaded)?) > 0.0);
    // Under the checkpoint's names they are not GPT-2's adapters for mlx-lm, nor for lmx.
    let mut again = base.clone();
    let err = lora::load_adapters(&mut again, dir.path(), None).unwrap_err();
    assert!(err.to_string().contains("h.1.attn.c_attn.lora_a"), "{err}");
    Ok(())
}
