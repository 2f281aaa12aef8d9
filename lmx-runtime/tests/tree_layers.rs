//! `Tree::for_each_layer[_mut]` reaches every linear layer, embedding and stacked expert
//! projection of a model, by name, and `tree::specs` freezes what adapters and quantization
//! require.

use lmx_runtime::nn::{
    EmbeddingParams, LinearParams, LoraSettings, Quantization, RmsNormParams, SwitchGluParams,
    SwitchLinearParams,
};
use lmx_runtime::tree::{specs, Layer, LayerMut, LeafRole, Scope, Tree};

#[derive(Clone, Debug, PartialEq, lmx_macros::Tree)]
#[lmx(runtime = "lmx_runtime")]
struct Block<T = f32> {
    q_proj: LinearParams<T>,
    norm: RmsNormParams<T>,
}

#[derive(Clone, Debug, PartialEq, lmx_macros::Tree)]
#[lmx(runtime = "lmx_runtime")]
struct Model<T = f32> {
    embed: EmbeddingParams<T>,
    layers: Vec<Block<T>>,
    head: Option<LinearParams<T>>,
}

fn model() -> Model<f32> {
    let block = |w| Block {
        q_proj: LinearParams::new(w, None),
        norm: RmsNormParams { weight: 1.0 },
    };
    Model {
        embed: EmbeddingParams::new(0.5),
        layers: vec![block(2.0), block(3.0)],
        head: Some(LinearParams::new(4.0, Some(5.0))),
    }
}

#[test]
fn every_layer_is_visited_with_its_name() {
    let model = model();
    let mut seen = Vec::new();
    model.for_each_layer(&Scope::root(), &mut |scope, layer| {
        let kind = match layer {
            Layer::Linear(linear) => format!("linear {}", linear.weight),
            Layer::Embedding(embedding) => format!("embedding {}", embedding.weight),
            Layer::SwitchLinear(experts) => format!("experts {}", experts.weight),
        };
        seen.push(format!("{} {kind}", scope.name()));
    });
    assert_eq!(
        seen,
        [
            "embed embedding 0.5",
            "layers.0.q_proj linear 2",
            "layers.1.q_proj linear 3",
            "head linear 4",
        ]
    );
}

#[test]
fn an_adapter_freezes_everything_else_and_its_settings_survive_map() {
    let mut model = model();
    model.for_each_layer_mut(&Scope::root(), &mut |scope, layer| {
        if let LayerMut::Linear(linear) = layer {
            if scope.name().ends_with("q_proj") {
                linear.lora_a = Some(10.0);
                linear.lora_b = Some(0.0);
                linear.lora = Some(LoraSettings {
                    scale: 2.0,
                    dropout: 0.0,
                });
            }
        }
    });
    let trainable: Vec<(String, LeafRole)> = specs(&model)
        .into_iter()
        .filter(|spec| spec.trainable)
        .map(|spec| (spec.name, spec.role))
        .collect();
    assert_eq!(
        trainable,
        [
            ("layers.0.q_proj.lora_a".to_owned(), LeafRole::Adapter),
            ("layers.0.q_proj.lora_b".to_owned(), LeafRole::Adapter),
            ("layers.1.q_proj.lora_a".to_owned(), LeafRole::Adapter),
            ("layers.1.q_proj.lora_b".to_owned(), LeafRole::Adapter),
        ]
    );
    let doubled = model.map(&mut |x| x * 2.0);
    assert_eq!(doubled.layers[1].q_proj.lora_a, Some(20.0));
    assert_eq!(doubled.layers[1].q_proj.lora, model.layers[1].q_proj.lora);
    assert_eq!(specs(&model).len(), 1 + 2 * (3 + 1) + 2);
}

#[test]
fn quantization_parameters_never_train() {
    let mut model = model();
    model.embed.scales = Some(1.0);
    model.embed.biases = Some(0.0);
    let frozen: Vec<String> = specs(&model)
        .into_iter()
        .filter(|spec| !spec.trainable)
        .map(|spec| spec.name)
        .collect();
    assert_eq!(frozen, ["embed.scales", "embed.biases"]);
}

#[derive(Clone, Debug, PartialEq, lmx_macros::Tree)]
#[lmx(runtime = "lmx_runtime")]
struct Moe<T = f32> {
    gate: LinearParams<T>,
    switch_mlp: SwitchGluParams<T>,
}

/// The stacked experts of an `experts` layer are three layers of their own; quantized, one
/// freezes its packed weight with its scales and biases, as a quantized linear layer does.
#[test]
fn stacked_experts_are_layers_and_freeze_when_quantized() {
    let mut moe = Moe {
        gate: LinearParams::new(1.0, None),
        switch_mlp: SwitchGluParams {
            gate_proj: SwitchLinearParams::new(2.0),
            up_proj: SwitchLinearParams::new(3.0),
            down_proj: SwitchLinearParams::new(4.0),
        },
    };
    let mut seen = Vec::new();
    moe.for_each_layer_mut(&Scope::root(), &mut |scope, layer| {
        if let LayerMut::SwitchLinear(experts) = layer {
            seen.push(scope.name().to_owned());
            if scope.name().ends_with("up_proj") {
                experts.scales = Some(0.5);
                experts.biases = Some(0.0);
                experts.quantization = Some(Quantization {
                    group_size: 64,
                    bits: 4,
                });
            }
        }
    });
    assert_eq!(
        seen,
        [
            "switch_mlp.gate_proj",
            "switch_mlp.up_proj",
            "switch_mlp.down_proj"
        ]
    );
    let frozen: Vec<String> = specs(&moe)
        .into_iter()
        .filter(|spec| !spec.trainable)
        .map(|spec| spec.name)
        .collect();
    assert_eq!(
        frozen,
        [
            "switch_mlp.up_proj.weight",
            "switch_mlp.up_proj.scales",
            "switch_mlp.up_proj.biases"
        ]
    );
    assert_eq!(
        moe.map(&mut |x| x * 2.0).switch_mlp.up_proj.quantization,
        moe.switch_mlp.up_proj.quantization
    );
}
