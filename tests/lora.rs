//! LoRA on a bundled model (LLaMA at `tiny`): attaching adapters leaves the outputs unchanged,
//! the compiled step's state holds optimizer moments for the adapters only and training leaves
//! the base bit-identical, fused weights compute what base + adapters did, adapters round-trip
//! through mlx-lm's files, and adapters written by mlx-lm itself load and give its logits.

use lmx::models::gpt2::{self, Gpt2};
use lmx::models::llama::{self, Llama};
use lmx::models::mixtral::{self, Mixtral};
use lmx::runtime::hf::Family;
use lmx::runtime::lora::{self, AdapterConfig, FineTuneType, LoraParameters};
use lmx::runtime::model::{Context, LanguageModel, TrainingStep};
use lmx::runtime::optim::Optimizer;
use lmx::runtime::state::TrainState;
use lmx::runtime::step::TrainStep;
use lmx::runtime::tree::{self, LayerMut, LeafRole, Scope, Tree};
use lmx::runtime::{mlx_rs, Array, Error, Result};
use std::path::Path;

type Params = <Llama as LanguageModel>::Params;
type Config = <Llama as LanguageModel>::Config;

fn tiny() -> Result<(Config, Params)> {
    let config = Llama::preset("tiny").expect("llama has a tiny preset");
    let params = Llama::init(&config, 0)?;
    Ok((config, params))
}

/// LoRA adapters with mlx-lm's default settings on the last `num_layers` blocks of `tree` (-1:
/// all), drawn from seed 0: the names of the adapted layers.
fn attach_default<R: Tree<Array>>(tree: &mut R, num_layers: i64) -> Result<Vec<String>> {
    lora::attach(
        tree,
        &LoraParameters::default(),
        num_layers,
        0,
        FineTuneType::Lora,
    )
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

/// A few compiled steps of the model's declared step `S` on one batch; returns the state.
#[allow(clippy::type_complexity)]
fn train<S: TrainingStep>(
    params: <S::Model as LanguageModel>::Params,
    config: &<S::Model as LanguageModel>::Config,
    steps: usize,
) -> Result<TrainState<<S::Model as LanguageModel>::Params, S::Optimizer>>
where
    <<S::Model as LanguageModel>::Params as Tree<Array>>::Of<
        Option<<S::Optimizer as Optimizer>::Leaf>,
    >: Clone,
{
    let optimizer = S::optimizer();
    let mut state = TrainState::new(params, &optimizer, 0)?;
    let cfg = config.clone();
    let mut step = TrainStep::new(
        &state,
        optimizer,
        move |p: &<S::Model as LanguageModel>::Params, b: &[Array], k: &Array| {
            S::loss(p, &cfg, b, Some(k))
        },
        S::options(),
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

/// Asserts that the safetensors files `ours` and `theirs` hold the same tensors by name, bit for
/// bit; returns the names.
fn same_tensors_by_name(ours: &Path, theirs: &Path) -> Result<Vec<String>> {
    let ours = Array::load_safetensors(ours).expect("saved adapters");
    let theirs = Array::load_safetensors(theirs).expect("the fixture's adapters");
    let mut names: Vec<String> = ours.keys().cloned().collect();
    names.sort();
    let mut expected: Vec<String> = theirs.keys().cloned().collect();
    expected.sort();
    assert_eq!(names, expected);
    for name in &names {
        assert!(ours[name].eq_values(&theirs[name])?, "{name}");
    }
    Ok(names)
}

/// The trained tree against the one training started from: every adapter's `lora_b` moved,
/// every leaf that is not an adapter is bit-identical.
fn assert_only_adapters_moved<P: Tree<Array>>(trained: &P, started: &P) -> Result<()> {
    let specs = tree::specs(trained);
    let (after, before) = (tree::flatten(trained), tree::flatten(started));
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

/// The compiled step's optimizer entries (`opt.<param>.<moment>`), each an adapter's.
fn optimizer_entries_of_adapters_only(declaration: Vec<String>) -> Vec<String> {
    let entries: Vec<String> = declaration
        .into_iter()
        .filter(|name| name.starts_with("opt."))
        .collect();
    assert!(!entries.is_empty());
    for name in &entries {
        let param = name.trim_start_matches("opt.").rsplit_once('.').unwrap().0;
        assert!(
            param.ends_with(".lora_a") || param.ends_with(".lora_b"),
            "{name}"
        );
    }
    entries
}

#[test]
fn attached_adapters_leave_the_outputs_exactly_unchanged() -> Result<()> {
    let (config, base) = tiny()?;
    let mut adapted = base.clone();
    let names = attach_default(&mut adapted, -1)?;
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
    let names = lora::attach(&mut adapted, &parameters, 1, 0, FineTuneType::Lora)?;
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
        FineTuneType::Lora,
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("configuration: LoRA key `self_attn.qkv` names no linear layer"),
        "{err}"
    );
    let err = attach_default(&mut unknown, 3).unwrap_err();
    assert_eq!(
        err.to_string(),
        "num_layers is 3, but the model has 2 blocks: at most 2, or -1 for all"
    );
    assert_eq!(
        tree::names(&unknown),
        tree::names(&base),
        "unchanged on error"
    );
    Ok(())
}

/// A second attach over adapted layers is refused as `AlreadyAdapted`, naming the first such
/// layer, for a linear layer and for stacked experts, and leaves the tree as it was.
#[test]
fn adapting_an_adapted_layer_is_refused_by_name() -> Result<()> {
    let (_, base) = tiny()?;
    let mut adapted = base.clone();
    attach_default(&mut adapted, 1)?;
    let before = tree::names(&adapted);
    let err = attach_default(&mut adapted, -1).unwrap_err();
    assert!(
        matches!(&err, Error::AlreadyAdapted { layer } if layer == "model.layers.1.self_attn.q_proj"),
        "{err:?}"
    );
    assert_eq!(tree::names(&adapted), before, "unchanged on error");
    let mixtral = Mixtral::preset("tiny").expect("mixtral has a tiny preset");
    let mut experts = Mixtral::init(&mixtral, 0)?;
    let parameters = LoraParameters {
        keys: Some(vec!["block_sparse_moe.switch_mlp.up_proj".into()]),
        ..LoraParameters::default()
    };
    lora::attach(&mut experts, &parameters, 1, 0, FineTuneType::Lora)?;
    let err = lora::attach(&mut experts, &parameters, 1, 0, FineTuneType::Lora).unwrap_err();
    assert!(
        matches!(&err, Error::AlreadyAdapted { layer }
            if layer == "model.layers.1.block_sparse_moe.switch_mlp.up_proj"),
        "{err:?}"
    );
    Ok(())
}

#[test]
fn only_adapters_train_and_the_base_stays_bit_identical() -> Result<()> {
    let (config, base) = tiny()?;
    let mut adapted = base.clone();
    attach_default(&mut adapted, 1)?;
    let before = adapted.clone();
    let state = train::<llama::Train>(adapted, &config, 3)?;
    // The compiled step's declared state: every parameter, optimizer moments for adapters only.
    let optimizer_entries = optimizer_entries_of_adapters_only(state.declaration());
    // AdamW: two moments for each of the 7 adapted layers' two matrices.
    assert_eq!(optimizer_entries.len(), 7 * 2 * 2);
    assert_only_adapters_moved(&state.params, &before)
}

#[test]
fn fused_weights_compute_what_base_and_adapters_did() -> Result<()> {
    let (config, mut adapted) = tiny()?;
    attach_default(&mut adapted, -1)?;
    let trained = train::<llama::Train>(adapted, &config, 3)?.params;
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
    lora::attach(&mut adapted, &parameters, 2, 0, FineTuneType::Lora)?;
    let trained = train::<llama::Train>(adapted, &config, 2)?.params;
    let dir = tempfile::tempdir().unwrap();
    let adapter_config = AdapterConfig {
        fine_tune_type: FineTuneType::Lora,
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
        FineTuneType::Lora,
    )?;
    let dir = tempfile::tempdir().unwrap();
    let adapter_config = AdapterConfig {
        fine_tune_type: FineTuneType::Lora,
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
    // mlx-lm's `full` fine-tuning writes a whole model, not adapters.
    let config_path = dir.path().join(lora::CONFIG_FILE);
    let text = std::fs::read_to_string(&config_path).unwrap();
    std::fs::write(&config_path, text.replace("\"lora\"", "\"full\"")).unwrap();
    let err = lora::load_adapters(&mut loaded, dir.path(), None).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{}: fine_tune_type is \"full\"; lmx loads `lora` and `dora` adapters",
            config_path.display()
        )
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
    same_tensors_by_name(
        &saved.join(lora::ADAPTERS_FILE),
        &dir.join("adapters").join(lora::ADAPTERS_FILE),
    )?;
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
    attach_default(&mut adapted, 1)?;
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
        fine_tune_type: FineTuneType::Lora,
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

/// The adapters of `params` (every leaf with the role) set to normal samples: a trained adapter,
/// whose `lora_b` is no longer zero.
fn perturb_adapters<P: Tree<Array>>(params: &mut P) {
    let specs = tree::specs(params);
    let mut roles = specs.iter();
    let mut seed = 100;
    params.for_each_mut(&mut |leaf| {
        if roles.next().unwrap().role == LeafRole::Adapter {
            seed += 1;
            let key = mlx_rs::random::key(seed).unwrap();
            let noise = mlx_rs::random::normal::<f32>(leaf.shape(), None, 0.05, &key).unwrap();
            *leaf = leaf.add(&noise).unwrap();
        }
    });
}

/// Adapter dropout by hand: `W = 1`, `A = 1`, `B = 1`, `x = 1..8`. In a training step the base
/// sees all of `x` and the adapter the inputs kept by the mask the step's key draws (each kept
/// one doubled at `p = 0.5`); evaluation, and dropout 0, compute the plain layer.
#[test]
fn adapter_dropout_masks_the_adapter_s_input_in_training_only() -> Result<()> {
    use lmx::runtime::nn::{self, LinearParams, LoraSettings};
    let x: Vec<f32> = (1..=8).map(|v| v as f32).collect();
    let input = Array::from_slice(&x, &[1, 1, 8]);
    let adapted = |dropout: f32| LinearParams {
        lora_a: Some(Array::ones::<f32>(&[8, 1]).unwrap()),
        lora_b: Some(Array::ones::<f32>(&[1, 1]).unwrap()),
        lora: Some(LoraSettings {
            scale: 3.0,
            dropout,
        }),
        ..LinearParams::new(Array::ones::<f32>(&[1, 8]).unwrap(), None)
    };
    let value = |a: Array| a.item_exact::<f32>();
    let key = mlx_rs::random::key(11)?;
    let trained = value(nn::linear_in(
        &adapted(0.5),
        &input,
        &mut Context::training(&key),
    )?);
    // The mask of the step's first draw: the same key's first dropout.
    let mask = nn::dropout(
        &Array::ones::<f32>(&[1, 1, 8])?,
        0.5,
        &mut Context::training(&key),
    )?;
    let kept: Vec<bool> = mask.as_slice::<f32>().iter().map(|&m| m != 0.0).collect();
    let kept_count = kept.iter().filter(|&&k| k).count();
    assert!(0 < kept_count && kept_count < 8, "a real mask: {kept:?}");
    let kept_sum: f32 = x
        .iter()
        .zip(&kept)
        .filter(|(_, &k)| k)
        .map(|(v, _)| v)
        .sum();
    assert_eq!(trained, 36.0 + 3.0 * 2.0 * kept_sum, "mask {kept:?}");
    let plain = 36.0 + 3.0 * 36.0;
    let evaluated = nn::linear_in(&adapted(0.5), &input, &mut Context::evaluation())?;
    assert_eq!(value(evaluated), plain);
    assert_eq!(value(nn::linear(&adapted(0.5), &input)?), plain);
    let undropped = nn::linear_in(&adapted(0.0), &input, &mut Context::training(&key))?;
    assert_eq!(value(undropped), plain);
    // A Rust model's `tensor::Context::linear` is the same layer.
    let rust_front = |ctx: &mut Context| {
        lmx::runtime::tensor::host::forward(&adapted(0.5), &input, ctx, |layer, x, ctx| {
            ctx.linear(layer, x)
        })
    };
    assert_eq!(value(rust_front(&mut Context::training(&key))?), trained);
    assert_eq!(value(rust_front(&mut Context::evaluation())?), plain);
    Ok(())
}

/// Through a whole model: with adapter dropout the training pass depends on the step's key
/// (the same key, the same logits), evaluation is deterministic and equals the same adapters
/// without dropout, and dropout 0 leaves a training pass as it was.
#[test]
fn adapter_dropout_in_a_model_follows_the_step_s_key() -> Result<()> {
    let (config, base) = tiny()?;
    let with_dropout = |dropout: f32| -> Result<Params> {
        let mut adapted = base.clone();
        let parameters = LoraParameters {
            dropout,
            ..LoraParameters::default()
        };
        lora::attach(&mut adapted, &parameters, 1, 0, FineTuneType::Lora)?;
        perturb_adapters(&mut adapted);
        Ok(adapted)
    };
    let (dropped, plain) = (with_dropout(0.25)?, with_dropout(0.0)?);
    let input = tokens(256, 4)?;
    let training = |params: &Params, seed: u64| -> Result<Array> {
        let key = mlx_rs::random::key(seed)?;
        Llama::forward(params, &config, &input, &mut Context::training(&key))
    };
    let evaluated = logits(&dropped, &config, &input)?;
    assert_eq!(
        max_difference(&evaluated, &logits(&dropped, &config, &input)?),
        0.0
    );
    assert_eq!(
        max_difference(&evaluated, &logits(&plain, &config, &input)?),
        0.0
    );
    assert!(max_difference(&training(&dropped, 1)?, &evaluated) > 0.0);
    assert_eq!(
        max_difference(&training(&dropped, 1)?, &training(&dropped, 1)?),
        0.0
    );
    assert!(max_difference(&training(&dropped, 1)?, &training(&dropped, 2)?) > 0.0);
    // llama's own dropout is 0 at `tiny`: without adapter dropout training is evaluation.
    assert_eq!(max_difference(&training(&plain, 1)?, &evaluated), 0.0);
    Ok(())
}

#[test]
fn dora_starts_as_the_base_trains_its_magnitudes_and_fuses() -> Result<()> {
    let (config, base) = tiny()?;
    let mut adapted = base.clone();
    let names = lora::attach(
        &mut adapted,
        &LoraParameters::default(),
        1,
        0,
        FineTuneType::Dora,
    )?;
    assert_eq!(names.len(), 7);
    let input = tokens(256, 3)?;
    let base_logits = logits(&base, &config, &input)?;
    assert_eq!(
        max_difference(&base_logits, &logits(&adapted, &config, &input)?),
        0.0
    );
    let state = train::<llama::Train>(adapted, &config, 3)?;
    // AdamW's two moments for each adapted layer's `lora_a`, `lora_b` and `m`.
    let moments: Vec<String> = state
        .declaration()
        .into_iter()
        .filter(|name| name.starts_with("opt."))
        .collect();
    assert_eq!(moments.len(), 7 * 3 * 2, "{moments:?}");
    assert!(
        moments.iter().any(|name| name.ends_with(".m.0")),
        "{moments:?}"
    );
    let trained = state.params;
    let mut fused = trained.clone();
    assert_eq!(lora::fuse(&mut fused)?, 7);
    assert_eq!(tree::names(&fused), tree::names(&base));
    let adapted_logits = logits(&trained, &config, &input)?;
    assert!(max_difference(&adapted_logits, &base_logits) > 0.0);
    let error = max_difference(&adapted_logits, &logits(&fused, &config, &input)?);
    assert!(error < 1e-5, "max difference {error:e}");
    Ok(())
}

/// `tests/fixtures/lora/dora/`: adapters written by mlx-lm's `DoRALinear` onto the LoRA
/// fixture's model, with mlx-lm's logits before and after fusing (`make.py dora`).
#[test]
fn dora_adapters_written_by_mlx_lm_give_mlx_lm_s_logits() -> Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lora");
    let config = Llama::preset("tiny").expect("tiny");
    let template = Llama::init(&config, 0)?;
    let mut params =
        lmx::runtime::checkpoint::load_tree(&dir.join("model.safetensors"), &template)?;
    let adapters = dir.join("dora/adapters");
    let read = lora::load_adapters(&mut params, &adapters, Some(Family::Llama))?;
    assert_eq!(read.fine_tune_type, FineTuneType::Dora);
    let reference =
        Array::load_safetensors(dir.join("dora/logits.safetensors")).expect("the fixture's logits");
    let input = reference["tokens"].clone();
    let error = max_difference(&logits(&params, &config, &input)?, &reference["logits"]);
    assert!(error < 1e-4, "max difference {error:e}");
    // Saved again, they are mlx-lm's tensors by name, bit for bit, and its configuration.
    let saved = tempfile::tempdir().unwrap();
    lora::save_adapters(saved.path(), &params, &read, Some(Family::Llama))?;
    let names = same_tensors_by_name(
        &saved.path().join(lora::ADAPTERS_FILE),
        &adapters.join(lora::ADAPTERS_FILE),
    )?;
    assert!(names.iter().any(|name| name.ends_with(".m")));
    assert_eq!(lora::read_config(saved.path())?, read);
    let mut fused = params.clone();
    lora::fuse(&mut fused)?;
    let error = max_difference(
        &logits(&fused, &config, &input)?,
        &reference["fused_logits"],
    );
    assert!(error < 1e-4, "fused: max difference {error:e}");
    Ok(())
}

type MixtralParams = <Mixtral as LanguageModel>::Params;

/// `tests/fixtures/lora/mixtral/`: a tiny Mixtral adapted by mlx-lm with its default keys, which
/// take the stacked experts (`LoRASwitchLinear`: one adapter per expert, `lora_a [experts,
/// rank, in]`) beside the attention and the router. lmx chooses the same layers, reads the
/// adapters onto its own tree and gives mlx-lm's logits, writes them back bit for bit, and
/// fuses them as `LoRASwitchLinear.fuse` does.
#[test]
fn expert_adapters_written_by_mlx_lm_give_mlx_lm_s_logits() -> Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lora/mixtral");
    let config = Mixtral::preset("tiny").expect("mixtral has a tiny preset");
    let template = Mixtral::init(&config, 0)?;
    let mut params =
        lmx::runtime::checkpoint::load_tree(&dir.join("model.safetensors"), &template)?;
    let adapters = dir.join("adapters");
    let read = lora::load_adapters(&mut params, &adapters, Some(Family::Mixtral))?;
    let reference =
        Array::load_safetensors(dir.join("logits.safetensors")).expect("the fixture's logits");
    let input = reference["tokens"].clone();
    let forward =
        |p: &MixtralParams| Mixtral::forward(p, &config, &input, &mut Context::evaluation());
    let error = max_difference(&forward(&params)?, &reference["logits"]);
    assert!(error < 1e-4, "max difference {error:e}");
    // The experts' adapters count: without them the logits are not mlx-lm's.
    let mut partial = params.clone();
    partial.for_each_layer_mut(&Scope::root(), &mut |_, layer| {
        if let LayerMut::SwitchLinear(switch) = layer {
            switch.lora_a = None;
            switch.lora_b = None;
            switch.lora = None;
        }
    });
    let error = max_difference(&forward(&partial)?, &reference["logits"]);
    assert!(
        error > 1e-3,
        "the experts' adapters changed nothing ({error:e})"
    );
    // Saved again, they are mlx-lm's tensors by name, bit for bit.
    let saved = tempfile::tempdir().unwrap();
    lora::save_adapters(saved.path(), &params, &read, Some(Family::Mixtral))?;
    let names = same_tensors_by_name(
        &saved.path().join(lora::ADAPTERS_FILE),
        &adapters.join(lora::ADAPTERS_FILE),
    )?;
    assert!(names.iter().any(|name| name.contains(".switch_mlp.")));
    let mut fused = params.clone();
    assert_eq!(
        lora::fuse(&mut fused)?,
        8,
        "four attention projections, the router and three expert stacks"
    );
    let error = max_difference(&forward(&fused)?, &reference["fused_logits"]);
    assert!(error < 1e-4, "fused: max difference {error:e}");
    Ok(())
}

/// Adapter dropout on stacked experts alone (mlx-lm's `LoRASwitchLinear`): a training pass
/// depends on the step's key (the same key, the same logits), evaluation is deterministic and
/// equals the same adapters without dropout, and the `.lmx` model's own dropout (0 at `tiny`)
/// leaves a training pass without adapter dropout equal to evaluation.
#[test]
fn expert_adapter_dropout_follows_the_step_s_key() -> Result<()> {
    let config = Mixtral::preset("tiny").expect("mixtral has a tiny preset");
    let base = Mixtral::init(&config, 0)?;
    let with_dropout = |dropout: f32| -> Result<<Mixtral as LanguageModel>::Params> {
        let mut adapted = base.clone();
        let parameters = LoraParameters {
            dropout,
            keys: Some(
                ["gate_proj", "up_proj", "down_proj"]
                    .map(|p| format!("block_sparse_moe.switch_mlp.{p}"))
                    .to_vec(),
            ),
            ..LoraParameters::default()
        };
        let names = lora::attach(&mut adapted, &parameters, 1, 0, FineTuneType::Lora)?;
        assert_eq!(names.len(), 3, "{names:?}");
        perturb_adapters(&mut adapted);
        Ok(adapted)
    };
    let (dropped, plain) = (with_dropout(0.25)?, with_dropout(0.0)?);
    let input = tokens(256, 4)?;
    let evaluate = |params: &<Mixtral as LanguageModel>::Params| {
        Mixtral::forward(params, &config, &input, &mut Context::evaluation())
    };
    let training = |params: &<Mixtral as LanguageModel>::Params, seed: u64| -> Result<Array> {
        let key = mlx_rs::random::key(seed)?;
        Mixtral::forward(params, &config, &input, &mut Context::training(&key))
    };
    let evaluated = evaluate(&dropped)?;
    assert_eq!(max_difference(&evaluated, &evaluate(&dropped)?), 0.0);
    assert_eq!(max_difference(&evaluated, &evaluate(&plain)?), 0.0);
    assert!(max_difference(&training(&dropped, 1)?, &evaluated) > 1e-4);
    assert_eq!(
        max_difference(&training(&dropped, 1)?, &training(&dropped, 1)?),
        0.0
    );
    assert!(max_difference(&training(&dropped, 1)?, &training(&dropped, 2)?) > 1e-4);
    assert_eq!(max_difference(&training(&plain, 1)?, &evaluated), 0.0);
    Ok(())
}

/// A Rust model's stacked experts (`tensor::Context::experts`) are the `.lmx` layer's: with
/// adapters whose dropout is 0.5, a training step's pass equals `nn::experts_in` under the same
/// key and differs from evaluation, which equals `nn::experts` and `tensor::nn::experts`.
#[test]
fn a_rust_model_s_experts_are_the_lmx_layer() -> Result<()> {
    use lmx::runtime::nn::{self, LoraSettings};
    use lmx::runtime::tensor::host;
    let mut keys = nn::init::Keys::from_seed(5)?;
    let mut layer = nn::init::experts(8, 16, 4, &mut keys)?;
    for (index, projection) in [
        &mut layer.gate_proj,
        &mut layer.up_proj,
        &mut layer.down_proj,
    ]
    .into_iter()
    .enumerate()
    {
        let shape = projection.weight.shape().to_vec();
        let (experts, out, input) = (shape[0], shape[1], shape[2]);
        let key = |k: u64| mlx_rs::random::key(20 + 2 * index as u64 + k).unwrap();
        projection.lora_a = Some(mlx_rs::random::normal::<f32>(
            &[experts, 2, input],
            None,
            0.3,
            &key(0),
        )?);
        projection.lora_b = Some(mlx_rs::random::normal::<f32>(
            &[experts, out, 2],
            None,
            0.3,
            &key(1),
        )?);
        projection.lora = Some(LoraSettings {
            scale: 2.0,
            dropout: 0.5,
        });
    }
    let x = mlx_rs::random::normal::<f32>(&[2, 3, 8], None, None, &mlx_rs::random::key(3)?)?;
    let indices = Array::from_slice(&[0i32, 1, 2, 3, 1, 2, 3, 0, 0, 2, 1, 3], &[2, 3, 2]);
    let key = mlx_rs::random::key(9)?;
    let rust_front = |key: Option<&Array>| {
        host::loss(
            "experts",
            &layer,
            &[x.clone(), indices.clone()],
            key,
            |p, [x, i], ctx| ctx.experts(p, &x, &i),
        )
    };
    let trained = nn::experts_in(&layer, &x, &indices, &mut Context::training(&key))?;
    let evaluated = nn::experts(&layer, &x, &indices)?;
    assert_eq!(max_difference(&rust_front(Some(&key))?, &trained), 0.0);
    assert!(max_difference(&trained, &evaluated) > 1e-3);
    assert_eq!(max_difference(&rust_front(None)?, &evaluated), 0.0);
    let plain = host::loss(
        "experts",
        &layer,
        &[x.clone(), indices.clone()],
        None,
        |p, [x, i], _| lmx::runtime::tensor::nn::experts(p, &x, &i),
    )?;
    assert_eq!(max_difference(&plain, &evaluated), 0.0);
    Ok(())
}

/// Training a Mixtral with adapters on its experts: the compiled step holds optimizer moments
/// for the adapters only, every expert adapter's up-projection moves, and the base (the stacked
/// expert weights included) stays bit-identical. DoRA on stacked experts is refused by name, the
/// tree unchanged.
#[test]
fn expert_adapters_train_alone_and_refuse_what_they_cannot_do() -> Result<()> {
    let config = Mixtral::preset("tiny").expect("mixtral has a tiny preset");
    let base = Mixtral::init(&config, 0)?;
    let mut tree = base.clone();
    let err = lora::attach(
        &mut tree,
        &LoraParameters::default(),
        1,
        0,
        FineTuneType::Dora,
    )
    .unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("names the stacked experts `model.layers.1.block_sparse_moe.switch_mlp.")
            && message.contains("which DoRA does not adapt"),
        "{message}"
    );
    assert!(tree::specs(&tree)
        .iter()
        .all(|spec| spec.role != LeafRole::Adapter));
    let mut adapted = base.clone();
    let attached = attach_default(&mut adapted, 1)?;
    assert!(attached.contains(&"model.layers.1.block_sparse_moe.switch_mlp.down_proj".to_owned()));
    let input = tokens(256, 3)?;
    let before = Mixtral::forward(&base, &config, &input, &mut Context::evaluation())?;
    let after = Mixtral::forward(&adapted, &config, &input, &mut Context::evaluation())?;
    assert!(
        before.eq_values(&after)?,
        "fresh adapters changed the outputs"
    );
    let state = train::<mixtral::Train>(adapted.clone(), &config, 3)?;
    // Moments for the last block's 8 adapted layers' two matrices: four attention projections,
    // the router and three expert stacks.
    assert_eq!(
        optimizer_entries_of_adapters_only(state.declaration()).len(),
        8 * 2 * 2
    );
    assert_only_adapters_moved(&state.params, &adapted)
}

/// A choice that adapts no layer (here the last 0 blocks) is refused, naming the model's linear
/// layers, rather than leaving a tree without adapters, whose whole model `lmx lora` would then
/// train; the tree is unchanged.
#[test]
fn a_choice_of_no_layer_is_refused_naming_the_linear_layers() -> Result<()> {
    let (_, params) = tiny()?;
    let mut tree = params.clone();
    let err = lora::attach(
        &mut tree,
        &LoraParameters::default(),
        0,
        0,
        FineTuneType::Lora,
    )
    .unwrap_err();
    let message = err.to_string();
    assert!(
        message.starts_with("no layer takes an adapter")
            && message.ends_with(
                "model.layers.0.self_attn.q_proj, model.layers.0.self_attn.k_proj, \
                 model.layers.0.self_attn.v_proj, model.layers.0.self_attn.o_proj, \
                 model.layers.0.mlp.gate_proj, model.layers.0.mlp.up_proj, \
                 model.layers.0.mlp.down_proj, model.layers.1.self_attn.q_proj, \
                 model.layers.1.self_attn.k_proj, model.layers.1.self_attn.v_proj, \
                 model.layers.1.self_attn.o_proj, model.layers.1.mlp.gate_proj, \
                 model.layers.1.mlp.up_proj, model.layers.1.mlp.down_proj, lm_head"
            ),
        "{message}"
    );
    assert!(matches!(err, Error::NothingToAdapt { .. }));
    assert!(tree::specs(&tree)
        .iter()
        .all(|spec| spec.role != LeafRole::Adapter));

    Ok(())
}
