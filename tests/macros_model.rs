//! `#[lmx::model]`: trees, names, masks, counts, flat maps and safetensors files.

// Shared with other tests, which use parts this one does not.
#[allow(dead_code)]
use crate::support::llama;

use llama::{Llama, LlamaConfig};
use lmx::runtime::model::LanguageModel;
use lmx::runtime::nn::{init, EmbeddingParams, LinearParams, RmsNormParams};
use lmx::runtime::tree::{self, LeafRole, Tree};
use lmx::runtime::{Array, Error};
use std::collections::HashMap;

/// A block with every kind of field.
#[lmx::model]
pub struct Block {
    proj: LinearParams,
    #[lmx(frozen)]
    norm: RmsNormParams,
    #[lmx(role = norm, no_decay)]
    scale: Array,
    gate: Option<Array>,
    experts: Vec<LinearParams>,
    adapter: Option<LinearParams>,
}

/// A tiny language model whose output head is the embedding table.
#[lmx::model]
pub struct Tied {
    embed: EmbeddingParams,
    blocks: Vec<Block>,
    /// The output head: the embedding table, transposed.
    #[lmx(tied = "embed")]
    head: EmbeddingParams,
}

fn block(gate: bool, adapter: bool) -> Block<f32> {
    Block {
        proj: LinearParams::new(1.0, Some(2.0)),
        norm: RmsNormParams { weight: 3.0 },
        scale: 4.0,
        gate: gate.then_some(5.0),
        experts: vec![LinearParams::new(6.0, None), LinearParams::new(7.0, None)],
        adapter: adapter.then_some(LinearParams::new(8.0, None)),
    }
}

#[test]
fn traversal_is_declaration_order_depth_first() {
    let full = block(true, true);
    assert_eq!(
        tree::flatten(&full),
        vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    );
    assert_eq!(
        full.names(),
        [
            "proj.weight",
            "proj.bias",
            "norm.weight",
            "scale",
            "gate",
            "experts.0.weight",
            "experts.1.weight",
            "adapter.weight"
        ]
    );
    let sparse = block(false, false);
    assert_eq!(
        sparse.names(),
        [
            "proj.weight",
            "proj.bias",
            "norm.weight",
            "scale",
            "experts.0.weight",
            "experts.1.weight"
        ]
    );
    assert_eq!(sparse.leaf_count(), 6);
}

#[test]
fn the_same_struct_holds_other_leaves() {
    let params = block(true, false);
    let moments: Block<(f32, f32)> = params.map(&mut |p| (p * 10.0, 0.0));
    assert_eq!(moments.experts[1].weight, (70.0, 0.0));
    assert_eq!(moments.gate, Some((50.0, 0.0)));
    let rebuilt: Block<i32> = tree::rebuild(&params, 0..7).unwrap();
    assert_eq!(rebuilt.scale, 3);
    assert!(tree::rebuild(&params, 0..6).is_err());
}

#[test]
fn attributes_set_roles_and_masks() {
    let specs = block(true, true).specs();
    let find = |name: &str| specs.iter().find(|spec| spec.name == name).unwrap().clone();
    assert!(!find("norm.weight").trainable);
    assert!(find("proj.weight").trainable && find("proj.weight").decay);
    assert!(!find("proj.bias").decay);
    assert_eq!(find("scale").role, LeafRole::Norm);
    assert!(!find("scale").decay);
    assert_eq!(find("gate").role, LeafRole::Other);
    assert!(find("gate").decay);

    let trainable = block(true, true).trainable_mask();
    assert!(trainable.proj.weight && !trainable.norm.weight && trainable.experts[0].weight);
    let frozen = block(true, true).frozen_mask();
    assert_eq!(
        tree::flatten(&frozen),
        [false, false, true, false, false, false, false, false]
    );
}

#[test]
fn a_tied_field_is_no_leaf_of_its_own() {
    let keys = &mut init::Keys::from_seed(0).unwrap();
    let model = Tied {
        embed: init::embedding(16, 4, keys).unwrap(),
        blocks: Vec::new(),
    };
    assert_eq!(model.names(), ["embed.weight"]);
    assert!(std::ptr::eq(model.head(), &model.embed));
    assert_eq!(model.parameter_count(), 64);
}

#[test]
fn llama_parameters_have_hugging_face_names() {
    let config = LlamaConfig::tiny();
    let params = Llama::init(&config, 0).unwrap();
    let names = params.names();
    let layer = |i: usize| {
        [
            "input_layernorm",
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "post_attention_layernorm",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        ]
        .iter()
        .map(move |part| format!("model.layers.{i}.{part}.weight"))
    };
    let expected: Vec<String> = std::iter::once("model.embed_tokens.weight".to_owned())
        .chain(layer(0))
        .chain(layer(1))
        .chain(["model.norm.weight".to_owned(), "lm_head.weight".to_owned()])
        .collect();
    assert_eq!(names, expected);
    // 64*32 embeddings, per layer 4 attention maps (32*32, 16*32, 16*32, 32*32), 3 MLP maps of
    // 32*64, 2 norms of 32; a final norm of 32 and a 32*64 head.
    let per_layer = 32 * 32 * 2 + 16 * 32 * 2 + 3 * 32 * 64 + 2 * 32;
    assert_eq!(
        params.parameter_count(),
        64 * 32 + 2 * per_layer + 32 + 32 * 64
    );
    assert_eq!(params.trainable_parameter_count(), params.parameter_count());
    assert_eq!(
        params.model.layers[1].self_attn.k_proj.weight.shape(),
        &[16, 32]
    );
}

fn small() -> Llama {
    Llama::init(
        &LlamaConfig {
            layers: 1,
            ..LlamaConfig::tiny()
        },
        7,
    )
    .unwrap()
}

fn assert_same(a: &Llama, b: &Llama) {
    for (x, y) in tree::flatten(a).iter().zip(tree::flatten(b)) {
        assert!(x.eq_values(&y).unwrap());
    }
}

#[test]
fn safetensors_round_trip_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("llama.safetensors");
    let saved = small();
    saved.save_safetensors(&path).unwrap();
    let mut loaded = Llama::init(
        &LlamaConfig {
            layers: 1,
            ..LlamaConfig::tiny()
        },
        8,
    )
    .unwrap();
    loaded.load_safetensors(&path).unwrap();
    assert_same(&loaded, &saved);
}

#[test]
fn loading_checks_every_tensor_and_names_it() {
    let params = small();
    let mut target = small();
    let check = |tensors: HashMap<String, Array>, target: &mut Llama| match target
        .update_from_flat_map(tensors)
    {
        Err(Error::Layout(message)) => message,
        other => panic!("expected a layout error, got {other:?}"),
    };

    let mut missing = params.to_flat_map();
    missing.remove("model.layers.0.mlp.up_proj.weight");
    assert_eq!(
        check(missing, &mut target),
        "tensor `model.layers.0.mlp.up_proj.weight` is missing"
    );

    let mut reshaped = params.to_flat_map();
    reshaped.insert(
        "lm_head.weight".into(),
        Array::zeros::<f32>(&[32, 64]).unwrap(),
    );
    assert_eq!(
        check(reshaped, &mut target),
        "tensor `lm_head.weight` has shape [32, 64], expected [64, 32]"
    );

    let mut retyped = params.to_flat_map();
    retyped.insert(
        "model.norm.weight".into(),
        Array::zeros::<i32>(&[32]).unwrap(),
    );
    assert_eq!(
        check(retyped, &mut target),
        "tensor `model.norm.weight` has dtype Int32, expected Float32"
    );

    let mut extra = params.to_flat_map();
    extra.insert(
        "model.rotary_emb.inv_freq".into(),
        Array::zeros::<f32>(&[4]).unwrap(),
    );
    assert_eq!(
        check(extra, &mut target),
        "unexpected tensors: model.rotary_emb.inv_freq"
    );

    // Nothing changed on error: `target` still holds its own weights; a clean map replaces them.
    let other = Llama::init(
        &LlamaConfig {
            layers: 1,
            ..LlamaConfig::tiny()
        },
        9,
    )
    .unwrap();
    target.update_from_flat_map(other.to_flat_map()).unwrap();
    assert_same(&target, &other);
}

#[test]
fn a_file_error_names_the_file_and_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("one_layer.safetensors");
    small().save_safetensors(&path).unwrap();
    let mut two_layers = Llama::init(&LlamaConfig::tiny(), 0).unwrap();
    match two_layers.load_safetensors(&path) {
        Err(Error::Checkpoint { path: at, message }) => {
            assert_eq!(at, path);
            assert_eq!(
                message,
                "missing tensor `model.layers.1.input_layernorm.weight`"
            );
        }
        other => panic!("expected a checkpoint error, got {other:?}"),
    }
}

/// A tree written by hand, generic over its leaf, with the derive every tree impl comes from.
#[derive(Clone, Debug, PartialEq, lmx::Tree)]
pub struct Adapter<T = Array> {
    #[lmx(role = weight, frozen)]
    down: T,
    #[lmx(role = bias, rename = "b")]
    bias: Option<T>,
    #[lmx(no_decay)]
    inner: LinearParams<T>,
}

#[test]
fn the_tree_derive_reads_roles_masks_and_names() {
    let adapter = Adapter {
        down: 1.0f32,
        bias: Some(2.0),
        inner: LinearParams::new(3.0, None),
    };
    assert_eq!(tree::flatten(&adapter), [1.0, 2.0, 3.0]);
    let specs = tree::specs(&adapter);
    let summary: Vec<(&str, LeafRole, bool, bool)> = specs
        .iter()
        .map(|s| (s.name.as_str(), s.role, s.trainable, s.decay))
        .collect();
    assert_eq!(
        summary,
        [
            ("down", LeafRole::Weight, false, true),
            ("b", LeafRole::Bias, true, false),
            ("inner.weight", LeafRole::Weight, true, false),
        ]
    );
    let doubled: Adapter<f32> = adapter.map(&mut |x| x * 2.0);
    assert_eq!(doubled.bias, Some(4.0));
    assert_eq!(adapter.map_same(&mut |x| x + 1.0).inner.weight, 4.0);
}
